// handles_test.go - every handle type's lifetime under hostile use: nil and
// zero-value handles, Close and Release twice and concurrently, finalizers
// beside explicit Close, copies of a handle. Each check asserts the
// binding's answer (a distinct error, or the right bytes); none may panic
// or crash. Run it also with -race and GODEBUG=cgocheck=2 (README.md).
package kvx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// storeCalls are every call of the Store API on s, each returning its error.
func storeCalls(s *Store) map[string]func() error {
	toks := seqTokens(0, 64)
	return map[string]func() error{
		"Prefix":      func() error { _, err := s.Prefix(toks); return err },
		"GetBlock":    func() error { _, err := s.GetBlock(toks); return err },
		"Get":         func() error { _, err := s.Get(0); return err },
		"GetHash":     func() error { _, err := s.GetHash(1); return err },
		"GetHashes":   func() error { _, _, err := s.GetHashes([]uint64{1}); return err },
		"Put":         func() error { _, err := s.Put(toks, make([]byte, 1024), nil); return err },
		"PutEnvelope": func() error { _, err := s.PutEnvelope([]byte{1}, nil); return err },
		"Flush":       s.Flush,
		"GC":          s.GC,
		"Reindex":     s.Reindex,
		"Export":      func() error { _, err := s.Export(nil, EnvelopeV1); return err },
		"Stat":        func() error { _, err := s.Stat(); return err },
		"Verify":      func() error { _, err := s.Verify(); return err },
		"Shards":      func() error { _, err := s.Shards(); return err },
		"NewBatch":    func() error { _, err := s.NewBatch(); return err },
		"Warmup":      func() error { _, err := s.Warmup(context.Background(), nil, nil); return err },
		"WithCStore":  func() error { return s.WithCStore(func(unsafe.Pointer) error { return nil }) },
		// arguments that would be answered before C: a closed store's
		// answer is still ErrClosed
		"Prefix of nothing":      func() error { _, err := s.Prefix(nil); return err },
		"Put of no pages":        func() error { _, err := s.Put(toks, nil, nil); return err },
		"PutEnvelope of nothing": func() error { _, err := s.PutEnvelope(nil, nil); return err },
		"GetHashes of none":      func() error { _, _, err := s.GetHashes(nil); return err },
	}
}

