// bench_test.go - prefix lookup per block and page fetch per page, the
// same work as bench/bench_prefix_c.c does in C. Set KVX_BENCH_STORE to
// the directory bench_prefix_c created to time the very same store:
//
//	build-go/bench/bench_prefix_c /tmp/kvxbench-store
//	KVX_BENCH_STORE=/tmp/kvxbench-store go test -run - -bench . -benchtime 2s
package kvx

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

const (
	benchSeqs   = 256
	benchBlocks = 64
)

var (
	benchOnce  sync.Once
	benchStore *Store
	benchToks  [][]uint32
	benchErr   error
)

func openBenchStore(b *testing.B) (*Store, [][]uint32) {
	benchOnce.Do(func() {
		for q := 0; q < benchSeqs; q++ {
			benchToks = append(benchToks, seqTokens(q, benchBlocks*16+5))
		}
		dir := os.Getenv("KVX_BENCH_STORE")
		if dir == "" {
			tmp, err := os.MkdirTemp("", "kvx-gobench-")
			if err != nil {
				benchErr = err
				return
			}
			dir = tmp + "/store"
			s, err := Create(dir, StoreOptions{Geometry: testGeom, NoSync: true})
			if err != nil {
				benchErr = err
				return
			}
			pages := make([]byte, benchBlocks*1024)
			for _, t := range benchToks {
				if _, benchErr = s.Put(t, pages, nil); benchErr != nil {
					return
				}
			}
			if benchErr = s.Flush(); benchErr != nil {
				return
			}
			s.Close()
		}
		benchStore, benchErr = Open(dir, &OpenOptions{ReadOnly: true, Expect: &testGeom})
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchStore, benchToks
}

// One op: the prefix of a 64-block prompt (one crossing) and its Release
// (one crossing). ns/block is the figure compared with C.
func BenchmarkPrefix64(b *testing.B) {
	s, toks := openBenchStore(b)
	for _, t := range toks { // warm: map every shard
		v, err := s.Prefix(t)
		if err != nil || v.Len() != benchBlocks {
			b.Fatalf("prefix: %d %v", v.Len(), err)
		}
		v.Release()
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		v, _ := s.Prefix(toks[i%benchSeqs])
		v.Release()
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*benchBlocks), "ns/block")
}

// The same from several goroutines at once (GOMAXPROCS of them).
func BenchmarkPrefix64Parallel(b *testing.B) {
	s, toks := openBenchStore(b)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			v, _ := s.Prefix(toks[i%benchSeqs])
			v.Release()
			i++
		}
	})
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*benchBlocks), "ns/block")
}

// One op: a batch of a prompt's 64 pages fetched into pinned memory
// (submit + wait crossings) and released, as bench_prefix_c does.
func BenchmarkFetch64(b *testing.B) {
	for _, m := range []IOMode{IOAuto, IOPread} {
		b.Run(m.String(), func(b *testing.B) {
			s, toks := openBenchStore(b)
			o := DefaultPoolOptions()
			o.Bytes, o.NoMlock, o.NoCUDA = 4<<20, true, true
			p, err := NewPool(&o)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			f, err := p.NewFetcher(&FetchOptions{IOMode: m, Buffered: true})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			held := make([][]View, benchSeqs)
			for q, t := range toks {
				v, err := s.Prefix(t)
				if err != nil {
					b.Fatal(err)
				}
				defer v.Release()
				for i := 0; i < v.Len(); i++ {
					held[q] = append(held[q], v.At(i))
				}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				r, err := f.Fetch(ctx, held[i%benchSeqs])
				if err != nil || r.Err(0) != nil {
					b.Fatal(err)
				}
				r.Release()
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*benchBlocks), "ns/page")
		})
	}
}

// The comparison the binding is held to: Go's per-block prefix cost over
// C's, for 64-block prompts, measured interleaved (one pass over the 256
// prompts in C, one in Go, repeated; best pass of each).
func BenchmarkPrefixVsC(b *testing.B) {
	s, toks := openBenchStore(b)
	bestC, bestGo := time.Duration(1<<62), time.Duration(1<<62)
	for i := 0; i < b.N; i++ {
		if c := benchPrefixC(s, toks, benchBlocks); c < bestC {
			bestC = c
		}
		t0 := time.Now()
		for _, t := range toks {
			v, _ := s.Prefix(t)
			v.Release()
		}
		if g := time.Since(t0); g < bestGo {
			bestGo = g
		}
	}
	per := float64(benchSeqs * benchBlocks)
	b.ReportMetric(float64(bestC.Nanoseconds())/per, "C-ns/block")
	b.ReportMetric(float64(bestGo.Nanoseconds())/per, "Go-ns/block")
	b.ReportMetric(float64(bestGo)/float64(bestC), "Go/C")
}
