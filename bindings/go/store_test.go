package kvx

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
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

// PROMISE: DUR-1
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

// PROMISE: STORE-5, GO-1
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

// PROMISE: STORE-14
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
// PROMISE: GO-3
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
// PROMISE: STORE-16, GO-5
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

// PROMISE: GO-1, GO-5
func TestAttackCloseDuringLookupsAndBatches(t *testing.T) {
	s, _ := newTestStore(t, 2, 4)
	toks := seqTokens(0, 4*16+5)
	want := pagesFor(testGeom, toks)
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, 16)
	kept := make(chan *Views, 16)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var last *Views
			for {
				v, err := s.Prefix(toks)
				if err != nil {
					errs <- err
					kept <- last
					return
				}
				if last != nil {
					last.Release()
				}
				last = v
			}
		}()
	}
	b, err := s.NewBatch()
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		for q := 10; ; q++ {
			tk := seqTokens(q, 2*16)
			if _, err := b.Put(tk, pagesFor(testGeom, tk), nil); err != nil {
				errs <- err
				return
			}
		}
	}()
	close(start)
	v, err := s.Prefix(toks) // at least one lookup before the Close
	if err != nil || v.Len() != 4 {
		t.Fatalf("Prefix: %v", err)
	}
	s.Close()
	wg.Wait()
	close(errs)
	close(kept)
	for err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("a call racing Close: %v, want ErrClosed", err)
		}
	}
	for k := range kept {
		if k == nil {
			continue
		}
		for i := 0; i < k.Len(); i++ { // views served before the Close stay readable
			if !bytes.Equal(k.At(i).Page(), want[i*1024:(i+1)*1024]) {
				t.Fatalf("block %d changed after Close", i)
			}
		}
		k.Release()
	}
	for i := 0; i < v.Len(); i++ {
		if !bytes.Equal(v.At(i).Page(), want[i*1024:(i+1)*1024]) {
			t.Fatalf("block %d changed after Close", i)
		}
	}
	v.Release()
	if err := b.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Batch.Flush after Store.Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// PROMISE: GO-8
