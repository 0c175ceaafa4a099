// helpers_test.go - small stores for the tests: a tiny geometry, token
// sequences and pages derived from them, so every byte served can be
// checked against what was put.
package kvx

import (
	"encoding/binary"
	"os"
	"testing"
)

// 1 layer, 2 heads, D 8, B 16, fp16: 1024-byte pages.
var testGeom = Geometry{Layers: 1, KVHeads: 2, HeadDim: 8, BlockTokens: 16, Quant: QuantFP16, ModelSignature: 0x1234}

// seqTokens is sequence s: n token ids, the same in the C benchmark.
func seqTokens(s, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32((s*1000003+i*7919+1)&0xFFFFFF) + 1
	}
	return t
}

// pagesFor fills the pages of every full block of tokens: each page's
// bytes come from its block hash, so a wrong page is always noticed.
func pagesFor(g Geometry, tokens []uint32) []byte {
	pb := int(g.PageBytes(g.BlockTokens))
	hs := BlockHashes(tokens, g.BlockTokens)
	out := make([]byte, pb*len(hs))
	for i, h := range hs {
		p := out[i*pb : (i+1)*pb]
		x := h
		for j := 0; j+8 <= len(p); j += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(p[j:], x)
		}
	}
	return out
}

func pageOf(g Geometry, tokens []uint32, block int) []byte {
	pb := int(g.PageBytes(g.BlockTokens))
	return pagesFor(g, tokens[:(block+1)*int(g.BlockTokens)])[block*pb:]
}

// newTestStore creates a store in a temp dir with nseq sequences of
// nblocks full blocks each (plus a partial tail), flushed.
func newTestStore(t testing.TB, nseq, nblocks int) (*Store, string) {
	t.Helper()
	dir := t.TempDir() + "/store"
	s, err := Create(dir, StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	for q := 0; q < nseq; q++ {
		toks := seqTokens(q, nblocks*16+5)
		n, err := s.Put(toks, pagesFor(testGeom, toks), nil)
		if err != nil || n != nblocks {
			t.Fatalf("Put seq %d: n=%d err=%v", q, n, err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
