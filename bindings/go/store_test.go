package kvx

import (
	"bytes"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestStorePutPrefixRestart(t *testing.T) {
	s, dir := newTestStore(t, 3, 4)
	st, err := s.Stat()
	if err != nil || st.Blocks != 12 || st.PendingBlocks != 0 {
		t.Fatalf("Stat %+v %v, want 12 blocks", st, err)
	}
	check := func(s *Store) {
		t.Helper()
		for q := 0; q < 3; q++ {
			toks := seqTokens(q, 4*16+5)
			v, err := s.Prefix(toks)
			if err != nil || v.Len() != 4 {
				t.Fatalf("Prefix seq %d: %d blocks, %v", q, v.Len(), err)
			}
			hs := BlockHashes(toks, 16)
			want := pagesFor(testGeom, toks)
			for i := 0; i < v.Len(); i++ {
				b := v.At(i)
				if b.Hash() != hs[i] || b.Tokens() != 16 || !b.Found() {
					t.Fatalf("seq %d block %d: hash %#x tokens %d", q, i, b.Hash(), b.Tokens())
				}
				if !bytes.Equal(b.Page(), want[i*1024:(i+1)*1024]) {
					t.Fatalf("seq %d block %d: page bytes differ", q, i)
				}
			}
			v.Release()
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, &OpenOptions{Expect: &testGeom})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s2.Close()
	if s2.Geometry() != testGeom {
		t.Fatalf("geometry %+v", s2.Geometry())
	}
	check(s2)

	// A longer prompt sharing 2 blocks, then diverging: the prefix is 2.
	toks := seqTokens(1, 4*16)
	toks = append(toks[:32:32], seqTokens(99, 40)...)
	v, err := s2.Prefix(toks)
	if err != nil || v.Len() != 2 {
		t.Fatalf("diverging prefix: %d, %v", v.Len(), err)
	}
	v.Release()
	// PrefixMax caps; fewer than B tokens serve nothing.
	v, _ = s2.PrefixMax(seqTokens(0, 64), 1)
	if v.Len() != 1 {
		t.Fatalf("PrefixMax 1: %d", v.Len())
	}
	v.Release()
	if v, err := s2.Prefix(seqTokens(0, 15)); err != nil || v.Len() != 0 {
		t.Fatalf("short prompt: %d %v", v.Len(), err)
	}
	// A wrong expectation.
	g := testGeom
	g.HeadDim = 16
	if _, err := Open(dir, &OpenOptions{ReadOnly: true, Expect: &g}); !errors.Is(err, ErrShape) {
		t.Fatalf("Open with another head_dim: %v, want ErrShape", err)
	}
	g = testGeom
	g.ModelSignature = 99
	if _, err := Open(dir, &OpenOptions{ReadOnly: true, Expect: &g}); !errors.Is(err, ErrModel) || !errors.Is(err, ErrShape) {
		t.Fatalf("Open with another model: %v, want ErrModel", err)
	}
}

func TestStoreGetByHashAndCoordinate(t *testing.T) {
	s, _ := newTestStore(t, 2, 3)
	toks := seqTokens(1, 3*16)
	hs := BlockHashes(toks, 16)
	v, err := s.GetHash(hs[2])
	if err != nil || v.Len() != 1 || !bytes.Equal(v.At(0).Page(), pageOf(testGeom, toks, 2)[:1024]) {
		t.Fatalf("GetHash: %v", err)
	}
	coord := v.At(0).Coordinate()
	v.Release()
	c, err := s.Get(coord)
	if err != nil || c.At(0).Hash() != hs[2] {
		t.Fatalf("Get(%#x): %v", coord, err)
	}
	c.Release()
	if _, err := s.GetHash(12345); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetHash miss: %v", err)
	}
	if _, err := s.Get(MakeCoord(200, 1, 0)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get miss: %v", err)
	}
	vs, errs, err := s.GetHashes([]uint64{hs[0], 777, hs[1]})
	if err != nil || vs.Len() != 3 {
		t.Fatal(err)
	}
	if !vs.At(0).Found() || vs.At(1).Found() || !vs.At(2).Found() || errs[0] != nil ||
		!errors.Is(errs[1], ErrNotFound) || errs[2] != nil || vs.At(2).Hash() != hs[1] {
		t.Fatalf("GetHashes: found %v %v %v, errs %v", vs.At(0).Found(), vs.At(1).Found(), vs.At(2).Found(), errs)
	}
	vs.Release()
}

func TestPutValidationAndFlushVisibility(t *testing.T) {
	s, _ := newTestStore(t, 1, 1)
	toks := seqTokens(7, 32)
	if _, err := s.Put(toks, make([]byte, 1000), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Put of a partial page: %v", err)
	}
	// three pages for two full blocks
	if _, err := s.Put(toks, make([]byte, 3*1024), nil); !errors.Is(err, ErrTokens) {
		t.Fatalf("Put of more pages than blocks: %v", err)
	}
	n, err := s.Put(toks, pagesFor(testGeom, toks), nil)
	if err != nil || n != 2 {
		t.Fatalf("Put: %d %v", n, err)
	}
	v, _ := s.Prefix(toks)
	if v.Len() != 0 {
		t.Fatalf("unflushed blocks are visible: %d", v.Len())
	}
	if n, _ := s.Put(toks, pagesFor(testGeom, toks), nil); n != 0 {
		t.Fatalf("re-put of pending blocks wrote %d", n)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	v, _ = s.Prefix(toks)
	if v.Len() != 2 {
		t.Fatalf("flushed prefix %d", v.Len())
	}
	v.Release()
}

func TestViewsReleaseAndLifetime(t *testing.T) {
	s, _ := newTestStore(t, 1, 2)
	toks := seqTokens(0, 32)
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 2 {
		t.Fatal(err)
	}
	b := v.At(1)
	cp := b.Bytes()
	dst := make([]byte, 2048)
	if n := b.CopyTo(dst); n != 1024 || !bytes.Equal(dst[:n], cp) {
		t.Fatalf("CopyTo %d", n)
	}
	// Views hold shard references: they outlive the store.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Page(), cp) || !bytes.Equal(cp, pageOf(testGeom, toks, 1)[:1024]) {
		t.Fatal("view changed after the store closed")
	}
	v.Release()
	v.Release() // idempotent
	if !v.Released() || b.Page() != nil || b.Bytes() != nil || b.CopyTo(dst) != 0 || b.Hash() != 0 || b.Found() {
		t.Fatal("a released view must read as empty")
	}
	if _, err := s.Prefix(toks); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("Prefix after Close: %v", err)
	}
	if _, err := s.Put(toks, pagesFor(testGeom, toks), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal("second Close")
	}
}

