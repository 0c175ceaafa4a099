// attack_test.go - hostile use of the Go binding: nil and zero-value
// handles, double and concurrent Close, Close racing lookups and batch
// writes, finalizers, released and foreign views, slices of the wrong
// length, paths with NUL bytes or naming a FIFO. Each check asserts the
// binding's answer (a distinct error, or the right bytes); none may panic
// or crash. Run it also with -race and GODEBUG=cgocheck=2 (README.md).
package kvx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
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
	}
}

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
	// the zero Store (never opened) holds no C handle: every call that
	// would reach C is ErrClosed, the others fail on the zero geometry
	zero := &Store{}
	for name, f := range storeCalls(zero) {
		err := f()
		switch name {
		case "Prefix": // no full block of a zero geometry: an empty prefix
			if err != nil {
				t.Errorf("zero Store Prefix: %v", err)
			}
		case "GetBlock":
			if !errors.Is(err, ErrTokens) {
				t.Errorf("zero Store GetBlock: %v, want ErrTokens", err)
			}
		case "Put":
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("zero Store Put: %v, want ErrInvalid", err)
			}
		default:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("zero Store %s: %v, want ErrClosed", name, err)
			}
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

func TestAttackViewsMisuse(t *testing.T) {
	s, _ := newTestStore(t, 1, 3)
	toks := seqTokens(0, 3*16+5)
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 3 {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("At(Len()) did not panic")
			}
		}()
		v.At(3)
	}()
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ { // a concurrent double Release frees once
		wg.Add(1)
		go func() { defer wg.Done(); v.Release() }()
	}
	wg.Wait()
	if _, err := s.Export(v, EnvelopeV1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Export of released views: %v", err)
	}
	if env, err := s.Export(nil, EnvelopeV1); err != nil || len(env) != EnvelopeHeaderBytes+4 {
		t.Fatalf("Export(nil): %d bytes, %v", len(env), err)
	}
	if _, err := s.Export(nil, 77); !errors.Is(err, ErrVersion) {
		t.Fatalf("Export version 77: %v", err)
	}
	// GetHashes misses: a Views with holes, exported (refused) and released
	hs := BlockHashes(toks, 16)
	g, errs, err := s.GetHashes([]uint64{hs[0], 12345, hs[2]})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], ErrNotFound) || errs[2] != nil {
		t.Fatalf("GetHashes: %v %v", errs, err)
	}
	if g.At(1).Found() || g.At(1).Page() != nil {
		t.Fatal("a miss has a page")
	}
	if _, err := s.Export(g, EnvelopeV1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Export with a miss: %v", err)
	}
	g.Release()
	// views of another store's geometry: ErrShape, never read at this size
	other, err := Create(t.TempDir()+"/o", StoreOptions{Geometry: Geometry{Layers: 2, KVHeads: 2, HeadDim: 8,
		BlockTokens: 16, Quant: QuantFP16, ModelSignature: 0x1234}, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ot := seqTokens(5, 16)
	if _, err := other.Put(ot, make([]byte, other.Geometry().PageBytes(16)), nil); err != nil {
		t.Fatal(err)
	}
	other.Flush()
	ov, err := other.Prefix(ot)
	if err != nil || ov.Len() != 1 {
		t.Fatal(err)
	}
	if _, err := s.Export(ov, EnvelopeV1); !errors.Is(err, ErrShape) || errors.Is(err, ErrModel) {
		t.Fatalf("Export of a foreign view: %v", err)
	}
	ov.Release()
	// the same shape, another model: ErrModel (was the shim's ErrShape)
	mg := testGeom
	mg.ModelSignature = 0x9999
	other2, err := Create(t.TempDir()+"/m", StoreOptions{Geometry: mg, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other2.Close()
	if _, err := other2.Put(ot, pagesFor(mg, ot), nil); err != nil {
		t.Fatal(err)
	}
	other2.Flush()
	mv, err := other2.Prefix(ot)
	if err != nil || mv.Len() != 1 {
		t.Fatal(err)
	}
	if _, err := s.Export(mv, EnvelopeV1); !errors.Is(err, ErrModel) {
		t.Fatalf("Export of another model's view: %v, want ErrModel", err)
	}
	mv.Release()
}

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

func TestAttackShardAfterClose(t *testing.T) {
	s, _ := newTestStore(t, 1, 2)
	sh, err := s.Shards()
	if err != nil || len(sh) == 0 {
		t.Fatal(err)
	}
	p, err := sh[0].Page(0, true)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), p...)
	s.Close()
	if q, err := sh[0].Page(0, true); err != nil || !bytes.Equal(q, want) {
		t.Fatalf("shard page after Store.Close: %v", err)
	}
	if _, err := sh[0].Page(1<<30, false); err == nil {
		t.Fatal("Page out of range")
	}
	if _, err := sh[0].Entry(1 << 30); err == nil {
		t.Fatal("Entry out of range")
	}
	for _, x := range sh {
		x.Close()
		x.Close()
	}
	if _, err := sh[0].Page(0, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("Page after Close: %v", err)
	}
	if sh[0].Path() != "" || sh[0].Info().NumBlocks != 0 {
		t.Fatal("a closed shard answers")
	}
}

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