// PROMISE: GO-2
func TestAttackNilAndZeroStore(t *testing.T) {
	toks := seqTokens(0, 64)
	// a nil *Store (Open failed, the error ignored): ErrClosed, no panic
	var nilStore *Store
	for name, f := range storeCalls(nilStore) {
		if err := f(); !errors.Is(err, ErrClosed) {
			t.Errorf("nil *Store %s: %v, want ErrClosed", name, err)
		}
	}
	if err := nilStore.Close(); err != nil {
		t.Fatalf("Close on a nil *Store: %v", err)
	}
	if nilStore.Geometry() != (Geometry{}) {
		t.Fatal("a nil *Store has a geometry")
	}
	// the zero Store (never opened) is a closed one: every call is
	// ErrClosed, before its arguments are looked at (an attack found
	// Prefix answering an empty prefix, GetBlock ErrTokens, Put ErrInvalid)
	zero := &Store{}
	for name, f := range storeCalls(zero) {
		if err := f(); !errors.Is(err, ErrClosed) {
			t.Errorf("zero Store %s: %v, want ErrClosed", name, err)
		}
	}
	if err := zero.Close(); err != nil {
		t.Fatal(err)
	}
	// the other handles' Close / Release on nil (a failed constructor's
	// result, closed by a defer written before the error check)
	var (
		nb *Batch
		ns *Shard
		np *Pool
		nf *Fetcher
		ng *GPU
		nr *Fetched
		nw *WarmupResult
	)
	if nb.Close() != nil || ns.Close() != nil || np.Close() != nil || nf.Close() != nil || ng.Close() != nil {
		t.Fatal("Close on a nil handle failed")
	}
	nr.Release()
	nw.Release()
	if _, err := nb.Put(toks, make([]byte, 1024), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("nil *Batch Put: %v", err)
	}
	if err := nb.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("nil *Batch Flush: %v", err)
	}
	if _, err := ns.Page(0, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("nil *Shard Page: %v", err)
	}
	if ns.Path() != "" || ns.Info().NumBlocks != 0 {
		t.Fatal("a nil *Shard answers")
	}
	var nilViews *Views
	nilViews.Release()
	if nilViews.Len() != 0 || nilViews.StoppedAt() != nil || nilViews.Released() {
		t.Fatal("a nil *Views is not an empty one")
	}
	var zv View
	if zv.Found() || zv.Page() != nil || zv.Bytes() != nil || zv.Hash() != 0 || zv.Scales() != nil ||
		zv.CopyTo(make([]byte, 4)) != 0 {
		t.Fatal("the zero View is not a miss")
	}
	// zero values of the other handles (never made by a constructor): each
	// is a closed handle, none panics
	zb, zs, zp, zf, zg, zr, zw, zvs := &Batch{}, &Shard{}, &Pool{}, &Fetcher{}, &GPU{}, &Fetched{}, &WarmupResult{}, &Views{}
	if _, err := zb.Put(toks, make([]byte, 1024), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("zero Batch Put: %v", err)
	}
	if _, err := zs.Page(0, false); !errors.Is(err, ErrClosed) || zs.Path() != "" || zs.Info().NumBlocks != 0 {
		t.Fatalf("zero Shard: %v", err)
	}
	if _, err := zp.Info(); !errors.Is(err, ErrClosed) {
		t.Fatalf("zero Pool Info: %v", err)
	}
	if _, err := zp.NewFetcher(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("zero Pool NewFetcher: %v", err)
	}
	if _, err := zf.Fetch(context.Background(), nil); !errors.Is(err, ErrClosed) || zf.Mode() != IOAuto {
		t.Fatalf("zero Fetcher Fetch: %v", err)
	}
	if err := zg.CopyBack(make([]byte, 4), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("zero GPU CopyBack: %v", err)
	}
	if zr.Len() != 0 || zw.NumPages() != 0 || zw.HostPage(0) != nil || zvs.Len() != 0 || zvs.Released() ||
		zvs.StoppedAt() != nil {
		t.Fatal("a zero Fetched, WarmupResult or Views is not empty")
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "out of range") {
				t.Fatalf("zero Views At(0): %v, want an index-out-of-range panic", r)
			}
		}()
		zvs.At(0)
	}()
	zvs.Release()
	zr.Release()
	zw.Release()
	for _, c := range []func() error{zb.Close, zs.Close, zp.Close, zf.Close, zg.Close} {
		if err := c(); err != nil {
			t.Fatal(err)
		}
	}
}

// PROMISE: GO-2
func TestAttackCloseTwiceAndConcurrently(t *testing.T) {
	s, _ := newTestStore(t, 1, 2)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Close() }()
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prefix(seqTokens(0, 40)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Prefix after Close: %v", err)
	}
}