func TestWriterLock(t *testing.T) {
	s, dir := newTestStore(t, 1, 1)
	if _, err := Open(dir, &OpenOptions{NoWait: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("second writer: %v, want ErrBusy", err)
	}
	ro, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("reader beside the writer: %v", err)
	}
	defer ro.Close()
	v, err := ro.Prefix(seqTokens(0, 16))
	if err != nil || v.Len() != 1 {
		t.Fatalf("read-only prefix: %d %v", v.Len(), err)
	}
	v.Release()
	toks := seqTokens(3, 16)
	if _, err := ro.Put(toks, pagesFor(testGeom, toks), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Put on a read-only store: %v", err)
	}
	s.Close()
	w, err := Open(dir, &OpenOptions{NoWait: true})
	if err != nil {
		t.Fatalf("writer after Close: %v", err)
	}
	w.Close()
}

// The finalizer closes a forgotten store (a safety net): its writer lock
// is released once the Store is unreachable and collected.
func TestStoreFinalizer(t *testing.T) {
	dir := t.TempDir() + "/s"
	func() {
		s, err := Create(dir, StoreOptions{Geometry: testGeom, NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		_ = s
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		s, err := Open(dir, &OpenOptions{NoWait: true})
		if err == nil {
			s.Close()
			return
		}
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			t.Fatalf("store never finalized: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Readers and a writer from many goroutines (run with -race).
func TestConcurrentGoroutines(t *testing.T) {
	s, _ := newTestStore(t, 4, 4)
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for it := 0; it < 200; it++ {
				q := (g + it) % 4
				toks := seqTokens(q, 4*16)
				v, err := s.Prefix(toks)
				if err != nil || v.Len() != 4 {
					errc <- errors.New("prefix failed")
					return
				}
				i := it % 4
				if !bytes.Equal(v.At(i).Page(), pageOf(testGeom, toks, i)[:1024]) {
					errc <- errors.New("wrong page")
					return
				}
				v.Release()
			}
		}(g)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for q := 10; q < 30; q++ {
			toks := seqTokens(q, 2*16)
			if _, err := s.Put(toks, pagesFor(testGeom, toks), nil); err != nil {
				errc <- err
				return
			}
			if q%5 == 0 {
				if err := s.Flush(); err != nil {
					errc <- err
					return
				}
			}
		}
		if err := s.Flush(); err != nil {
			errc <- err
		}
	}()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st, _ := s.Stat()
	if st.Blocks != 16+40 {
		t.Fatalf("blocks %d, want 56", st.Blocks)
	}
}

func TestStoreVerify(t *testing.T) {
	s, _ := newTestStore(t, 2, 2)
	probs, err := s.Verify()
	if err != nil || len(probs) != 0 {
		t.Fatalf("Verify of an intact store: %v %v", probs, err)
	}
}
