// copy_test.go - the copying accessors (View.Bytes, View.CopyTo,
// Fetched.Bytes, Fetched.CopyTo) keep their handle reachable until the
// copy ends, so a finalizer cannot unmap the page they are reading.
package kvx

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// collectDuringCopy runs get with collections run inside the copying
// accessor (testHookCopy: between taking the page and copying it, where
// the copy's allocation may run one), long enough for the finalizers they
// queue to run. A fault reading the page is returned, not a crash.
func collectDuringCopy(get func() []byte) (got []byte, err error) {
	testHookCopy = func() {
		for i := 0; i < 4; i++ {
			runtime.GC()
			time.Sleep(5 * time.Millisecond) // the finalizer goroutine runs
		}
	}
	old := debug.SetPanicOnFault(true)
	defer func() {
		testHookCopy = nil
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			err = fmt.Errorf("fault reading the page: %v", r)
		}
	}()
	return get(), nil
}

// viewCopy opens dir, takes block 0 of tokens, closes the store (the
// view's reference is the shard's last) and copies the page through a
// View whose Views nothing else references.
func viewCopy(dir string, tokens []uint32, copyTo bool) []byte {
	s, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		panic(err)
	}
	v, err := s.Prefix(tokens)
	if err != nil || v.Len() == 0 {
		panic(fmt.Sprint("Prefix: ", err))
	}
	b := v.At(0)
	s.Close()
	if copyTo {
		dst := make([]byte, testGeom.PageBytes(testGeom.BlockTokens))
		return dst[:b.CopyTo(dst)]
	}
	return b.Bytes()
}

// fetchedCopy fetches block 0 of tokens with a pool and a fetcher nothing
// else references, and copies the page through the *Fetched alone.
func fetchedCopy(s *Store, tokens []uint32, copyTo bool) []byte {
	o := DefaultPoolOptions()
	o.Bytes = 4 << 20
	o.NoMlock = true
	o.NoCUDA = true
	p, err := NewPool(&o)
	if err != nil {
		panic(err)
	}
	f, err := p.NewFetcher(&FetchOptions{IOMode: IOPread})
	if err != nil {
		panic(err)
	}
	v, err := s.Prefix(tokens)
	if err != nil || v.Len() == 0 {
		panic(fmt.Sprint("Prefix: ", err))
	}
	r, err := f.Fetch(context.Background(), []View{v.At(0)})
	v.Release()
	if err != nil {
		panic(err)
	}
	if copyTo {
		dst := make([]byte, testGeom.PageBytes(testGeom.BlockTokens))
		return dst[:r.CopyTo(0, dst)]
	}
	return r.Bytes(0)
}

// View.Bytes was `p := b.Page(); out := make(...); copy(out, p)`: once
// Page returned, nothing kept the Views reachable, so a collection during
// the copy could run its finalizer, which releases the views: with the
// store closed (or the shard evicted) that was the shard's last
// reference, and the page was unmapped mid-copy (a fault, or another
// mapping's bytes). The hook runs the collections at that very point, so
// without runtime.KeepAlive the View half faults every time.
// Fetched.Bytes had the same gap with the Fetcher's finalizer, but a
// batch not yet released is reachable from its Fetcher (fetcherHandle.cur)
// and reaches it back, and the runtime never finalizes an object
// reachable from itself: that half checks the bytes, and would fail only
// if that cycle went away without the runtime.KeepAlive.
// PROMISE: GO-3
func TestAttackCopyKeepsHandleAlive(t *testing.T) {
	dir := t.TempDir() + "/s"
	s, err := Create(dir, StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	toks := seqTokens(3, 2*16)
	if _, err := s.Put(toks, pagesFor(testGeom, toks), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	want := pageOf(testGeom, toks, 0)[:testGeom.PageBytes(testGeom.BlockTokens)]
	for _, copyTo := range []bool{false, true} {
		name := map[bool]string{false: "Bytes", true: "CopyTo"}[copyTo]
		got, err := collectDuringCopy(func() []byte { return viewCopy(dir, toks, copyTo) })
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("View.%s with its Views collected meanwhile: %v (%d bytes, right: %v)", name, err, len(got),
				bytes.Equal(got, want))
		}
	}
	r, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, copyTo := range []bool{false, true} {
		name := map[bool]string{false: "Bytes", true: "CopyTo"}[copyTo]
		got, err := collectDuringCopy(func() []byte { return fetchedCopy(r, toks, copyTo) })
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Fetched.%s with its Fetcher and Pool collected meanwhile: %v (%d bytes, right: %v)", name, err,
				len(got), bytes.Equal(got, want))
		}
	}
}
