// warmup.go - bulk warmup over the C data path: every page of whole shards
// (a store, shard files, or open shards) read in large sequential runs,
// CRC-checked, and delivered to a sink (discard, a host buffer, a GPU
// arena).
//
// The warmup runs on a C thread (kvx_warmup_start); Go polls it with
// bounded waits, reports progress from the calling goroutine, and cancels
// it when the context is done. A host sink is C memory (the C thread writes
// it after the call returns, so it must never be Go memory), exposed as
// zero-copy slices until Release.
package kvx

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// Sink is where warmed pages go.
type Sink int

const (
	SinkDiscard Sink = C.KVX_SINK_DISCARD // read and verify only
	SinkHost    Sink = C.KVX_SINK_HOST    // copy into a host buffer (WarmupResult.HostPage)
	SinkGPU     Sink = C.KVX_SINK_GPU     // upload into WarmupOptions.GPU's arena
)

// WarmupOptions configure a warmup (nil = DefaultWarmupOptions()).
type WarmupOptions struct {
	IOMode           IOMode
	NoVerify         bool   // skip page CRCs
	Buffered         bool   // never O_DIRECT
	QueueDepth       uint32 // 0 = 8
	ChunkBytes       uint32 // 0 = 4 MiB
	NUMANode         int    // staging node: NodeAuto or a node
	Sink             Sink
	GPU              *GPU          // SinkGPU: the arena
	ProgressInterval time.Duration // how often progress is called; 0 = 100 ms
}

// DefaultWarmupOptions are the library's (kvx_warmup_options_init):
// io_uring when allowed, verified, NodeAuto, discard sink.
func DefaultWarmupOptions() WarmupOptions {
	var c C.kvx_warmup_options
	C.kvx_warmup_options_init(&c)
	return WarmupOptions{IOMode: IOMode(c.io_mode), NoVerify: c.flags&C.KVX_WARMUP_NO_VERIFY != 0,
		Buffered: c.flags&C.KVX_WARMUP_BUFFERED != 0, QueueDepth: uint32(c.queue_depth),
		ChunkBytes: uint32(c.chunk_bytes), NUMANode: int(c.numa_node), Sink: Sink(c.sink)}
}

// WarmupProgress is a snapshot of a running warmup.
type WarmupProgress struct {
	BytesDone, BytesTotal uint64
	PagesDone, PagesTotal uint64
	CRCFailures           uint64
	Seconds               float64
	Finished              bool
}

// WarmupFailure names one page that was not delivered.
type WarmupFailure struct {
	Path  string // the shard file
	Shard int    // index into the inputs
	Entry uint32
	Err   *Error // ErrPageCRC, ErrTruncated, an OS error, ...
}

// WarmupResult is the report of a finished (or canceled) warmup, plus the
// host sink. Release frees the sink.
type WarmupResult struct {
	Bytes, Pages            uint64 // delivered good
	CRCFailures, IOFailures uint64
	BytesRead               uint64
	Seconds, GBps           float64
	IOMode                  IOMode
	Direct, Canceled        bool
	Checksum                uint64   // SinkDiscard: sum of the pages' CRC-32s
	GPUPageTable            uint64   // SinkGPU: device address of the page table
	DevicePages             []uint64 // SinkGPU: per-page device pointers (0 = failed)
	Failures                []WarmupFailure

	*warmupSink // shared by copies of the result: Release frees it once
}

// warmupSink is a SinkHost warmup's host buffer; it carries the
// finalizer, so a copy of the result still in use keeps it.
type warmupSink struct {
	mu      sync.Mutex
	host    unsafe.Pointer // C memory
	hostLen uint64
	pages   [][2]uint64 // per page (input order): sink offset, bytes
}

// HostPage is page k (input order: shards in order, entries by index) of a
// SinkHost warmup, zero-copy; valid until Release, nil after it. A page
// that failed is left zero.
func (r *WarmupResult) HostPage(k int) []byte {
	if r == nil || r.warmupSink == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.host == nil || k < 0 || k >= len(r.pages) {
		return nil
	}
	return cbytes(unsafe.Add(r.host, r.pages[k][0]), r.pages[k][1])
}

