// fetch.go - the data path: a pinned buffer pool, batched page fetches
// into it, and (CUDA builds) a GPU arena.
//
// Pages fetched land in C-owned pinned memory (C never sees Go memory
// beyond a call, which cgo requires of asynchronous I/O). A fetch is one
// crossing to submit, then a poll loop of bounded waits (a few ms each, in
// C) between which the context is checked: cancellation calls
// kvx_fetch_cancel and drains, with no C -> Go callback.
package kvx

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sort"
	"sync"
	"unsafe"
)

// NodeAuto places memory on the GPU's NUMA node when known, else on the
// calling thread's.
const NodeAuto = int(C.KVX_POOL_NODE_AUTO)

// PoolOptions configure a pinned pool. Use DefaultPoolOptions and change
// what you need (the zero value means NUMA node 0).
type PoolOptions struct {
	Bytes      uint64 // rounded up to 4096; 0 = 64 MiB
	NUMANode   int    // NodeAuto or a node
	GPU        int    // CUDA device for registration; -1 = none
	NoMlock    bool   // do not mlock (RLIMIT_MEMLOCK is often small)
	NoCUDA     bool   // do not cudaHostRegister
	NoRegister bool   // fetches use plain reads, not io_uring fixed buffers
}

// DefaultPoolOptions are the library's (kvx_pool_options_init): 64 MiB
// (Bytes 0), NodeAuto, GPU 0, locked.
func DefaultPoolOptions() PoolOptions {
	var c C.kvx_pool_options
	C.kvx_pool_options_init(&c)
	return PoolOptions{Bytes: uint64(c.bytes), NUMANode: int(c.numa_node), GPU: int(c.gpu),
		NoMlock: c.flags&C.KVX_POOL_NO_MLOCK != 0, NoCUDA: c.flags&C.KVX_POOL_NO_CUDA != 0,
		NoRegister: c.flags&C.KVX_POOL_NO_REGISTER != 0}
}

// PoolInfo describes a pool.
type PoolInfo struct {
	Bytes, FreeBytes uint64
	NUMANode         int
	Locked           bool
	CUDARegistered   bool
}

// Pool is a pinned, NUMA-placed buffer pool that fetches land in. Close it
// after its Fetchers (Close refuses with ErrBusy while any is open). A
// copy of a Pool value is the same pool.
type Pool struct{ *poolHandle }

// poolHandle is shared by copies of a Pool, and carries the finalizer.
type poolHandle struct {
	mu       sync.Mutex
	c        *C.kvx_pool
	fetchers int
}

// NewPool creates a pool (nil = DefaultPoolOptions()). ErrMemlock when
// RLIMIT_MEMLOCK refuses the lock (the message gives the limit).
func NewPool(opts *PoolOptions) (*Pool, error) {
	o := DefaultPoolOptions()
	if opts != nil {
		o = *opts
	}
	var co C.kvx_pool_options
	C.kvx_pool_options_init(&co) // the version, and fields this package does not set
	co.bytes = C.uint64_t(o.Bytes)
	co.numa_node = C.int(o.NUMANode)
	co.gpu = C.int(o.GPU)
	co.flags = 0 // the options' bools below decide every flag
	if o.NoMlock {
		co.flags |= C.KVX_POOL_NO_MLOCK
	}
	if o.NoCUDA {
		co.flags |= C.KVX_POOL_NO_CUDA
	}
	if o.NoRegister {
		co.flags |= C.KVX_POOL_NO_REGISTER
	}
	var cp *C.kvx_pool
	if err := check(C.gokvx_pool_create(&cp, &co)); err != nil {
		return nil, err
	}
	p := &Pool{&poolHandle{c: cp}}
	runtime.SetFinalizer(p.poolHandle, func(h *poolHandle) { (&Pool{h}).Close() }) //nolint:errcheck
	return p, nil
}

