package kvx

import (
	"bytes"
	"os"
	"testing"
)

// A store created and reopened with Holes evicts in place: the free log
// DIR/FREED appears, a prompt read after every put stays whole and
// byte-exact through the evictions, and every other prompt is served whole,
// as a shorter prefix or not at all, never with a wrong page.
// PROMISE: GO-13
func TestHolesEvictInPlace(t *testing.T) {
	dir := t.TempDir() + "/store"
	s, err := Create(dir, StoreOptions{Geometry: testGeom, CapacityBytes: 4 << 20, NoSync: true, Holes: true})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	const nb = 8
	hot := seqTokens(0, nb*16)
	check := func(st *Store, q int) int {
		toks := seqTokens(q, nb*16)
		v, err := st.Prefix(toks)
		if err != nil {
			t.Fatalf("Prefix seq %d: %v", q, err)
		}
		defer v.Release()
		for i := 0; i < v.Len(); i++ {
			if !bytes.Equal(v.At(i).Page(), pageOf(testGeom, toks, i)[:len(v.At(i).Page())]) {
				t.Fatalf("seq %d block %d: wrong page", q, i)
			}
		}
		return v.Len()
	}
	const nseq = 400
	for q := 0; q < nseq; q++ {
		toks := seqTokens(q, nb*16)
		if _, err := s.Put(toks, pagesFor(testGeom, toks), nil); err != nil {
			t.Fatalf("Put seq %d: %v", q, err)
		}
		if err := s.Flush(); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		if n := check(s, 0); n != nb {
			t.Fatalf("after seq %d: the hot prompt served %d of %d blocks", q, n, nb)
		}
	}
	_ = hot
	st, err := s.Stat()
	if err != nil || st.EvictedBlocks == 0 {
		t.Fatalf("Stat: %+v, %v: nothing evicted", st, err)
	}
	if st.FreedBytes == 0 || st.FreedBytes >= st.Bytes {
		t.Fatalf("Stat: FreedBytes %d of Bytes %d: no page freed in place", st.FreedBytes, st.Bytes)
	}
	if _, err := os.Stat(dir + "/FREED"); err != nil {
		t.Fatalf("no free log: %v", err)
	}
	s.Close()
	r, err := Open(dir, &OpenOptions{Holes: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer r.Close()
	whole := 0
	for q := 0; q < nseq; q++ {
		if check(r, q) == nb {
			whole++
		}
	}
	if whole == 0 || whole == nseq {
		t.Fatalf("%d of %d prompts whole after the evictions", whole, nseq)
	}
}
