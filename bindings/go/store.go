// store.go - the store: a persistent prefix cache indexed in LMDB.
//
// Lookups (Prefix, GetBlock, Get, GetHash, GetHashes) and Export are one
// cgo crossing per call whatever the number of blocks: the C call fills a
// C-allocated array of kvx_view, and the returned *Views reads that array
// in place, so building the result costs no per-block Go work. (A Go array
// would be legal too, as it holds only C pointers, but cgo's pointer check
// would scan every view at each call: 14% of a 64-block prefix.) Release
// frees it in the same crossing that drops the shard references. Lookups
// run concurrently (the C store is thread-safe for them); writers (Put,
// PutEnvelope, Flush, GC, Reindex) are serialized by a mutex. Close waits
// for calls in flight (a read-write lock) and is idempotent.
package kvx

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// tierC fills co's tier fields with C strings; the func returned frees
// them (also on an error: a URL or tenant with a NUL byte).
func tierC(co *C.kvx_store_options, url, tenant string, ttl time.Duration) (func(), error) {
	var frees []unsafe.Pointer
	free := func() {
		for _, p := range frees {
			C.free(p)
		}
	}
	if url != "" {
		u, err := cString(url, CodeInvalid, "TierURL")
		if err != nil {
			return free, err
		}
		frees = append(frees, unsafe.Pointer(u))
		co.tier_url = u
	}
	if tenant != "" {
		t, err := cString(tenant, CodeInvalid, "TierTenant")
		if err != nil {
			return free, err
		}
		frees = append(frees, unsafe.Pointer(t))
		co.tier_tenant = t
	}
	if ttl > 0 {
		co.tier_ttl_ms = C.uint64_t(ttl / time.Millisecond)
	}
	return free, nil
}

// StoreOptions are the fixed settings of a new store.
type StoreOptions struct {
	Geometry      Geometry // BlockTokens must be set: blocks are named by chained hash
	CapacityBytes uint64   // 0 = the library's default
	ShardBytes    uint64   // target sealed shard size; 0 = capacity/64 clamped
	NoWait        bool     // a second writer gets ErrBusy at once instead of waiting
	Verify        bool     // check shard meta CRCs at open and each served page's CRC
	NoSync        bool     // tests and benchmarks only: LMDB commits without fsync
	// Holes: this writer evicts cold blocks one at a time in place (a free
	// log record, then the page's extent punched: docs/STORE.md "Holes")
	// instead of whole shards and carries.
	Holes bool
	// The shared tier (docs/TIER.md), written to DIR/TIER: "" = none.
	TierURL    string        // redis://[user[:pass]@]host:port[,host:port...]
	TierTenant string        // namespace salt; "" = none
	TierTTL    time.Duration // TTL of the values written; 0 = none
}

// OpenOptions are the settings of Open (nil = read-write, waiting for the
// writer lock, no expectations).
type OpenOptions struct {
	ReadOnly bool      // lookups only, no writer lock
	NoWait   bool      // ErrBusy at once when another writer holds the store
	Verify   bool      // check meta CRCs now and each served page's CRC
	NoSync   bool      // tests and benchmarks only
	Holes    bool      // a writer: eviction in place (StoreOptions.Holes)
	Expect   *Geometry // nil, or a geometry that must match (ErrShape / ErrModel)
	// The shared tier for this handle only, instead of DIR/TIER's: "" =
	// DIR/TIER's, "off" = none (docs/TIER.md).
	TierURL    string
	TierTenant string
	TierTTL    time.Duration
}

// Store is an open store directory. Safe for concurrent use. A copy of a
// Store value is the same open store (the handle is shared, as with
// os.File): closing either closes both, once.
type Store struct {
	*storeHandle
	geom Geometry
}

// storeHandle is the C store and its locks, shared by copies of a Store;
// the finalizer is on it, so a copy still in use keeps the store open.
type storeHandle struct {
	mu  sync.RWMutex // read: any call on c; write: Close
	wmu sync.Mutex   // serializes writers
	c   *C.kvx_store
}