// Info describes the pool.
func (p *Pool) Info() (PoolInfo, error) {
	if p == nil || p.poolHandle == nil {
		return PoolInfo{}, ErrClosed
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil {
		return PoolInfo{}, ErrClosed
	}
	var i C.kvx_pool_info
	if err := check(C.gokvx_pool_info(&i, p.c)); err != nil {
		return PoolInfo{}, err
	}
	return PoolInfo{Bytes: uint64(i.bytes), FreeBytes: uint64(i.free_bytes), NUMANode: int(i.numa_node),
		Locked: i.locked != 0, CUDARegistered: i.cuda_registered != 0}, nil
}

// Close frees the pool: ErrBusy while Fetchers created on it are open.
// Idempotent.
func (p *Pool) Close() error {
	if p == nil || p.poolHandle == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil {
		return nil
	}
	if p.fetchers > 0 {
		return newError(CodeBusy, "Pool.Close: "+u64s(uint64(p.fetchers))+" Fetcher(s) still open")
	}
	C.kvx_pool_destroy(p.c)
	p.c = nil
	runtime.SetFinalizer(p.poolHandle, nil)
	return nil
}

// IOMode is the read path of a fetch or warmup.
type IOMode int

const (
	IOAuto  IOMode = C.KVX_IO_AUTO  // io_uring, else the pread fallback
	IOUring IOMode = C.KVX_IO_URING // io_uring only
	IOPread IOMode = C.KVX_IO_PREAD // buffered pread from a thread pool
)

func (m IOMode) String() string { return C.GoString(C.kvx_io_mode_name(C.int(m))) }

// FetchOptions configure a Fetcher (zero value: io_uring when allowed,
// library defaults, CRC checked).
type FetchOptions struct {
	IOMode       IOMode
	QueueDepth   uint32 // 0 = 64
	Threads      uint32 // pread workers; 0 = 4
	MaxReadBytes uint32 // coalescing cap; 0 = 4 MiB
	NoVerify     bool   // skip the per-page CRC check
	Buffered     bool   // never O_DIRECT
}

// Fetcher reads batches of pages into its pool. One batch at a time: a
// Fetch while the previous *Fetched is not released fails with ErrBusy
// (use several Fetchers on one pool to pipeline). Safe for concurrent use
// (calls are serialized). A copy of a Fetcher value is the same fetcher.
type Fetcher struct{ *fetcherHandle }

// fetcherHandle is shared by copies of a Fetcher, and carries the
// finalizer.
type fetcherHandle struct {
	mu   sync.Mutex
	c    *C.kvx_fetch
	pool *Pool
	cur  *fetchedBatch // the batch not yet released
}

// NewFetcher creates a fetcher on the pool.
func (p *Pool) NewFetcher(opts *FetchOptions) (*Fetcher, error) {
	if p == nil || p.poolHandle == nil {
		return nil, ErrClosed
	}
	var co C.kvx_fetch_options
	C.kvx_fetch_options_init(&co) // nil opts: the library's defaults as they are
	if opts != nil {
		o := *opts
		co.io_mode = C.int(o.IOMode)
		co.queue_depth = C.uint32_t(o.QueueDepth)
		co.threads = C.uint32_t(o.Threads)
		co.max_read_bytes = C.uint32_t(o.MaxReadBytes)
		co.flags = 0 // the options' bools below decide every flag
		if o.NoVerify {
			co.flags |= C.KVX_FETCH_NO_VERIFY
		}
		if o.Buffered {
			co.flags |= C.KVX_FETCH_BUFFERED
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil {
		return nil, ErrClosed
	}
	var cf *C.kvx_fetch
	if err := check(C.gokvx_fetch_create(&cf, p.c, &co)); err != nil {
		return nil, err
	}
	p.fetchers++
	f := &Fetcher{&fetcherHandle{c: cf, pool: p}}
	runtime.SetFinalizer(f.fetcherHandle, func(h *fetcherHandle) { (&Fetcher{h}).Close() }) //nolint:errcheck
	return f, nil
}

// Mode is the read path in use (IOUring or IOPread).
func (f *Fetcher) Mode() IOMode {
	if f == nil || f.fetcherHandle == nil {
		return IOAuto
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.c == nil {
		return IOAuto
	}
	return IOMode(C.kvx_fetch_mode(f.c))
}

// Close releases the current batch (if any) and frees the fetcher.
// Idempotent.
func (f *Fetcher) Close() error {
	if f == nil || f.fetcherHandle == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.c == nil {
		return nil
	}
	if cur := f.cur; cur != nil {
		cur.rw.Lock() // waits for the accessor calls in flight
		cur.released = true
		cur.rw.Unlock()
		f.cur = nil
	}
	C.kvx_fetch_destroy(f.c)
	f.c = nil
	runtime.SetFinalizer(f.fetcherHandle, nil)
	f.pool.mu.Lock()
	f.pool.fetchers--
	f.pool.mu.Unlock()
	return nil
}

// pollMs bounds each wait in C, so a canceled context is noticed quickly.
const pollMs = 5

// Fetch reads the pages of blocks (views from the store, not released)
// into pinned memory: one crossing to submit, bounded waits in C between
// context checks. Per-page failures (ErrPageCRC, ErrTruncated, -EIO) are
// in the result's Err(i), not the error. A canceled context cancels the
// reads, drains them, and returns an error matching ErrCanceled and
// ctx.Err(). Views may be released once Fetch returns (the batch holds
// its own shard references).
func (f *Fetcher) Fetch(ctx context.Context, blocks []View) (*Fetched, error) {
	if f == nil || f.fetcherHandle == nil {
		return nil, ErrClosed
	}
	for i, b := range blocks {
		if b.v == nil || b.v.viewSet == nil { // the zero View: a miss
			return nil, newError(CodeInvalid, "Fetch: block "+u64s(uint64(i))+" is released or a miss")
		}
		if b.v.released.Load() { // said before ErrBusy; the hold below decides
			return nil, newError(CodeInvalid, "Fetch: block "+u64s(uint64(i))+" is released")
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.c == nil {
		return nil, ErrClosed
	}
	if f.cur != nil {
		return nil, newError(CodeBusy, "Fetch: the previous batch of this Fetcher is not released")
	}
	// Every Views the blocks come from is held until the batch has taken
	// its own shard references (the submit): a concurrent Release waits
	// for that, not for the reads. The sets are held in one global order
	// (their addresses: Go does not move heap objects), so two Fetches
	// sharing Views in opposite orders cannot each hold one and wait for
	// the other behind a pending Release.
	var held []*viewSet
	for _, b := range blocks {
		if !holding(held, b.v.viewSet) {
			held = append(held, b.v.viewSet)
		}
	}
	sort.Slice(held, func(i, j int) bool {
		return uintptr(unsafe.Pointer(held[i])) < uintptr(unsafe.Pointer(held[j]))
	})
	nheld := 0
	unhold := func() {
		for _, v := range held[:nheld] {
			v.mu.RUnlock()
		}
		nheld = 0
	}
	defer unhold()
	for _, set := range held {
		if !set.hold() {
			for i, b := range blocks {
				if b.v.viewSet == set {
					return nil, newError(CodeInvalid, "Fetch: block "+u64s(uint64(i))+" is released")
				}
			}
		}
		nheld++
	}
	reqs := make([]C.kvx_fetch_req, len(blocks))
	for i, b := range blocks {
		c := &b.v.c[b.i]
		if c.shard == nil {
			return nil, newError(CodeInvalid, "Fetch: block "+u64s(uint64(i))+" is a miss")
		}
		reqs[i] = C.kvx_fetch_req{shard: c.shard, entry: c.entry}
	}
	if len(reqs) == 0 {
		if err := ctx.Err(); err != nil {
			return nil, canceled(err, "Fetch")
		}
		r := &Fetched{&fetchedBatch{f: f.fetcherHandle}}
		f.cur = r.fetchedBatch
		return r, nil
	}
	if err := check(C.gokvx_fetch_submit(f.c, &reqs[0], C.size_t(len(reqs)))); err != nil {
		return nil, err
	}
	// blocks' shard references are now the batch's own; keep the views
	// held and alive until here.
	unhold()
	runtime.KeepAlive(blocks)
	res := make([]C.kvx_fetch_result, len(reqs))
	var cause error
	for {
		if cause == nil {
			select {
			case <-ctx.Done():
				cause = ctx.Err()
				C.kvx_fetch_cancel(f.c) // no new reads; wait drains the rest
			default:
			}
		}
		r := C.gokvx_fetch_wait(f.c, &res[0], C.size_t(len(res)), pollMs)
		if r.rc == 0 {
			break
		}
		if r.rc != -C.ETIMEDOUT {
			C.kvx_fetch_release(f.c)
			return nil, check(r)
		}
	}
	if cause != nil {
		C.kvx_fetch_release(f.c)
		return nil, canceled(cause, "Fetch")
	}
	out := &Fetched{&fetchedBatch{f: f.fetcherHandle, res: res}}
	f.cur = out.fetchedBatch
	return out, nil
}

// holding reports whether set is among held (a batch's blocks usually
// come from one or a few Views).
func holding(held []*viewSet, set *viewSet) bool {
	for i := len(held) - 1; i >= 0; i-- {
		if held[i] == set {
			return true
		}
	}
	return false
}

// Fetched is a batch of pages in pinned pool memory, valid until Release
// (or the Fetcher's Close). As for Views, every accessor call is safe
// against a concurrent Release or Close: the call holds the batch while it
// reads it, Release and Close wait for the calls in flight, and a call
// after them returns nil. A zero-copy Page already returned is the
// caller's to stop using before Release. A copy of a Fetched value is the
// same batch: after Release on either, neither serves a page.
type Fetched struct{ *fetchedBatch }

// fetchedBatch is shared by copies of a Fetched.
type fetchedBatch struct {
	f   *fetcherHandle
	res []C.kvx_fetch_result // Go memory: status and CRC stay readable
	// rw: accessors hold it shared while they read the pages; Release and
	// the Fetcher's Close hold it exclusively (after f.mu: the order is
	// always f.mu, then rw) to set released and give the pages back.
	rw       sync.RWMutex
	released bool
}

// Len is the number of pages.
func (r *Fetched) Len() int {
	if r == nil || r.fetchedBatch == nil {
		return 0
	}
	return len(r.res)
}

// hold is page i with the batch held (the caller ends with r.unhold()),
// or nil, holding nothing, when it failed or after Release.
func (r *Fetched) hold(i int) []byte {
	x := &r.res[i] // panics out of range, before any lock
	r.rw.RLock()
	if r.released || x.status != 0 {
		r.rw.RUnlock()
		return nil
	}
	return cbytes(x.page, uint64(x.bytes))
}

func (r *Fetched) unhold() {
	r.rw.RUnlock()
	runtime.KeepAlive(r)
}

// Page is page i, zero-copy in pinned memory (nil if it failed or after
// Release). The slice is the caller's to stop using before Release; keep r
// reachable while the page is used (Release it after, or
// runtime.KeepAlive): a Fetcher left unreachable with it is closed by its
// finalizer. Bytes and CopyTo need no such care.
func (r *Fetched) Page(i int) []byte {
	p := r.hold(i)
	if p == nil {
		return nil
	}
	r.unhold()
	return p
}

// Err is page i's failure: nil, ErrPageCRC, ErrTruncated, ErrNotFound, or
// an OS error.
func (r *Fetched) Err(i int) error {
	if st := int(r.res[i].status); st != 0 {
		return newError(st, "page "+u64s(uint64(i))+" of the batch")
	}
	return nil
}

// CRC32 is the CRC-32 computed over page i as it landed (0 with NoVerify).
func (r *Fetched) CRC32(i int) uint32 { return uint32(r.res[i].crc32) }

// Bytes is a copy of page i (nil if it failed or after Release), made with
// the batch held: a concurrent Release or Close waits for the copy. r is
// kept reachable to the end of the copy (runtime.KeepAlive, in unhold): it
// holds the Fetcher, whose finalizer would otherwise close it.
func (r *Fetched) Bytes(i int) []byte {
	p := r.hold(i)
	if p == nil {
		return nil
	}
	defer r.unhold()
	if testHookCopy != nil {
		testHookCopy()
	}
	return append([]byte(nil), p...)
}

// CopyTo copies page i into dst; returns the bytes copied (0 if it failed
// or after Release), with the batch held as Bytes.
func (r *Fetched) CopyTo(i int, dst []byte) int {
	p := r.hold(i)
	if p == nil {
		return 0
	}
	defer r.unhold()
	if testHookCopy != nil {
		testHookCopy()
	}
	return copy(dst, p)
}

// Release returns the pages to the pool; their slices become invalid and
// the Fetcher takes its next batch. Idempotent.
func (r *Fetched) Release() {
	if r == nil || r.fetchedBatch == nil {
		return
	}
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	r.rw.Lock() // waits for the accessor calls in flight
	defer r.rw.Unlock()
	if r.released {
		return
	}
	r.released = true
	if f.cur == r.fetchedBatch {
		f.cur = nil
		if f.c != nil && len(r.res) > 0 {
			C.kvx_fetch_release(f.c)
		}
	}
}

// GPUCount is the number of usable GPUs (ErrNoCUDA in a build without
// CUDA).
func GPUCount() (int, error) {
	r := C.gokvx_gpu_count()
	return int(r.n), check(r)
}

// GPU is a device arena that a warmup can upload into (CUDA builds).
// A copy of a GPU value is the same arena.
type GPU struct{ *gpuHandle }

// gpuHandle is shared by copies of a GPU, and carries the finalizer.
type gpuHandle struct {
	mu sync.Mutex
	c  *C.kvx_gpu
}

// NewGPU creates an arena of arenaBytes (0 = 256 MiB) on device.
// ErrNoCUDA / ErrNoGPU where there is none.
func NewGPU(device int, arenaBytes uint64) (*GPU, error) {
	var co C.kvx_gpu_options
	C.kvx_gpu_options_init(&co) // the version; streams 0 = the library's default
	co.device = C.int(device)
	co.arena_bytes = C.uint64_t(arenaBytes)
	var cg *C.kvx_gpu
	if err := check(C.gokvx_gpu_create(&cg, &co)); err != nil {
		return nil, err
	}
	g := &GPU{&gpuHandle{c: cg}}
	runtime.SetFinalizer(g.gpuHandle, func(h *gpuHandle) { (&GPU{h}).Close() }) //nolint:errcheck
	return g, nil
}

// CopyBack copies bytes at device address dev into dst (verification).
func (g *GPU) CopyBack(dst []byte, dev uint64) error {
	if g == nil || g.gpuHandle == nil {
		return ErrClosed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.c == nil {
		return ErrClosed
	}
	if len(dst) == 0 {
		return nil
	}
	// dst is Go memory used only during this synchronous call.
	return check(C.gokvx_gpu_copy_back(unsafe.Pointer(&dst[0]), g.c, C.uint64_t(dev), C.uint64_t(len(dst))))
}

// Close frees the arena. Idempotent.
func (g *GPU) Close() error {
	if g == nil || g.gpuHandle == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.c != nil {
		C.kvx_gpu_destroy(g.c)
		g.c = nil
		runtime.SetFinalizer(g.gpuHandle, nil)
	}
	return nil
}
