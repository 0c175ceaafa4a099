package kvx

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

func TestWarmupStore(t *testing.T) {
	s, dir := newTestStore(t, 3, 4)
	// Expected pages in the sink's order: shards as the store lists them,
	// entries by index.
	shards, err := s.Shards()
	if err != nil {
		t.Fatal(err)
	}
	var want [][]byte
	var sum uint64
	for _, sh := range shards {
		es, err := sh.Entries()
		if err != nil {
			t.Fatal(err)
		}
		for i := range es {
			p, err := sh.Page(uint32(i), true)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, append([]byte(nil), p...))
			sum += uint64(CRC32(0, p))
		}
		sh.Close()
	}
	if len(want) != 12 {
		t.Fatalf("%d pages in the store", len(want))
	}

	var calls int
	var last WarmupProgress
	res, err := s.Warmup(context.Background(), nil, func(p WarmupProgress) { calls++; last = p })
	if err != nil {
		t.Fatal(err)
	}
	if res.Pages != 12 || res.Bytes != 12*1024 || res.CRCFailures != 0 || res.Checksum != sum || res.Canceled {
		t.Fatalf("discard warmup %+v (checksum want %d)", res, sum)
	}
	if calls == 0 || !last.Finished || last.PagesDone != 12 || last.PagesTotal != 12 {
		t.Fatalf("progress: %d calls, last %+v", calls, last)
	}

	o := DefaultWarmupOptions()
	o.Sink = SinkHost
	o.IOMode = IOPread
	res, err = s.Warmup(context.Background(), &o, nil)
	if err != nil || res.NumPages() != 12 || res.Pages != 12 {
		t.Fatalf("host warmup: %v", err)
	}
	for k := range want {
		if !bytes.Equal(res.HostPage(k), want[k]) {
			t.Fatalf("host page %d differs", k)
		}
	}
	res.Release()
	res.Release()
	if res.HostPage(0) != nil {
		t.Fatal("host page after Release")
	}

	// The same through paths (a store directory, read-only).
	s.Close()
	res, err = WarmupPaths(context.Background(), []string{dir}, nil, nil)
	if err != nil || res.Pages != 12 || res.Checksum != sum {
		t.Fatalf("WarmupPaths: %+v %v", res, err)
	}
	if _, err := s.Warmup(context.Background(), nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Warmup of a closed store: %v", err)
	}
}

// PROMISE: IO-11
func TestWarmupDamagedAndCanceled(t *testing.T) {
	s, _ := newTestStore(t, 1, 3)
	path, data := copyShard(t, s)
	_, entries, err := Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	data[entries[2].Offset] ^= 1
	writeFile(t, path, data)
	res, err := WarmupPaths(context.Background(), []string{path}, nil, nil)
	if err != nil {
		t.Fatalf("a damaged page is reported, not fatal: %v", err)
	}
	if res.Pages != 2 || res.CRCFailures != 1 || len(res.Failures) != 1 || res.Failures[0].Entry != 2 ||
		res.Failures[0].Path != path || !errors.Is(res.Failures[0].Err, ErrPageCRC) {
		t.Fatalf("damaged warmup %+v", res)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err = WarmupPaths(ctx, []string{path}, nil, nil)
	if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) || res == nil {
		t.Fatalf("canceled warmup: %v", err)
	}
	if _, err := WarmupPaths(context.Background(), []string{path + ".missing"}, nil, nil); err == nil {
		t.Fatal("warmup of a missing file")
	}
}

func TestWarmupGPU(t *testing.T) {
	n, err := GPUCount()
	if errors.Is(err, ErrNoGPU) || (err == nil && n == 0) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newTestStore(t, 2, 4)
	g, err := NewGPU(0, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	o := DefaultWarmupOptions()
	o.Sink = SinkGPU
	o.GPU = g
	res, err := s.Warmup(context.Background(), &o, nil)
	if err != nil || res.Pages != 8 || len(res.DevicePages) != 8 || res.GPUPageTable == 0 {
		t.Fatalf("GPU warmup %+v %v", res, err)
	}
	shards, _ := s.Shards()
	k := 0
	for _, sh := range shards {
		info := sh.Info()
		for i := uint32(0); i < info.NumBlocks; i++ {
			p, _ := sh.Page(i, false)
			back := make([]byte, len(p))
			if err := g.CopyBack(back, res.DevicePages[k]); err != nil || !bytes.Equal(back, p) {
				t.Fatalf("device page %d: %v", k, err)
			}
			k++
		}
		sh.Close()
	}
}
