package kvx

import (
	"errors"
	"sync"
	"testing"
)

// servedBlocks is the number of leading blocks of toks the store serves.
func servedBlocks(t *testing.T, s *Store, toks []uint32) int {
	t.Helper()
	v, err := s.Prefix(toks)
	if err != nil {
		t.Fatalf("Prefix: %v", err)
	}
	defer v.Release()
	return v.Len()
}

// Each Batch's Flush publishes its own blocks only; Close drops a batch's
// unflushed blocks; after Store.Close a batch answers ErrClosed.
// PROMISE: DUR-8
func TestBatchesFlushTheirOwn(t *testing.T) {
	s, dir := newTestStore(t, 0, 0)
	a, err := s.NewBatch()
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.NewBatch()
	if err != nil {
		t.Fatal(err)
	}
	ta, tb, tc := seqTokens(31, 3*16), seqTokens(32, 3*16), seqTokens(33, 2*16)
	if n, err := a.Put(ta, pagesFor(testGeom, ta), nil); err != nil || n != 3 {
		t.Fatalf("a.Put: %d %v", n, err)
	}
	if n, err := b.Put(tb, pagesFor(testGeom, tb), nil); err != nil || n != 3 {
		t.Fatalf("b.Put: %d %v", n, err)
	}
	if _, err := a.Put(ta, make([]byte, 1000), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a.Put of a partial page: %v", err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := servedBlocks(t, s, tb); got != 3 {
		t.Fatalf("b's blocks after b.Flush: %d", got)
	}
	if got := servedBlocks(t, s, ta); got != 0 {
		t.Fatalf("a's unflushed blocks visible after b.Flush: %d", got)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := servedBlocks(t, s, ta); got != 3 {
		t.Fatalf("a's blocks after a.Flush: %d", got)
	}
	// closed with blocks unflushed: never stored
	if _, err := a.Put(tc, pagesFor(testGeom, tc), nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush of a closed batch: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(tc, pagesFor(testGeom, tc), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Store.Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, &OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if servedBlocks(t, s2, ta) != 3 || servedBlocks(t, s2, tb) != 3 || servedBlocks(t, s2, tc) != 0 {
		t.Fatalf("after reopen: a %d b %d c %d", servedBlocks(t, s2, ta), servedBlocks(t, s2, tb),
			servedBlocks(t, s2, tc))
	}
	if _, err := s2.NewBatch(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("NewBatch on a read-only store: %v", err)
	}
}

// Goroutines each with their own Batch put and flush distinct prompts.
// PROMISE: DUR-9
func TestBatchesConcurrentGoroutines(t *testing.T) {
	s, _ := newTestStore(t, 0, 0)
	defer s.Close()
	const workers, prompts = 4, 6
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			b, err := s.NewBatch()
			if err != nil {
				errs <- err
				return
			}
			defer b.Close()
			for p := 0; p < prompts; p++ {
				toks := seqTokens(1000+w*100+p, 2*16)
				if _, err := b.Put(toks, pagesFor(testGeom, toks), nil); err != nil {
					errs <- err
					return
				}
				if err := b.Flush(); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for w := 0; w < workers; w++ {
		for p := 0; p < prompts; p++ {
			if got := servedBlocks(t, s, seqTokens(1000+w*100+p, 2*16)); got != 2 {
				t.Fatalf("worker %d prompt %d: %d blocks", w, p, got)
			}
		}
	}
}
