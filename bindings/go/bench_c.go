// bench_c.go - the C side of BenchmarkPrefixVsC: the same prefix loop run
// entirely in C (one crossing for the whole loop), so the Go binding's
// per-block cost is a ratio measured in the same process and the same
// moment, not against a separate, differently-disturbed run.
package kvx

/*
#include "shim.h"
*/
import "C"

import "time"

// benchPrefixC times len(toks) prefix lookups (each of equal length, up to
// nblk blocks) and their releases, done in C.
func benchPrefixC(s *Store, toks [][]uint32, nblk int) time.Duration {
	ntok := len(toks[0])
	flat := make([]uint32, 0, len(toks)*ntok)
	for _, t := range toks {
		flat = append(flat, t...)
	}
	views := make([]C.kvx_view, nblk)
	cs, err := s.acquire()
	if err != nil {
		return 0
	}
	defer s.mu.RUnlock()
	sec := C.gokvx_bench_prefix_c(cs, (*C.uint32_t)(&flat[0]), C.size_t(len(toks)), C.size_t(ntok),
		C.size_t(nblk), &views[0])
	return time.Duration(float64(sec) * 1e9)
}