// NumPages is the number of pages of the inputs.
func (r *WarmupResult) NumPages() int {
	if r == nil || r.warmupSink == nil {
		return 0
	}
	return len(r.pages)
}

// Release frees the host sink. Idempotent.
func (r *WarmupResult) Release() {
	if r != nil && r.warmupSink != nil {
		r.warmupSink.release()
	}
}

func (w *warmupSink) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.host != nil {
		C.free(w.host)
		w.host = nil
		runtime.SetFinalizer(w, nil)
	}
}

// Warmup warms every live shard of the store (a snapshot taken now).
func (s *Store) Warmup(ctx context.Context, opts *WarmupOptions, progress func(WarmupProgress)) (*WarmupResult, error) {
	shards, err := s.Shards()
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, sh := range shards {
			sh.Close()
		}
	}()
	return WarmupShards(ctx, shards, opts, progress)
}

// WarmupPaths warms what `kvx warmup` names: a directory is a store (opened
// read-only, its live shards), anything else a shard file.
func WarmupPaths(ctx context.Context, paths []string, opts *WarmupOptions, progress func(WarmupProgress)) (*WarmupResult, error) {
	cp := make([]*C.char, len(paths)+1) // C pointers in Go memory: allowed
	defer func() {
		for _, p := range cp {
			C.free(unsafe.Pointer(p)) // free(NULL) for those not made
		}
	}()
	for i, p := range paths {
		c, err := cString(p, CodePath, "WarmupPaths: path")
		if err != nil {
			return nil, err
		}
		cp[i] = c
	}
	var arr **C.kvx_shard
	r := C.gokvx_warmup_collect(&arr, &cp[0], C.size_t(len(paths)))
	if err := check(r); err != nil {
		return nil, err
	}
	shards := adoptShards(arr, int(r.n))
	defer func() {
		for _, sh := range shards {
			sh.Close()
		}
	}()
	return WarmupShards(ctx, shards, opts, progress)
}

