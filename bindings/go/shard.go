// shard.go - a single KVX shard file: open (every validation rule of the
// format), inspect its header and entry table, read pages zero-copy from
// the mapping, verify every page CRC.
//
// The entry table and the verify findings each come back in one cgo
// crossing (C-side loops and collectors in shim.c; no C -> Go callback).
package kvx

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// ShardInfo is a shard's header, decoded.
type ShardInfo struct {
	Geometry       Geometry
	FormatVersion  uint16
	ShardID        uint8
	NumBlocks      uint32
	SpectralDim    uint32
	SpectralOffset uint64
	KVDataOffset   uint64
	Flags          uint32 // FlagHashes | FlagLineage | FlagScales | FlagMetaCRC | FlagDigest
	MetaCRC32C     uint32
	FileSize       uint64
}

// Header flags.
const (
	FlagHashes  = uint32(C.KVX_FLAG_HASHES)
	FlagLineage = uint32(C.KVX_FLAG_LINEAGE)
	FlagScales  = uint32(C.KVX_FLAG_SCALES)
	FlagMetaCRC = uint32(C.KVX_FLAG_META_CRC)
	FlagDigest  = uint32(C.KVX_FLAG_DIGEST) // digest table (needs FlagLineage)
)

// Entry is one entry of a shard's coordinate table.
type Entry struct {
	Coordinate Coord
	TokenCount uint32
	Offset     uint64 // absolute file offset of the page
	Bytes      uint32
	CRC32      uint32
	Hash       uint64   // 0 without a hash table
	Parent     uint64   // 0 without a lineage table
	Tokens     []uint32 // lineage token ids (a copy); nil without
	// Digest is the block's 32-byte prefix digest (a copy; see
	// PrefixDigests); nil without a digest table or when the entry is
	// unverified (stored without its tokens: an all-zero digest).
	Digest []byte
}

// Shard is an open, validated shard file. Safe for concurrent use; pages
// it returns are valid until Close. A copy of a Shard value is the same
// handle: closing either closes both, once.
type Shard struct{ *shardHandle }

// shardHandle is shared by copies of a Shard, and carries the finalizer.
type shardHandle struct {
	mu sync.RWMutex
	c  *C.kvx_shard
}

// OpenShard opens and validates a sealed shard (ErrFormat, ErrMagic,
// ErrMetaCRC, ... with a message naming the rule). verifyPages also checks
// every page CRC at open.
func OpenShard(path string, verifyPages bool) (*Shard, error) {
	cp, err := cString(path, CodePath, "OpenShard: path")
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cp))
	var flags C.unsigned
	if verifyPages {
		flags = C.KVX_OPEN_VERIFY_PAGES
	}
	var cs *C.kvx_shard
	if err := check(C.gokvx_shard_open(&cs, cp, flags)); err != nil {
		return nil, err
	}
	return newShard(cs), nil
}

func newShard(cs *C.kvx_shard) *Shard {
	s := &Shard{&shardHandle{c: cs}}
	runtime.SetFinalizer(s.shardHandle, (*shardHandle).close)
	return s
}

// adoptShards wraps a C array of shard references and frees the array.
func adoptShards(arr **C.kvx_shard, n int) []*Shard {
	if arr == nil {
		return nil
	}
	out := make([]*Shard, n)
	for i, c := range unsafe.Slice(arr, n) {
		out[i] = newShard(c)
	}
	C.kvx_free(unsafe.Pointer(arr))
	return out
}

// Close drops the handle's reference (pages taken from it become invalid).
// Idempotent.
func (s *Shard) Close() error {
	if s == nil || s.shardHandle == nil {
		return nil
	}
	s.shardHandle.close()
	return nil
}

func (h *shardHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c != nil {
		C.kvx_shard_close(h.c)
		h.c = nil
		runtime.SetFinalizer(h, nil)
	}
}