// Stats are a store's counters.
type Stats struct {
	Blocks, Bytes, Shards, CapacityBytes      uint64
	Hits, Misses, Evictions, EvictedBlocks    uint64
	Compactions, PendingBlocks, DroppedShards uint64
	ShardBytes                                uint64
	// Files in DIR/quarantine/ and their bytes (counted in the capacity).
	Quarantined, QuarantineBytes uint64
	// Pages freed in place (Holes) in live shards: Bytes counts them, the
	// disk and the capacity do not.
	FreedBytes uint64
	// The shared tier, this handle's counts (docs/TIER.md).
	TierHits, TierMisses, TierErrors, TierBad uint64
	TierReplaced, TierWrites                  uint64
	TierBytesUp, TierBytesDown                uint64
	TierUp                                    bool
}

func storeFlags(noWait, verify, noSync, readOnly, holes bool) C.uint32_t {
	var f C.uint32_t
	if holes {
		f |= C.KVX_STORE_HOLES
	}
	if readOnly {
		f |= C.KVX_STORE_READONLY
	}
	if noWait {
		f |= C.KVX_STORE_NOWAIT
	}
	if verify {
		f |= C.KVX_STORE_VERIFY
	}
	if noSync {
		f |= C.KVX_STORE_NOSYNC
	}
	return f
}

// Create makes a new store directory (0700) with a fixed geometry.
func Create(dir string, opts StoreOptions) (*Store, error) {
	var co C.kvx_store_options
	C.kvx_store_options_init(&co) // the version; 0 sizes = the library's defaults
	co.geometry = opts.Geometry.c()
	co.capacity_bytes = C.uint64_t(opts.CapacityBytes)
	co.flags = storeFlags(opts.NoWait, opts.Verify, opts.NoSync, false, opts.Holes)
	co.shard_bytes = C.uint64_t(opts.ShardBytes)
	freeTier, err := tierC(&co, opts.TierURL, opts.TierTenant, opts.TierTTL)
	defer freeTier()
	if err != nil {
		return nil, err
	}
	cdir, err := cString(dir, CodePath, "Create: dir")
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cdir))
	var cs *C.kvx_store
	if err := check(C.gokvx_store_create(&cs, cdir, &co)); err != nil {
		return nil, err
	}
	return newStore(cs), nil
}

// Open opens an existing store and runs its recovery.
func Open(dir string, opts *OpenOptions) (*Store, error) {
	var o OpenOptions
	if opts != nil {
		o = *opts
	}
	cdir, err := cString(dir, CodePath, "Open: dir")
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cdir))
	var expect *C.kvx_geometry
	if o.Expect != nil {
		g := o.Expect.c()
		expect = (*C.kvx_geometry)(C.malloc(C.size_t(unsafe.Sizeof(g))))
		*expect = g
		defer C.free(unsafe.Pointer(expect))
	}
	var cs *C.kvx_store
	flags := storeFlags(o.NoWait, o.Verify, o.NoSync, o.ReadOnly, o.Holes)
	if o.TierURL != "" {
		var co C.kvx_store_options
		C.kvx_store_options_init(&co)
		co.flags = flags
		if expect != nil {
			co.geometry = *expect
		}
		freeTier, err := tierC(&co, o.TierURL, o.TierTenant, o.TierTTL)
		defer freeTier()
		if err != nil {
			return nil, err
		}
		if err := check(C.gokvx_store_open_options(&cs, cdir, &co)); err != nil {
			return nil, err
		}
		return newStore(cs), nil
	}
	if err := check(C.gokvx_store_open(&cs, cdir, expect, flags)); err != nil {
		return nil, err
	}
	return newStore(cs), nil
}

func newStore(cs *C.kvx_store) *Store {
	s := &Store{storeHandle: &storeHandle{c: cs}}
	var g C.kvx_geometry
	C.kvx_store_get_geometry(&g, cs)
	s.geom = geometryFromC(&g)
	runtime.SetFinalizer(s.storeHandle, (*storeHandle).close)
	return s
}