func TestAttackSlicesOfTheWrongLength(t *testing.T) {
	s, _ := newTestStore(t, 0, 0)
	toks := seqTokens(3, 2*16)
	pages := pagesFor(testGeom, toks)
	if _, err := s.Put(toks, pages[:len(pages)-1], nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("short pages: %v", err)
	}
	if _, err := s.Put(toks, append(pages, 0), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("long pages: %v", err)
	}
	if _, err := s.Put(toks[:16], pages, nil); !errors.Is(err, ErrTokens) {
		t.Fatalf("pages beyond the tokens' blocks: %v", err)
	}
	if _, err := s.Put(nil, pages, nil); !errors.Is(err, ErrTokens) {
		t.Fatalf("nil tokens: %v", err)
	}
	if _, err := s.Put(toks, pages, make([]float32, 3)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("wrong scales: %v", err)
	}
	if n, err := s.Put(toks, nil, nil); n != 0 || err != nil {
		t.Fatalf("no pages: %d %v", n, err)
	}
	if _, err := s.PutEnvelope(nil, nil); !errors.Is(err, ErrFormat) {
		t.Fatalf("nil envelope: %v", err)
	}
	for _, env := range [][]byte{{0}, make([]byte, 32), bytes.Repeat([]byte{0xff}, 4096)} {
		if _, err := s.PutEnvelope(env, toks); err == nil {
			t.Fatalf("garbage envelope of %d bytes accepted", len(env))
		}
		if _, err := ParseEnvelope(env, nil); err == nil {
			t.Fatalf("ParseEnvelope accepted %d garbage bytes", len(env))
		}
	}
	if v, err := s.PrefixMax(toks, -5); err != nil || v.Len() != 0 {
		t.Fatalf("PrefixMax(-5): %v", err)
	}
	if v, err := s.Prefix(nil); err != nil || v.Len() != 0 {
		t.Fatalf("Prefix(nil): %v", err)
	}
	if _, err := s.GetBlock(toks[:15]); !errors.Is(err, ErrTokens) {
		t.Fatalf("GetBlock of 15 tokens: %v", err)
	}
	if v, _, err := s.GetHashes(nil); err != nil || v.Len() != 0 {
		t.Fatalf("GetHashes(nil): %v", err)
	}
	if _, err := s.Put(toks, pages, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 2 || !bytes.Equal(v.At(1).Page(), pages[1024:]) {
		t.Fatalf("after the bad puts: %v", err)
	}
	v.Release()
}

// PROMISE: FORMAT-11, GO-8
func TestAttackPaths(t *testing.T) {
	tmp := t.TempDir()
	// C sees a path up to its NUL: tmp/a would be created, tmp/a opened
	if _, err := Create(tmp+"/a\x00b", StoreOptions{Geometry: testGeom}); !errors.Is(err, ErrPath) {
		t.Fatalf("Create of a path with a NUL byte: %v, want ErrPath", err)
	}
	if _, err := os.Stat(tmp + "/a"); err == nil {
		t.Fatal("Create with a NUL byte made the truncated path")
	}
	s, err := Create(tmp+"/a", StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(tmp+"/a\x00b", nil); !errors.Is(err, ErrPath) {
		t.Fatalf("Open of a path with a NUL byte: %v, want ErrPath", err)
	}
	if _, err := Open(tmp+"/a", &OpenOptions{TierURL: "redis://127.0.0.1:1", TierTenant: "t1\x00t2"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a tenant with a NUL byte: %v, want ErrInvalid", err)
	}
	if _, err := Create(tmp+"/b", StoreOptions{Geometry: testGeom, TierURL: "redis://h:1\x00x"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a tier URL with a NUL byte: %v, want ErrInvalid", err)
	}
	if _, err := OpenShard(tmp+"/x\x00y", false); !errors.Is(err, ErrPath) {
		t.Fatalf("OpenShard of a path with a NUL byte: %v", err)
	}
	if _, err := WarmupPaths(context.Background(), []string{tmp + "/a", tmp + "/a\x00"}, nil, nil); !errors.Is(err, ErrPath) {
		t.Fatalf("WarmupPaths with a NUL byte: %v", err)
	}
	fifo := filepath.Join(tmp, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	if _, err := Open(fifo, nil); err == nil {
		t.Fatal("Open of a FIFO succeeded")
	}
	if _, err := OpenShard(fifo, false); err == nil {
		t.Fatal("OpenShard of a FIFO succeeded")
	}
	file := filepath.Join(tmp, "file")
	writeFile(t, file, []byte("x"))
	if _, err := Open(file, nil); err == nil {
		t.Fatal("Open of a file succeeded")
	}
	if _, err := Create(file, StoreOptions{Geometry: testGeom}); err == nil {
		t.Fatal("Create over a file succeeded")
	}
	if _, err := OpenShard(tmp, false); err == nil {
		t.Fatal("OpenShard of a directory succeeded")
	}
}

// PROMISE: RECOVER-16
func TestAttackFIFOInStoreDir(t *testing.T) {
	// A FIFO planted as DIR/STORE hung Open inside the cgo call (a blocking
	// open); now it is refused at once (tests/test_recovery.c
	// test_fifo_where_store_files_belong).
	dir := t.TempDir() + "/s"
	s, err := Create(dir, StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	os.Rename(dir+"/STORE", dir+"/STORE.old")
	if err := syscall.Mkfifo(dir+"/STORE", 0o600); err != nil {
		t.Skip(err)
	}
	if _, err := Open(dir, &OpenOptions{ReadOnly: true}); !errors.Is(err, ErrPath) {
		t.Fatalf("a FIFO as STORE: %v, want ErrPath", err)
	}
}