// PROMISE: GO-3
func TestAttackFinalizersAndExplicitClose(t *testing.T) {
	dir := t.TempDir() + "/s"
	s, err := Create(dir, StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	toks := seqTokens(1, 3*16)
	if _, err := s.Put(toks, pagesFor(testGeom, toks), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	// forgotten Views and Batches are released by their finalizers while
	// the store is closed explicitly
	for i := 0; i < 50; i++ {
		if _, err := s.Prefix(toks); err != nil {
			t.Fatal(err)
		}
		if _, err := s.NewBatch(); err != nil {
			t.Fatal(err)
		}
	}
	v, err := s.Prefix(toks)
	if err != nil {
		t.Fatal(err)
	}
	page := v.At(2).Page()
	runtime.GC()
	s.Close()
	runtime.GC()
	runtime.GC()
	if !bytes.Equal(page, pageOf(testGeom, toks, 2)) {
		t.Fatal("a live Views' page changed")
	}
	runtime.KeepAlive(v)
	v.Release()
	v.Release()
	if v.At(0).Page() != nil || v.At(0).Found() || v.At(1).Hash() != 0 {
		t.Fatal("a released view still answers")
	}
	// a forgotten Store: its finalizer closes it, the writer lock goes
	func() {
		if _, err := Open(dir, nil); err != nil {
			t.Fatal(err)
		}
	}()
	for i := 0; i < 5; i++ {
		runtime.GC()
	}
	s3, err := Open(dir, &OpenOptions{NoWait: true})
	if err != nil {
		t.Fatalf("Open after a forgotten Store was collected: %v", err)
	}
	s3.Close()
}

// openedCopy opens dir and returns a copy of the Store value: the *Store
// Open returned is unreachable once it returns.
func openedCopy(t *testing.T, dir string) Store {
	t.Helper()
	s, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	return *s
}

// A handle copied by value (`c := *s`) was a second owner of the same C
// handle: closing the copy and then the original closed the C store
// twice (a double free), and the finalizer on the *Store Open returned
// closed the C store under a copy still in use once that pointer was
// dropped. Every handle type is now one shared state behind a pointer,
// as os.File does: a copy is the same handle, closed once for all, and
// the finalizer is on the shared state. The same holds for Shard, Batch,
// Views, Pool, Fetcher, Fetched and WarmupResult (and GPU, which needs a
// GPU to make).
// PROMISE: GO-4
func TestAttackCopiedHandles(t *testing.T) {
	s, dir := newTestStore(t, 2, 4)
	toks := seqTokens(0, 4*16+5)

	// the finalizer follows the shared state: a copy keeps the store open
	kept := openedCopy(t, dir)
	for i := 0; i < 5; i++ {
		runtime.GC()
	}
	v, err := kept.Prefix(toks)
	if err != nil || v.Len() != 4 || !bytes.Equal(v.At(3).Page(), pageOf(testGeom, toks, 3)) {
		t.Fatalf("a copy of a Store after its original was collected: %v", err)
	}
	v.Release()

	// Views: Release on a copy releases both, once
	v, err = s.Prefix(toks)
	if err != nil || v.Len() != 4 {
		t.Fatal(err)
	}
	vc := *v
	vc.Release()
	if !v.Released() || v.At(0).Page() != nil || v.At(0).Found() {
		t.Fatal("the views still serve pages after a copy was released")
	}
	v.Release()

	// Shard: closing a copy closes the original
	shards, err := s.Shards()
	if err != nil || len(shards) == 0 {
		t.Fatal(err)
	}
	sc := *shards[0]
	sc.Close()
	if _, err := shards[0].Page(0, true); !errors.Is(err, ErrClosed) {
		t.Fatalf("a Shard after its copy was closed: %v, want ErrClosed", err)
	}
	for _, sh := range shards {
		sh.Close()
	}

	// Fetched: a copy of a released batch serves no page from the pool
	p := testPool(t)
	f, err := p.NewFetcher(&FetchOptions{IOMode: IOPread})
	if err != nil {
		t.Fatal(err)
	}
	v, err = s.Prefix(toks)
	if err != nil {
		t.Fatal(err)
	}
	r, err := f.Fetch(context.Background(), []View{v.At(0)})
	v.Release()
	if err != nil || !bytes.Equal(r.Page(0), pageOf(testGeom, toks, 0)) {
		t.Fatalf("Fetch: %v", err)
	}
	rc := *r
	r.Release()
	if rc.Page(0) != nil {
		t.Fatal("a copy of a released Fetched still serves pool memory")
	}
	rc.Release()
	fc := *f
	if err := fc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Fetch(context.Background(), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("a Fetcher after its copy was closed: %v", err)
	}
	f.Close()
	pc := *p
	if err := pc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Info(); !errors.Is(err, ErrClosed) {
		t.Fatalf("a Pool after its copy was closed: %v", err)
	}

	// WarmupResult: Release on a copy frees the host sink once
	o := DefaultWarmupOptions()
	o.Sink = SinkHost
	o.IOMode = IOPread
	res, err := s.Warmup(context.Background(), &o, nil)
	if err != nil || res.NumPages() == 0 {
		t.Fatalf("host warmup: %v", err)
	}
	resc := *res
	resc.Release()
	if res.HostPage(0) != nil {
		t.Fatal("a warmup's host page after a copy of its result was released")
	}
	res.Release()

	// Batch: closing a copy closes the original
	b, err := s.NewBatch()
	if err != nil {
		t.Fatal(err)
	}
	bc := *b
	bc.Close()
	if _, err := b.Put(toks, pagesFor(testGeom, toks), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("a Batch after its copy was closed: %v", err)
	}
	b.Close()

	// Store: closing a copy closes the original, once
	c := *s
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for name, call := range storeCalls(s) {
		if err := call(); !errors.Is(err, ErrClosed) {
			t.Errorf("%s on a Store whose copy was closed: %v, want ErrClosed", name, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := kept.Close(); err != nil {
		t.Fatal(err)
	}
}