// Close closes the store; unflushed puts are dropped. Views and shards
// taken from the store stay valid (they hold their own references). Safe
// to call more than once, on any copy of the Store, and on a nil or zero
// *Store (every other call on one returns ErrClosed).
func (s *Store) Close() error {
	if s == nil || s.storeHandle == nil {
		return nil
	}
	s.storeHandle.close()
	return nil
}

func (h *storeHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c != nil {
		C.kvx_store_close(h.c)
		h.c = nil
		runtime.SetFinalizer(h, nil)
	}
}

// Geometry is the store's fixed geometry.
func (s *Store) Geometry() Geometry {
	if s == nil {
		return Geometry{}
	}
	return s.geom
}

// acquire read-locks the store; the caller must call s.mu.RUnlock().
// live is ErrClosed for a nil, zero or closed Store, asked before any
// argument is looked at: a closed store's answer is ErrClosed whatever the
// call was given (GO-2).
func (s *Store) live() error {
	if _, err := s.acquire(); err != nil {
		return err
	}
	s.mu.RUnlock()
	return nil
}

func (s *Store) acquire() (*C.kvx_store, error) {
	if s == nil || s.storeHandle == nil {
		return nil, ErrClosed
	}
	s.mu.RLock()
	if s.c == nil {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	return s.c, nil
}

// Put stores the full blocks of one sequence: tokens are its ids, pages
// holds n contiguous KVX pages of B tokens each (n <= len(tokens)/B,
// len(pages) a multiple of the page size), scales (nil, or n*L*2*Hkv) the
// FP8 scales. Blocks already held are skipped; Put returns how many were
// written. Nothing is visible or durable until Flush returns nil. The
// library copies the pages during the call.
func (s *Store) Put(tokens []uint32, pages []byte, scales []float32) (int, error) {
	if err := s.live(); err != nil {
		return 0, err
	}
	n, err := s.pageCount("Put", pages, scales)
	if n == 0 || err != nil {
		return 0, err
	}
	cs, err := s.acquire()
	if err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var ctok *C.uint32_t
	if len(tokens) > 0 {
		ctok = (*C.uint32_t)(&tokens[0])
	}
	var csc *C.float
	if len(scales) > 0 {
		csc = (*C.float)(&scales[0])
	}
	r := C.gokvx_store_put(cs, ctok, C.size_t(len(tokens)), unsafe.Pointer(&pages[0]), C.size_t(n), csc)
	return int(r.n), check(r)
}

// pageCount checks pages and scales against the geometry: the number of
// pages, or ErrInvalid naming the length that is wrong.
func (s *Store) pageCount(fn string, pages []byte, scales []float32) (uint64, error) {
	pb := s.geom.PageBytes(s.geom.BlockTokens)
	if pb == 0 || uint64(len(pages))%pb != 0 {
		return 0, newError(CodeInvalid, fn+": len(pages) "+u64s(uint64(len(pages)))+
			" is not a multiple of the page size "+u64s(pb))
	}
	n := uint64(len(pages)) / pb
	if scales != nil && uint64(len(scales)) != n*s.geom.ScaleCount() {
		return 0, newError(CodeInvalid, fn+": len(scales) "+u64s(uint64(len(scales)))+" is not pages*L*2*Hkv = "+
			u64s(n*s.geom.ScaleCount()))
	}
	return n, nil
}

// PutEnvelope stores every full block of an envelope (spec
// kv-block-hash-and-envelope) under its hash; PutEnvelope returns how many
// were written. tokens are the sequence's ids: with them the blocks are
// verified (their hashes must equal the envelope's, ErrHash otherwise) and
// servable by Prefix, GetBlock and GetHash. With nil tokens the blocks are
// unverified: stored and reachable by coordinate, but never served by a
// prefix, a token lookup or a get by hash alone (ErrUnverified), until a
// verified put of the same blocks supersedes them. Nothing is visible or
// durable until Flush returns nil.
func (s *Store) PutEnvelope(env []byte, tokens []uint32) (int, error) {
	if err := s.live(); err != nil {
		return 0, err
	}
	if len(env) == 0 {
		return 0, newError(CodeFormat, "PutEnvelope: empty envelope")
	}
	cs, err := s.acquire()
	if err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var ctok *C.uint32_t
	if len(tokens) > 0 {
		ctok = (*C.uint32_t)(&tokens[0])
	}
	r := C.gokvx_store_put_envelope(cs, unsafe.Pointer(&env[0]), C.size_t(len(env)), ctok, C.size_t(len(tokens)))
	return int(r.n), check(r)
}

// Flush makes every block put so far durable and visible. nil is the
// acknowledgement. ErrDropped: a failed Put since the previous Flush
// dropped blocks of earlier successful Puts (never stored: put them
// again); what was put after it is stored.
func (s *Store) Flush() error {
	return s.writer(func(cs *C.kvx_store) C.gokvx_rc { return C.gokvx_store_flush(cs) })
}

// GC evicts to capacity and compacts mostly-dead or small shards.
func (s *Store) GC() error {
	return s.writer(func(cs *C.kvx_store) C.gokvx_rc { return C.gokvx_store_gc(cs) })
}

// Reindex rebuilds the index from the shards' own tables.
func (s *Store) Reindex() error {
	return s.writer(func(cs *C.kvx_store) C.gokvx_rc { return C.gokvx_store_reindex(cs) })
}

func (s *Store) writer(f func(*C.kvx_store) C.gokvx_rc) error {
	cs, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.mu.RUnlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return check(f(cs))
}

// Prefix serves the longest cached prefix of tokens: the leading full
// blocks found, in order. Only verified blocks are served (DESIGN.md trust
// rule 1): a block is served only when its hash, parent, token ids and
// prefix digest (PrefixDigests) all equal the prompt's, so an FNV
// collision can never return another prefix's KV, and blocks stored
// without their tokens (PutEnvelope with nil tokens) are never served.
// Every page served has passed its CRC-32 since its shard was opened. The
// prefix ends before the first block that is missing, unverified or
// damaged. A miss is not an error: the Views is empty; when damage (a page
// CRC mismatch, a page missing from a truncated file) ended the prefix,
// Views.StoppedAt names the block. One cgo crossing whatever the number of
// blocks.
func (s *Store) Prefix(tokens []uint32) (*Views, error) {
	return s.PrefixMax(tokens, len(tokens))
}

// PrefixMax is Prefix serving at most max blocks.
func (s *Store) PrefixMax(tokens []uint32, max int) (*Views, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	nb := 0
	if s.geom.BlockTokens > 0 {
		nb = len(tokens) / int(s.geom.BlockTokens)
	}
	if max < nb {
		nb = max
	}
	if nb <= 0 {
		return newViews(0), nil
	}
	v, r, err := s.lookup(nb, func(out *C.kvx_view, cs *C.kvx_store) C.gokvx_rc {
		return C.gokvx_store_prefix(out, cs, (*C.uint32_t)(&tokens[0]), C.size_t(len(tokens)), C.size_t(nb))
	})
	if err != nil {
		return nil, err
	}
	v.c = v.c[:int(r.n)] // the capacity stays: Release frees the whole array
	v.n = int(r.n)
	if r.msg != nil {
		v.stopped = newError(int(r.note), C.GoString(r.msg))
		C.free(unsafe.Pointer(r.msg))
	}
	return v, nil
}

// GetBlock serves the block that ends at the last full block of tokens
// (len(tokens)/B blocks; a partial tail is ignored), matched like Prefix on
// hash, parent, token ids and prefix digest: the way to get one block by
// content when its hash alone is ambiguous. ErrNotFound when no verified
// block matches, ErrTokens when tokens hold no full block, ErrPageCRC (or
// ErrTruncated) when the block's only copy is damaged.
func (s *Store) GetBlock(tokens []uint32) (*Views, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	if s.geom.BlockTokens == 0 || len(tokens) < int(s.geom.BlockTokens) {
		return nil, newError(CodeTokens, "GetBlock: "+strconv.Itoa(len(tokens))+" tokens hold no full block of "+
			u64s(uint64(s.geom.BlockTokens)))
	}
	v, _, err := s.lookup(1, func(out *C.kvx_view, cs *C.kvx_store) C.gokvx_rc {
		return C.gokvx_store_get_block(out, cs, (*C.uint32_t)(&tokens[0]), C.size_t(len(tokens)))
	})
	return v, err
}

// Get serves the block at a coordinate (ErrNotFound when there is none).
func (s *Store) Get(c Coord) (*Views, error) {
	v, _, err := s.lookup(1, func(out *C.kvx_view, cs *C.kvx_store) C.gokvx_rc {
		return C.gokvx_store_get(out, cs, C.uint32_t(c))
	})
	return v, err
}

// GetHash serves the block with a chained hash, by hash alone: it answers
// only when exactly one verified block holds the hash. Several verified
// blocks (an FNV collision): ErrAmbiguous (use GetBlock with the tokens);
// only unverified ones (stored without tokens): ErrUnverified; none:
// ErrNotFound. ErrAmbiguous and ErrUnverified are ErrNotFound too, so a
// caller that only asks "served or not" needs no change.
func (s *Store) GetHash(hash uint64) (*Views, error) {
	v, _, err := s.lookup(1, func(out *C.kvx_view, cs *C.kvx_store) C.gokvx_rc {
		return C.gokvx_store_get_hash(out, cs, C.uint64_t(hash))
	})
	return v, err
}

// GetHashes looks up many hashes in one crossing. View i is the block of
// hashes[i]; a miss has Found() false and errs[i] non-nil (ErrNotFound,
// ErrAmbiguous, ErrUnverified as for GetHash, or ErrPageCRC).
func (s *Store) GetHashes(hashes []uint64) (*Views, []error, error) {
	if err := s.live(); err != nil {
		return nil, nil, err
	}
	if len(hashes) == 0 {
		return newViews(0), nil, nil
	}
	status := make([]C.int, len(hashes))
	v, _, err := s.lookup(len(hashes), func(out *C.kvx_view, cs *C.kvx_store) C.gokvx_rc {
		return C.gokvx_store_get_hashes(out, &status[0], cs, (*C.uint64_t)(&hashes[0]), C.size_t(len(hashes)))
	})
	if err != nil {
		return nil, nil, err
	}
	errs := make([]error, len(hashes))
	for i, st := range status {
		if st != 0 {
			errs[i] = newError(int(st), "")
		}
	}
	return v, errs, nil
}

// Export writes the blocks of views, in order, as one envelope of version
// (EnvelopeV1: f16; EnvelopeV2: e4m3 with per-slab scales; EnvelopeV3:
// bf16, lossless for a QuantBF16 store, which writes EnvelopeV1 only when
// every value is exact in f16, else ErrLossy naming the first), the bytes a
// tl.kv.v1 KvChunk payload or ParseEnvelope takes. Every page's CRC-32 is
// checked again first, whatever was checked before (ErrPageCRC naming the
// block; nothing is built). An empty or nil views gives a valid envelope
// of 0 blocks (32 bytes). Every view must be found (a GetHashes miss:
// ErrInvalid) and come from a store of this store's geometry (ErrShape).
// One cgo crossing; the envelope is copied into Go memory.
func (s *Store) Export(views *Views, version uint16) ([]byte, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	n := views.Len()
	if views != nil && views.viewSet != nil {
		// held to the end of the C call: a concurrent Release waits
		if !views.viewSet.hold() {
			return nil, newError(CodeInvalid, "Export: the views were released")
		}
		defer views.mu.RUnlock()
	}
	size, ok := envelopeSize(version, s.geom, n)
	if !ok {
		// not a version kvx writes, or a size that overflows: C names it
		size = 0
	}
	cs, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	out := make([]byte, size)
	var dst unsafe.Pointer
	if size > 0 {
		dst = unsafe.Pointer(&out[0])
	}
	var cv *C.kvx_view
	if n > 0 {
		cv = &views.c[0]
	}
	r := C.gokvx_views_export(dst, C.size_t(size), cs, cv, C.size_t(n), C.uint16_t(version))
	runtime.KeepAlive(views)
	if err := check(r); err != nil {
		return nil, err
	}
	return out, nil
}

// lookup runs one crossing that fills n (> 0) views, under the read lock:
// f gets the C array and the store. On an error the views are freed and
// nil comes back; otherwise they are armed and come back with f's result
// (whose n a crossing that may fill fewer than n reports).
func (s *Store) lookup(n int, f func(out *C.kvx_view, cs *C.kvx_store) C.gokvx_rc) (*Views, C.gokvx_rc, error) {
	cs, err := s.acquire()
	if err != nil {
		return nil, C.gokvx_rc{}, err
	}
	v := newViews(n)
	r := f(&v.c[0], cs)
	s.mu.RUnlock()
	if err := check(r); err != nil {
		v.free(0)
		return nil, r, err
	}
	v.arm()
	return v, r, nil
}

// Stat returns the store's counters.
func (s *Store) Stat() (Stats, error) {
	cs, err := s.acquire()
	if err != nil {
		return Stats{}, err
	}
	defer s.mu.RUnlock()
	var st C.kvx_store_stats
	if err := check(C.gokvx_store_stat(&st, cs)); err != nil {
		return Stats{}, err
	}
	return Stats{
		Blocks: uint64(st.blocks), Bytes: uint64(st.bytes), Shards: uint64(st.shards),
		CapacityBytes: uint64(st.capacity_bytes), Hits: uint64(st.hits), Misses: uint64(st.misses),
		Evictions: uint64(st.evictions), EvictedBlocks: uint64(st.evicted_blocks),
		Compactions: uint64(st.compactions), PendingBlocks: uint64(st.pending_blocks),
		DroppedShards: uint64(st.dropped_shards), ShardBytes: uint64(st.shard_bytes),
		Quarantined: uint64(st.quarantined), QuarantineBytes: uint64(st.quarantine_bytes), FreedBytes: uint64(st.freed_bytes),
		TierHits: uint64(st.tier_hits), TierMisses: uint64(st.tier_misses), TierErrors: uint64(st.tier_errors),
		TierBad: uint64(st.tier_bad), TierReplaced: uint64(st.tier_replaced), TierWrites: uint64(st.tier_writes),
		TierBytesUp: uint64(st.tier_bytes_up), TierBytesDown: uint64(st.tier_bytes_down), TierUp: st.tier_up != 0,
	}, nil
}

// Problem is one finding of a verify.
type Problem struct {
	Entry uint32 // shard verify: the entry index
	What  string // store verify: what is wrong, named by the library
	Err   *Error
}

// Verify checks every shard and page against the index. The error is the
// first failure (nil when everything is intact); problems lists each one.
func (s *Store) Verify() ([]Problem, error) {
	cs, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	var bad *C.gokvx_bad
	r := C.gokvx_store_verify(cs, &bad)
	probs := problems(bad, r.n)
	return probs, check(r)
}

func problems(bad *C.gokvx_bad, n C.uint64_t) []Problem {
	if bad == nil {
		return nil
	}
	defer C.gokvx_bads_free(bad, C.size_t(n))
	out := make([]Problem, 0, int(n))
	for _, b := range unsafe.Slice(bad, int(n)) {
		p := Problem{Entry: uint32(b.index), Err: newError(int(b.code), "")}
		if b.what != nil {
			p.What = C.GoString(b.what)
			p.Err.Message = p.What
		}
		out = append(out, p)
	}
	return out
}

// Shards is a snapshot of the live shards, each an open *Shard the caller
// closes (they stay valid after the store is closed or a shard evicted).
func (s *Store) Shards() ([]*Shard, error) {
	cs, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	var arr **C.kvx_shard
	r := C.gokvx_store_shards(&arr, cs)
	if err := check(r); err != nil {
		return nil, err
	}
	return adoptShards(arr, int(r.n)), nil
}

// Views is a batch of blocks served by the store: zero-copy views of
// mapped pages, each holding a reference on its shard, so they stay valid
// until Release even if the shard is evicted or the store closed.
//
// Every accessor call is safe against a concurrent Release (or the
// finalizer): the call holds the views (a read lock) while it reads them,
// and Release waits for the calls in flight, then frees. A call after
// Release returns the zero value. A zero-copy slice already returned
// (View.Page, View.Scales) is the caller's to stop using before Release;
// Bytes and CopyTo copy under the hold. A finalizer releases a forgotten
// Views, so keep it reachable while you use its pages (runtime.KeepAlive,
// or simply call Release).
//
// A copy of a Views value is the same views: Release on either releases
// both, once.
type Views struct{ *viewSet }

// viewSet is shared by copies of a Views and by its View values, and
// carries the finalizer.
type viewSet struct {
	// mu: accessors hold it shared while they read c or the pages it
	// points to; release holds it exclusively to free them.
	mu       sync.RWMutex
	c        []C.kvx_view // C memory (gokvx_views_alloc); nil when empty or released
	n        int          // blocks served
	stopped  *Error       // Prefix: the damage that ended the prefix
	released atomic.Bool  // set under mu held exclusively
}

func newViews(n int) *Views {
	if n == 0 {
		return &Views{&viewSet{}}
	}
	return &Views{&viewSet{c: unsafe.Slice(C.gokvx_views_alloc(C.size_t(n)), n), n: n}}
}

// arm sets the safety-net finalizer (also for an empty result: the C
// array must be freed).
func (v *Views) arm() {
	if cap(v.c) > 0 {
		runtime.SetFinalizer(v.viewSet, (*viewSet).release)
	}
}

// free releases the first n views and frees the C array.
func (v *viewSet) free(n int) {
	if cap(v.c) > 0 {
		C.gokvx_views_free(&v.c[:1][0], C.size_t(n))
	}
	v.c = nil
}

// hold pins the set against release: true when it is live, and then the
// caller ends with v.mu.RUnlock(). Never hold one set twice in one
// goroutine (a Release waiting between the two would deadlock it).
func (v *viewSet) hold() bool {
	v.mu.RLock()
	if v.released.Load() {
		v.mu.RUnlock()
		return false
	}
	return true
}

// Len is the number of blocks.
func (v *Views) Len() int {
	if v == nil || v.viewSet == nil {
		return 0
	}
	return v.n
}

// At is block i (0 <= i < Len()).
func (v *Views) At(i int) View {
	if uint(i) >= uint(v.Len()) {
		panic("kvx: Views.At: index " + strconv.Itoa(i) + " out of range [0, " + strconv.Itoa(v.Len()) + ")")
	}
	return View{v: v, i: i}
}

// Release drops the views' shard references, once every accessor call in
// flight has returned. Every page slice taken from them becomes invalid;
// the package never reads them again. Idempotent.
func (v *Views) Release() {
	if v != nil && v.viewSet != nil {
		v.viewSet.release()
	}
}

func (v *viewSet) release() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.released.Swap(true) {
		return
	}
	runtime.SetFinalizer(v, nil)
	v.free(v.n)
}