// WarmupShards warms open shards. progress (nullable) is called from this
// goroutine about every ProgressInterval and once at the end. A canceled
// context cancels the warmup: the result (Canceled set) comes back with an
// error matching ErrCanceled and ctx.Err(). Failed pages are reported in
// the result, not as the error.
func WarmupShards(ctx context.Context, shards []*Shard, opts *WarmupOptions, progress func(WarmupProgress)) (*WarmupResult, error) {
	o := DefaultWarmupOptions()
	if opts != nil {
		o = *opts
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 100 * time.Millisecond
	}
	// Hold every shard (read lock) for the duration of the start call;
	// the warmup then holds its own references.
	cs := make([]*C.kvx_shard, len(shards)+1)
	for i, sh := range shards {
		c, err := sh.acquire()
		if err != nil {
			for _, done := range shards[:i] {
				done.mu.RUnlock()
			}
			return nil, err
		}
		cs[i] = c
	}
	unlock := func() {
		for _, sh := range shards {
			sh.mu.RUnlock()
		}
	}
	res := &WarmupResult{warmupSink: &warmupSink{}}
	var co C.kvx_warmup_options
	C.kvx_warmup_options_init(&co) // the version, and fields this package does not set
	co.io_mode = C.int(o.IOMode)
	co.queue_depth = C.uint32_t(o.QueueDepth)
	co.chunk_bytes = C.uint32_t(o.ChunkBytes)
	co.numa_node = C.int(o.NUMANode)
	co.sink = C.int(o.Sink)
	co.flags = 0 // the options' bools below decide every flag
	if o.NoVerify {
		co.flags |= C.KVX_WARMUP_NO_VERIFY
	}
	if o.Buffered {
		co.flags |= C.KVX_WARMUP_BUFFERED
	}
	// Page layout of the sink: input order, each page at the next multiple
	// of 256 (the library's documented layout).
	var off uint64
	for _, c := range cs[:len(shards)] {
		n := uint32(C.kvx_shard_get_info(c).num_blocks)
		if n == 0 {
			continue
		}
		ce := make([]C.kvx_entry, n)
		if err := check(C.gokvx_shard_entries(&ce[0], c, 0, C.uint32_t(n))); err != nil {
			unlock()
			return nil, err
		}
		for _, e := range ce {
			off = (off + 255) &^ 255
			res.pages = append(res.pages, [2]uint64{off, uint64(e.bytes)})
			off += uint64(e.bytes)
		}
	}
	switch o.Sink {
	case SinkHost:
		r := C.gokvx_warmup_sink_bytes(&cs[0], C.size_t(len(shards)))
		if err := check(r); err != nil {
			unlock()
			return nil, err
		}
		res.host = C.gokvx_alloc_aligned(r.n)
		if res.host == nil {
			unlock()
			return nil, newError(-int(C.ENOMEM), "Warmup: host sink of "+u64s(uint64(r.n))+" bytes")
		}
		res.hostLen = uint64(r.n)
		runtime.SetFinalizer(res.warmupSink, (*warmupSink).release)
		co.host_buf = res.host
		co.host_buf_bytes = r.n
	case SinkGPU:
		if o.GPU == nil || o.GPU.gpuHandle == nil {
			unlock()
			return nil, newError(CodeInvalid, "Warmup: SinkGPU needs WarmupOptions.GPU")
		}
		o.GPU.mu.Lock()
		defer o.GPU.mu.Unlock() // the arena is the warmup's until it ends
		if o.GPU.c == nil {
			unlock()
			return nil, ErrClosed
		}
		co.gpu = o.GPU.c
	}
	var w *C.kvx_warmup
	r := C.gokvx_warmup_start(&w, &cs[0], C.size_t(len(shards)), &co)
	unlock()
	if err := check(r); err != nil {
		res.Release()
		return nil, err
	}
	defer C.kvx_warmup_destroy(w)

	var rep C.kvx_warmup_report
	var cause error
	last := time.Now()
	report := func() {
		if progress == nil {
			return
		}
		var p C.kvx_warmup_progress
		if C.kvx_warmup_get_progress(&p, w) == 0 {
			progress(WarmupProgress{BytesDone: uint64(p.bytes_done), BytesTotal: uint64(p.bytes_total),
				PagesDone: uint64(p.pages_done), PagesTotal: uint64(p.pages_total),
				CRCFailures: uint64(p.crc_failures), Seconds: float64(p.seconds), Finished: p.finished != 0})
		}
	}
	for {
		if cause == nil {
			select {
			case <-ctx.Done():
				cause = ctx.Err()
				C.kvx_warmup_cancel(w)
			default:
			}
		}
		wr := C.gokvx_warmup_wait(&rep, w, 20)
		if wr.rc == 0 {
			break
		}
		if wr.rc != -C.ETIMEDOUT {
			res.Release()
			return nil, check(wr)
		}
		if time.Since(last) >= o.ProgressInterval {
			report()
			last = time.Now()
		}
	}
	report()
	defer C.kvx_warmup_report_free(&rep)
	res.Bytes, res.Pages = uint64(rep.bytes), uint64(rep.pages)
	res.CRCFailures, res.IOFailures = uint64(rep.crc_failures), uint64(rep.io_failures)
	res.BytesRead, res.Seconds, res.GBps = uint64(rep.bytes_read), float64(rep.seconds), float64(rep.gbps)
	res.IOMode, res.Direct, res.Canceled = IOMode(rep.io_mode), rep.direct != 0, rep.canceled != 0
	res.Checksum, res.GPUPageTable = uint64(rep.checksum), uint64(rep.gpu_page_table)
	if rep.n_failures > 0 {
		for _, f := range unsafe.Slice(rep.failures, int(rep.n_failures)) {
			res.Failures = append(res.Failures, WarmupFailure{Path: C.GoString(f.path), Shard: int(f.shard),
				Entry: uint32(f.entry), Err: newError(int(f.code), "")})
		}
	}
	if o.Sink == SinkGPU {
		var dp *C.uint64_t
		r := C.gokvx_warmup_device_pages(&dp, w)
		if r.rc == 0 && dp != nil {
			res.DevicePages = append([]uint64(nil), unsafe.Slice((*uint64)(unsafe.Pointer(dp)), int(r.n))...)
		}
	}
	if cause != nil {
		return res, canceled(cause, "Warmup")
	}
	return res, nil
}