func (s *Shard) acquire() (*C.kvx_shard, error) {
	if s == nil || s.shardHandle == nil {
		return nil, ErrClosed
	}
	s.mu.RLock()
	if s.c == nil {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	return s.c, nil
}

// Path is the shard's file path ("" once closed).
func (s *Shard) Path() string {
	c, err := s.acquire()
	if err != nil {
		return ""
	}
	defer s.mu.RUnlock()
	return C.GoString(C.kvx_shard_path(c))
}

// Info is the shard's header (zero once closed).
func (s *Shard) Info() ShardInfo {
	c, err := s.acquire()
	if err != nil {
		return ShardInfo{}
	}
	defer s.mu.RUnlock()
	i := C.kvx_shard_get_info(c)
	return ShardInfo{
		Geometry: geometryFromC(&i.geometry), FormatVersion: uint16(i.format_version),
		ShardID: uint8(i.shard_id), NumBlocks: uint32(i.num_blocks), SpectralDim: uint32(i.spectral_dim),
		SpectralOffset: uint64(i.spectral_offset), KVDataOffset: uint64(i.kv_data_offset),
		Flags: uint32(i.flags), MetaCRC32C: uint32(i.meta_crc32c), FileSize: uint64(i.file_size),
	}
}

// Entries is the whole entry table, decoded in one crossing.
func (s *Shard) Entries() ([]Entry, error) {
	c, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	n := uint32(C.kvx_shard_get_info(c).num_blocks)
	if n == 0 {
		return nil, nil
	}
	ce := make([]C.kvx_entry, n)
	if err := check(C.gokvx_shard_entries(&ce[0], c, 0, C.uint32_t(n))); err != nil {
		return nil, err
	}
	bt := int(C.kvx_shard_get_info(c).geometry.block_tokens)
	out := make([]Entry, n)
	for i := range ce {
		out[i] = entryFromC(&ce[i], bt)
	}
	return out, nil
}

func entryFromC(e *C.kvx_entry, blockTokens int) Entry {
	out := Entry{
		Coordinate: Coord(e.coordinate), TokenCount: uint32(e.token_count), Offset: uint64(e.offset),
		Bytes: uint32(e.bytes), CRC32: uint32(e.crc32), Hash: uint64(e.hash), Parent: uint64(e.parent),
	}
	if e.tokens != nil && blockTokens > 0 {
		t := unsafe.Slice((*uint32)(unsafe.Pointer(e.tokens)), blockTokens)
		out.Tokens = append([]uint32(nil), t...)
	}
	if e.digest != nil {
		out.Digest = C.GoBytes(unsafe.Pointer(e.digest), C.KVX_DIGEST_BYTES)
	}
	return out
}

// Entry is entry i (ErrNotFound / ErrInvalid when out of range).
func (s *Shard) Entry(i uint32) (Entry, error) {
	c, err := s.acquire()
	if err != nil {
		return Entry{}, err
	}
	defer s.mu.RUnlock()
	var ce [1]C.kvx_entry
	if err := check(C.gokvx_shard_entries(&ce[0], c, C.uint32_t(i), 1)); err != nil {
		return Entry{}, err
	}
	return entryFromC(&ce[0], int(C.kvx_shard_get_info(c).geometry.block_tokens)), nil
}

// Find is the entry index of a coordinate (ErrNotFound when absent).
func (s *Shard) Find(c Coord) (uint32, error) {
	cs, err := s.acquire()
	if err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	r := C.gokvx_shard_find(cs, C.uint32_t(c))
	return uint32(r.n), check(r)
}

// Page is entry i's page, zero-copy from the mapping, valid until Close.
// With verify, a CRC mismatch returns the page and an ErrPageCRC error.
func (s *Shard) Page(i uint32, verify bool) ([]byte, error) {
	c, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	var p unsafe.Pointer
	v := C.int(0)
	if verify {
		v = 1
	}
	// p is a Go variable receiving a C pointer: allowed, C keeps nothing.
	err = check(C.gokvx_shard_page(&p, c, C.uint32_t(i), v))
	if p == nil {
		return nil, err
	}
	var ce [1]C.kvx_entry
	if e2 := check(C.gokvx_shard_entries(&ce[0], c, C.uint32_t(i), 1)); e2 != nil {
		return nil, e2
	}
	return cbytes(p, uint64(ce[0].bytes)), err
}

// Verify checks every page CRC. The error is the first failure (nil when
// every page is intact); problems names each bad page.
func (s *Shard) Verify() ([]Problem, error) {
	c, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	var bad *C.gokvx_bad
	r := C.gokvx_shard_verify(c, &bad)
	return problems(bad, r.n), check(r)
}

// Inspect opens a shard file, returns its header and entry table, and
// closes it.
func Inspect(path string) (ShardInfo, []Entry, error) {
	s, err := OpenShard(path, false)
	if err != nil {
		return ShardInfo{}, nil, err
	}
	defer s.Close()
	e, err := s.Entries()
	return s.Info(), e, err
}

// VerifyFile opens a shard file (structure), checks every page CRC and
// closes it. The error is the first failure; problems names each bad page.
func VerifyFile(path string) ([]Problem, error) {
	s, err := OpenShard(path, false)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Verify()
}
