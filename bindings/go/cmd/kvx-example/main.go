// kvx-example opens (or creates) a kvx store, serves the cached prefix of a
// prompt zero-copy, fetches its pages into pinned memory, and warms the
// whole store up with progress: the three things a Go runtime embedding
// kvx does.
//
//	go run ./cmd/kvx-example -store /tmp/kvx-example
//
// With a store that does not exist yet, it creates one with a small demo
// geometry and puts a few prompts' blocks first.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"

	"kvx.dev/kvx"
)

var demo = kvx.Geometry{Layers: 2, KVHeads: 4, HeadDim: 64, BlockTokens: 16, Quant: kvx.QuantE4M3}

// prompt is a deterministic demo prompt of n tokens.
func prompt(seed, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(seed*1009+i*31) + 1
	}
	return t
}

func main() {
	dir := flag.String("store", "/tmp/kvx-example", "store directory (created when missing)")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "kvx-example:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	s, err := kvx.Open(dir, nil)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, kvx.ErrNotFound) {
		if s, err = create(dir); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	defer s.Close()
	g := s.Geometry()
	st, err := s.Stat()
	if err != nil {
		return err
	}
	fmt.Printf("store %s: %d blocks in %d shards, %s pages of %d bytes\n", dir, st.Blocks, st.Shards,
		g.Quant, g.PageBytes(g.BlockTokens))

	// Serve a prompt: its first 6 blocks were stored, then it goes on.
	p := append(prompt(1, 6*16), prompt(99, 40)...)
	v, err := s.Prefix(p) // one cgo call for every block
	if err != nil {
		return err
	}
	defer v.Release()
	fmt.Printf("prefix: %d of %d tokens cached (%d blocks)\n", v.Len()*int(g.BlockTokens), len(p), v.Len())
	if damage := v.StoppedAt(); damage != nil {
		fmt.Printf("  (a damaged block ended the prefix: %v)\n", damage)
	}
	blocks := make([]kvx.View, v.Len())
	for i := range blocks {
		blocks[i] = v.At(i)
		fmt.Printf("  block %d  coord %08x  hash %016x  page %d bytes (zero-copy)\n", i,
			uint32(blocks[i].Coordinate()), blocks[i].Hash(), len(blocks[i].Page()))
	}

	// Fetch those pages into pinned memory.
	po := kvx.DefaultPoolOptions()
	po.Bytes, po.NoMlock = 16<<20, true
	pool, err := kvx.NewPool(&po)
	if err != nil {
		return err
	}
	defer pool.Close()
	f, err := pool.NewFetcher(nil)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := f.Fetch(ctx, blocks)
	if err != nil {
		return err
	}
	for i := 0; i < r.Len(); i++ {
		if r.Err(i) != nil {
			return r.Err(i)
		}
	}
	fmt.Printf("fetched %d pages into pinned memory (%s)\n", r.Len(), f.Mode())
	r.Release()

	// Warm the whole store up, with progress.
	res, err := s.Warmup(ctx, nil, func(p kvx.WarmupProgress) {
		fmt.Printf("  warmup %d/%d pages, %d/%d bytes\n", p.PagesDone, p.PagesTotal, p.BytesDone, p.BytesTotal)
	})
	if err != nil {
		return err
	}
	fmt.Printf("warmup: %d pages, %d bytes, %.3f GB/s, %d CRC failures, %s\n", res.Pages, res.Bytes, res.GBps,
		res.CRCFailures, res.IOMode)
	return nil
}

func create(dir string) (*kvx.Store, error) {
	s, err := kvx.Create(dir, kvx.StoreOptions{Geometry: demo})
	if err != nil {
		return nil, err
	}
	pb := int(demo.PageBytes(demo.BlockTokens))
	for seed := 0; seed < 4; seed++ {
		t := prompt(seed, 8*16+3)
		pages := make([]byte, 8*pb)
		for i := range pages {
			pages[i] = byte(seed + i)
		}
		if _, err := s.Put(t, pages, nil); err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.Flush(); err != nil { // the acknowledgement
		s.Close()
		return nil, err
	}
	return s, nil
}