// StoppedAt is, for a Prefix result, the damage that ended the prefix: an
// *Error (ErrPageCRC or ErrTruncated, both ErrCorrupt) whose message names
// the damaged block, which was withheld with every block after it; the
// blocks served before it are intact. Nil when the prefix ended at a miss
// or an unverified block, or served every full block (and for every other
// lookup, whose damage is its error). It stays readable after Release.
func (v *Views) StoppedAt() error {
	if v == nil || v.viewSet == nil || v.stopped == nil {
		return nil
	}
	return v.stopped
}

// Released reports whether Release was called.
func (v *Views) Released() bool { return v != nil && v.viewSet != nil && v.released.Load() }

// View is one block of a Views. Its accessors return zero values after
// the Views is released.
//
// Every accessor holds the set (viewSet.hold) while it reads the C view
// array (and Bytes, CopyTo and Scales the mapping it points into), so a
// concurrent Release waits for it, and keeps b.v reachable to its end
// (runtime.KeepAlive): a View's Views may be otherwise unreachable (as in
// s.GetHash(h) chained into .At(0).Bytes()), and without it the Views'
// finalizer could free the array in the middle of the read.
type View struct {
	v *Views
	i int
}

// hold is the C view with the set held (the caller ends with b.unhold()),
// or nil, holding nothing, for the zero View or after Release.
func (b View) hold() *C.kvx_view {
	if b.v == nil || b.v.viewSet == nil || !b.v.viewSet.hold() {
		return nil
	}
	return &b.v.c[b.i]
}

