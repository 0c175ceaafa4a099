// release_test.go - every accessor call of Views, View and Fetched is safe
// against a concurrent Release (and the Fetcher's or Store's Close): it
// completes on live memory or returns the zero value, never reads freed
// memory. Before the holds (viewSet.hold, Fetched.hold), View.Bytes racing
// Views.Release faulted in memmove within a few hundred iterations ("fatal
// error: fault", the whole test binary killed): the accessor checked
// `released` and then read a C array and a mapping that Release freed and
// unmapped in between.
package kvx

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"testing"
	"time"
)

// bigGeom has 2 MiB pages, so a copy is long enough to overlap a Release.
var bigGeom = Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, Quant: QuantFP16, ModelSignature: 7}

const raceIterations = 300

// bigStore is a store in a temp dir holding one 2 MiB block of toks.
func bigStore(t *testing.T) (dir string, toks []uint32, page []byte) {
	t.Helper()
	dir = t.TempDir() + "/s"
	s, err := Create(dir, StoreOptions{Geometry: bigGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	toks = seqTokens(5, 16+5) // one full block and a partial tail
	pages := pagesFor(bigGeom, toks)
	if n, err := s.Put(toks, pages, nil); err != nil || n != 1 {
		t.Fatalf("Put: n=%d err=%v", n, err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, toks, pages[:bigGeom.PageBytes(16)]
}

// releasedViews opens dir read-only, takes the prefix of toks and closes
// the store, so the Views hold the shard's last reference: their Release
// unmaps the page.
func releasedViews(t *testing.T, dir string, toks []uint32) *Views {
	s, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 1 {
		t.Fatalf("Prefix: len=%d err=%v", v.Len(), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return v
}

// race runs access and stop at the same moment, iterations times, with a
// fresh handle from newHandle each time.
func race[H any](iterations int, newHandle func() H, access func(H), stop func(H)) {
	for i := 0; i < iterations; i++ {
		h := newHandle()
		var start, done sync.WaitGroup
		start.Add(1)
		done.Add(2)
		go func() {
			defer done.Done()
			start.Wait()
			for k := 0; k < 3; k++ {
				access(h)
			}
		}()
		go func() {
			defer done.Done()
			start.Wait()
			runtime.Gosched()
			stop(h)
		}()
		start.Done()
		done.Wait()
	}
}

// PROMISE: GO-11
func TestViewAccessorsRaceRelease(t *testing.T) {
	dir, toks, want := bigStore(t)
	hash := BlockHashes(toks, bigGeom.BlockTokens)[0]
	var mu sync.Mutex
	var bad []string
	fail := func(s string) {
		mu.Lock()
		bad = append(bad, s)
		mu.Unlock()
	}
	accessors := map[string]func(View){
		"Bytes": func(b View) {
			if got := b.Bytes(); got != nil && !bytes.Equal(got, want) {
				fail("Bytes: a page that differs from the one put")
			}
		},
		"CopyTo": func(b View) {
			dst := make([]byte, len(want))
			if n := b.CopyTo(dst); n != 0 && (n != len(want) || !bytes.Equal(dst, want)) {
				fail("CopyTo: a page that differs from the one put")
			}
		},
		"Hash": func(b View) {
			if h := b.Hash(); h != 0 && h != hash {
				fail("Hash: another block's hash")
			}
		},
		"Tokens": func(b View) {
			if n := b.Tokens(); n != 0 && n != 16 {
				fail("Tokens: not 16")
			}
		},
		"Coordinate": func(b View) { _ = b.Coordinate() },
		"Entry": func(b View) {
			if e := b.Entry(); e != 0 {
				fail("Entry: not 0")
			}
		},
		"Found":  func(b View) { _ = b.Found() },
		"Page":   func(b View) { _ = len(b.Page()) }, // the slice itself is not read: the caller's to stop using
		"Scales": func(b View) { _ = b.Scales() },
	}
	for name, access := range accessors {
		t.Run(name, func(t *testing.T) {
			race(raceIterations, func() *Views { return releasedViews(t, dir, toks) },
				func(v *Views) { access(v.At(0)) }, func(v *Views) { v.Release() })
		})
	}
	if len(bad) > 0 {
		t.Fatalf("%d wrong answers, first: %s", len(bad), bad[0])
	}
}

// Export and Fetch read the views' C array inside C: they hold the Views
// across the crossing, and answer ErrInvalid once it is released.
// PROMISE: GO-11
func TestViewsExportAndFetchRaceRelease(t *testing.T) {
	dir, toks, want := bigStore(t)
	s, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	prefix := func() *Views {
		v, err := s.Prefix(toks)
		if err != nil || v.Len() != 1 {
			t.Fatalf("Prefix: %v", err)
		}
		return v
	}
	var unexpected []error
	var mu sync.Mutex
	note := func(err error) {
		if err != nil && !errors.Is(err, ErrInvalid) {
			mu.Lock()
			unexpected = append(unexpected, err)
			mu.Unlock()
		}
	}
	race(raceIterations, prefix, func(v *Views) {
		_, err := s.Export(v, EnvelopeV1)
		note(err)
	}, func(v *Views) { v.Release() })

	p := testPool(t)
	f, err := p.NewFetcher(&FetchOptions{IOMode: IOPread})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	race(raceIterations, prefix, func(v *Views) {
		r, err := f.Fetch(context.Background(), []View{v.At(0)})
		note(err)
		if err == nil {
			if got := r.Bytes(0); !bytes.Equal(got, want) {
				note(errors.New("Fetch after a racing Release: the page differs"))
			}
			r.Release()
		}
	}, func(v *Views) { v.Release() })
	if len(unexpected) > 0 {
		t.Fatalf("%d unexpected errors, first: %v", len(unexpected), unexpected[0])
	}
}

// Fetched's accessors against its Release and against the Fetcher's Close
// (which releases the batch): the README's one rule, not "one reader at a
// time".
// PROMISE: GO-11, GO-12
func TestFetchedAccessorsRaceRelease(t *testing.T) {
	dir, toks, want := bigStore(t)
	otherToks := seqTokens(9, 16+5)
	w, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.Put(otherToks, pagesFor(bigGeom, otherToks), nil); err != nil || n != 1 {
		t.Fatalf("Put: n=%d err=%v", n, err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	s, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o := DefaultPoolOptions()
	o.Bytes = 8 << 20
	o.NoMlock = true
	o.NoCUDA = true
	p, err := NewPool(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	type batch struct {
		f *Fetcher
		r *Fetched
	}
	fetch := func() batch {
		f, err := p.NewFetcher(&FetchOptions{IOMode: IOPread})
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.Prefix(toks)
		if err != nil || v.Len() != 1 {
			t.Fatalf("Prefix: %v", err)
		}
		r, err := f.Fetch(context.Background(), []View{v.At(0)})
		v.Release()
		if err != nil {
			t.Fatal(err)
		}
		return batch{f, r}
	}
	var wrong int
	var mu sync.Mutex
	check := func(ok bool) {
		if !ok {
			mu.Lock()
			wrong++
			mu.Unlock()
		}
	}
	accessors := map[string]func(*Fetched){
		"Bytes": func(r *Fetched) {
			got := r.Bytes(0)
			check(got == nil || bytes.Equal(got, want))
		},
		"CopyTo": func(r *Fetched) {
			dst := make([]byte, len(want))
			n := r.CopyTo(0, dst)
			check(n == 0 || bytes.Equal(dst, want))
		},
		"Page": func(r *Fetched) { _ = len(r.Page(0)) },
		"Err":  func(r *Fetched) { check(r.Err(0) == nil) },
	}
	// After the Release, the fetcher reads another block into the pool
	// memory it gave back: a reader still copying the released page would
	// copy the other block's bytes.
	other, err := s.Prefix(otherToks)
	if err != nil || other.Len() != 1 {
		t.Fatalf("Prefix of the other block: %v", err)
	}
	defer other.Release()
	refetch := func(f *Fetcher) {
		if r2, err := f.Fetch(context.Background(), []View{other.At(0)}); err == nil {
			r2.Release()
		}
	}
	stops := map[string]func(batch){
		"Release":      func(b batch) { b.r.Release(); refetch(b.f); b.f.Close() },
		"FetcherClose": func(b batch) { b.f.Close(); b.r.Release() },
	}
	for an, access := range accessors {
		for sn, stop := range stops {
			t.Run(an+"/"+sn, func(t *testing.T) {
				race(raceIterations, fetch, func(b batch) { access(b.r) }, stop)
			})
		}
	}
	if wrong > 0 {
		t.Fatalf("%d accessor calls answered a page that differs from the one put", wrong)
	}
}

// Closing the store while views, shards and batches are read: every
// accessor keeps answering the same bytes (they hold their own
// references), and the shard's accessors answer ErrClosed once it is
// closed. A guard: this held before the holds too.
// PROMISE: GO-11
func TestCloseRacesLiveHandles(t *testing.T) {
	dir, toks, want := bigStore(t)
	type handles struct {
		s  *Store
		v  *Views
		sh *Shard
	}
	open := func() handles {
		s, err := Open(dir, &OpenOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.Prefix(toks)
		if err != nil || v.Len() != 1 {
			t.Fatalf("Prefix: %v", err)
		}
		shards, err := s.Shards()
		if err != nil || len(shards) != 1 {
			t.Fatalf("Shards: %d %v", len(shards), err)
		}
		return handles{s, v, shards[0]}
	}
	var wrong int
	var mu sync.Mutex
	var views []*Views
	defer func() {
		for _, v := range views {
			v.Release()
		}
	}()
	race(raceIterations, func() handles {
		h := open()
		views = append(views, h.v)
		return h
	}, func(h handles) {
		got := h.v.At(0).Bytes()
		ents, err := h.sh.Entries()
		mu.Lock()
		if !bytes.Equal(got, want) || (err != nil && !errors.Is(err, ErrClosed)) || (err == nil && len(ents) != 1) {
			wrong++
		}
		mu.Unlock()
	}, func(h handles) {
		h.s.Close()
		h.sh.Close()
	})
	if wrong > 0 {
		t.Fatalf("%d wrong answers while the store and shard closed", wrong)
	}
}

// Two Fetches sharing Views in opposite orders, while every Views is
// released: each Fetch held the sets in its blocks' order, so each could
// hold one and wait for the other behind a pending Release (a pending
// writer stops new readers), for good. Fetch now holds them in one global
// order. A watchdog turns a deadlock into a failure with the goroutines'
// stacks.
// PROMISE: GO-11
func TestFetchLockOrderAgainstRelease(t *testing.T) {
	dir, toks, _ := bigStore(t)
	s, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := testPool(t)
	f1, err := p.NewFetcher(&FetchOptions{IOMode: IOPread})
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	f2, err := p.NewFetcher(&FetchOptions{IOMode: IOPread})
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	const nsets = 32
	for it := 0; it < 5000; it++ {
		sets := make([]*Views, nsets)
		forward := make([]View, nsets)
		backward := make([]View, nsets)
		for i := range sets {
			v, err := s.Prefix(toks)
			if err != nil || v.Len() != 1 {
				t.Fatalf("Prefix: %v", err)
			}
			sets[i] = v
			forward[i] = v.At(0)
			backward[nsets-1-i] = v.At(0)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		fetch := func(f *Fetcher, blocks []View) {
			defer wg.Done()
			<-start
			if r, err := f.Fetch(context.Background(), blocks); err == nil {
				r.Release()
			}
		}
		wg.Add(2 + nsets)
		go fetch(f1, forward)
		go fetch(f2, backward)
		for _, v := range sets {
			go func(v *Views) {
				defer wg.Done()
				<-start
				v.Release()
			}(v)
		}
		done := make(chan struct{})
		close(start)
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			pprof.Lookup("goroutine").WriteTo(os.Stderr, 1) //nolint:errcheck
			t.Fatalf("Fetch and Release deadlocked at iteration %d", it)
		}
	}
}
