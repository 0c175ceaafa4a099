package kvx

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
)

func testPool(t *testing.T) *Pool {
	t.Helper()
	o := DefaultPoolOptions()
	o.Bytes = 4 << 20
	o.NoMlock = true // RLIMIT_MEMLOCK is small in CI
	o.NoCUDA = true
	p, err := NewPool(&o)
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// PROMISE: IO-3
func TestFetchIntoPinned(t *testing.T) {
	s, _ := newTestStore(t, 2, 4)
	p := testPool(t)
	for _, mode := range []IOMode{IOAuto, IOPread} {
		f, err := p.NewFetcher(&FetchOptions{IOMode: mode})
		if err != nil {
			t.Fatalf("NewFetcher(%v): %v", mode, err)
		}
		toks := seqTokens(1, 4*16)
		v, err := s.Prefix(toks)
		if err != nil || v.Len() != 4 {
			t.Fatal(err)
		}
		blocks := []View{v.At(3), v.At(0), v.At(2)}
		r, err := f.Fetch(context.Background(), blocks)
		v.Release() // the batch holds its own references
		if err != nil || r.Len() != 3 {
			t.Fatalf("Fetch: %v", err)
		}
		for i, want := range []int{3, 0, 2} {
			pg := r.Page(i)
			if r.Err(i) != nil || !bytes.Equal(pg, pageOf(testGeom, toks, want)[:1024]) || r.CRC32(i) != CRC32(0, pg) {
				t.Fatalf("%v page %d: %v", mode, i, r.Err(i))
			}
		}
		if _, err := f.Fetch(context.Background(), nil); !errors.Is(err, ErrBusy) {
			t.Fatalf("second batch before Release: %v", err)
		}
		cp := r.Bytes(0)
		r.Release()
		r.Release()
		if r.Page(0) != nil || r.Bytes(0) != nil || cp == nil {
			t.Fatal("a released batch must read as empty")
		}
		if err := p.Close(); !errors.Is(err, ErrBusy) {
			t.Fatalf("Pool.Close with a Fetcher open: %v", err)
		}
		// A released view cannot be fetched.
		if _, err := f.Fetch(context.Background(), blocks[:1]); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Fetch of a released view: %v", err)
		}
		f.Close()
		f.Close()
		if _, err := f.Fetch(context.Background(), nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("Fetch after Close: %v", err)
		}
	}
}

// PROMISE: IO-3, GO-7
func TestFetchCanceled(t *testing.T) {
	s, _ := newTestStore(t, 1, 4)
	p := testPool(t)
	f, err := p.NewFetcher(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, _ := s.Prefix(seqTokens(0, 64))
	defer v.Release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = f.Fetch(ctx, []View{v.At(0), v.At(1), v.At(2), v.At(3)})
	if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Fetch: %v", err)
	}
	// The fetcher is usable again.
	r, err := f.Fetch(context.Background(), []View{v.At(1)})
	if err != nil || r.Err(0) != nil || !bytes.Equal(r.Page(0), v.At(1).Page()) {
		t.Fatalf("Fetch after cancel: %v", err)
	}
	r.Release()
}

func TestPoolCapacityAndMemlock(t *testing.T) {
	s, _ := newTestStore(t, 1, 4)
	o := DefaultPoolOptions()
	o.Bytes = 8192 // two pages' slots at most
	o.NoMlock, o.NoCUDA = true, true
	p, err := NewPool(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.Bytes != 8192 || info.Locked {
		t.Fatalf("Info %+v %v", info, err)
	}
	f, err := p.NewFetcher(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, _ := s.Prefix(seqTokens(0, 64))
	defer v.Release()
	if _, err := f.Fetch(context.Background(), []View{v.At(0), v.At(1), v.At(2), v.At(3)}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("batch larger than the pool: %v", err)
	}
}

// PROMISE: IO-2
func TestPoolMemlock(t *testing.T) {
	// A locked pool beyond RLIMIT_MEMLOCK: ErrMemlock (with CAP_IPC_LOCK
	// the lock may succeed; then the pool must say it is locked).
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(8 /* RLIMIT_MEMLOCK */, &lim); err != nil || lim.Cur >= 64<<20 {
		t.Skipf("RLIMIT_MEMLOCK %d allows the pool", lim.Cur)
	}
	o := DefaultPoolOptions()
	o.Bytes = 64 << 20
	o.NoCUDA = true
	big, err := NewPool(&o)
	if err == nil {
		info, _ := big.Info()
		big.Close()
		if !info.Locked {
			t.Fatal("pool created without its lock")
		}
		t.Skip("the lock succeeded beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK)")
	}
	var ke *Error
	if !errors.Is(err, ErrMemlock) || !errors.As(err, &ke) || !strings.Contains(strings.ToLower(ke.Message), "memlock") {
		t.Fatalf("locked pool beyond RLIMIT_MEMLOCK: %v", err)
	}
}

// PROMISE: GO-1, GO-6
func TestAttackFetcherMisuse(t *testing.T) {
	s, _ := newTestStore(t, 1, 2)
	toks := seqTokens(0, 2*16+5)
	p, err := NewPool(&PoolOptions{Bytes: 1 << 20, NUMANode: NodeAuto, GPU: -1, NoMlock: true, NoCUDA: true})
	if err != nil {
		t.Skip("NewPool:", err)
	}
	defer p.Close()
	f, err := p.NewFetcher(&FetchOptions{IOMode: IOPread})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Pool.Close with a Fetcher open: %v", err)
	}
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 2 {
		t.Fatal(err)
	}
	blocks := []View{v.At(0), v.At(1)}
	r, err := f.Fetch(context.Background(), blocks)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Fetch(context.Background(), blocks); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second Fetch before Release: %v", err)
	}
	v.Release() // the batch holds its own references
	s.Close()
	if !bytes.Equal(r.Page(1), pageOf(testGeom, toks, 1)) {
		t.Fatal("fetched page differs")
	}
	if _, err := f.Fetch(context.Background(), blocks); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Fetch of released views: %v", err)
	}
	f.Close()
	if r.Page(0) != nil || r.Bytes(1) != nil {
		t.Fatal("a batch of a closed Fetcher still answers")
	}
	r.Release()
	f.Close()
	if _, err := f.Fetch(context.Background(), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Fetch after Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.NewFetcher(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewFetcher on a closed pool: %v", err)
	}
}