// unhold ends a hold that returned a view.
func (b View) unhold() {
	b.v.mu.RUnlock()
	runtime.KeepAlive(b.v)
}

// Found is false for a miss of GetHashes (and after Release).
func (b View) Found() bool {
	c := b.hold()
	if c == nil {
		return false
	}
	defer b.unhold()
	return c.shard != nil
}

// Coordinate of the block.
func (b View) Coordinate() Coord {
	c := b.hold()
	if c == nil {
		return 0
	}
	defer b.unhold()
	return Coord(c.coordinate)
}

// Tokens is the block's token count.
func (b View) Tokens() uint32 {
	c := b.hold()
	if c == nil {
		return 0
	}
	defer b.unhold()
	return uint32(c.token_count)
}

// Hash is the block's chained hash.
func (b View) Hash() uint64 {
	c := b.hold()
	if c == nil {
		return 0
	}
	defer b.unhold()
	return uint64(c.hash)
}

// Entry is the block's index within its shard.
func (b View) Entry() uint32 {
	c := b.hold()
	if c == nil {
		return 0
	}
	defer b.unhold()
	return uint32(c.entry)
}

// Page is the zero-copy page (the shard mapping), valid until Release;
// nil after it. The slice is the caller's to stop using before Release,
// and the Views must stay reachable while it is used (Release it after,
// or runtime.KeepAlive): its finalizer releases a forgotten Views. Bytes
// and CopyTo need no such care.
func (b View) Page() []byte {
	c := b.hold()
	if c == nil {
		return nil
	}
	defer b.unhold()
	return cbytes(c.page, uint64(c.page_bytes))
}

// Scales are the block's FP8 scales (L*2*Hkv), zero-copy; nil when every
// scale is 1.0 or after Release. Like Page, valid while the Views is
// reachable and not released.
func (b View) Scales() []float32 {
	c := b.hold()
	if c == nil {
		return nil
	}
	defer b.unhold()
	if c.scales == nil {
		return nil
	}
	g := C.kvx_shard_get_info(c.shard).geometry
	return unsafe.Slice((*float32)(unsafe.Pointer(c.scales)), int(C.kvx_scale_count(&g)))
}

// testHookCopy, set by tests only, runs in the copying accessors (View
// and Fetched Bytes and CopyTo) between taking the page and copying it,
// where a garbage collection may run (the copy's allocation): a test runs
// collections there and checks the page is still mapped.
var testHookCopy func()

// Bytes is a copy of the page (nil after Release), made with the Views
// held: a concurrent Release waits for the copy.
func (b View) Bytes() []byte {
	c := b.hold()
	if c == nil {
		return nil
	}
	defer b.unhold()
	p := cbytes(c.page, uint64(c.page_bytes))
	if testHookCopy != nil {
		testHookCopy()
	}
	out := make([]byte, len(p)) // may run a GC: b.v stays reachable (unhold)
	copy(out, p)
	return out
}

// CopyTo copies the page into dst and returns the bytes copied (0 after
// Release), with the Views held as Bytes.
func (b View) CopyTo(dst []byte) int {
	c := b.hold()
	if c == nil {
		return 0
	}
	defer b.unhold()
	if testHookCopy != nil {
		testHookCopy()
	}
	return copy(dst, cbytes(c.page, uint64(c.page_bytes)))
}

func u64s(v uint64) string { return strconv.FormatUint(v, 10) }
