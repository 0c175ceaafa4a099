// Package kvx embeds kvx, the storage engine for frozen LLM KV-cache
// shards, in a Go program through cgo.
//
// The package is shaped by what a cgo crossing costs (tens of
// nanoseconds) and by cgo's pointer rules:
//
//   - One crossing per batch: a prefix lookup of N blocks, a fetch of N
//     pages, a table of N shard entries are each one C call.
//   - C never keeps a Go pointer. Lookups fill Go arrays of C views only
//     for the duration of the call; asynchronous I/O (Fetch, Warmup) lands
//     in C-owned memory (the pinned pool, a C-allocated host sink).
//   - Pages are zero-copy []byte views of C memory (the shard mapping or
//     the pinned pool), valid until the holder's Release (or Close). After
//     Release the package never reads them again and its accessors return
//     nil; a slice you kept from before is dangling: copy with Bytes or
//     CopyTo when a page must outlive its holder.
//   - Every handle (Store, Shard, Pool, Fetcher, GPU, Views, Fetched) is
//     safe for concurrent use by goroutines, and every accessor call is
//     safe against a concurrent Release or Close: it completes on live
//     memory or returns the zero value, never reads freed memory. A
//     zero-copy slice already returned is the caller's to stop using
//     before Release. Close is explicit and idempotent; a finalizer
//     closes a forgotten handle only as a safety net.
//   - Errors are *Error values carrying the kvx code, its name and the
//     library's message, comparable with errors.Is against the sentinels
//     in errors.go (ErrNotFound, ErrCorrupt, ErrShape, ...).
//
// Linking: the package links libkvx.a statically. By default it is found
// in ../../build (the repository's CMake build directory, as
// scripts/setup.sh makes it); set CGO_LDFLAGS=-L/other/build to use
// another build directory. When that library was built with CUDA, the
// CUDA runtime is linked statically from /usr/local/cuda; otherwise an
// empty stand-in archive (nocuda/) satisfies the link. liburing, LMDB,
// libnuma, OpenSSL's libcrypto (SHA-256 of the prefix digests) and hiredis
// (the shared tier's Redis protocol) are linked from their static archives
// too (Debian ships them);
// only ISA-L, which Debian ships as a shared library alone, stays dynamic
// (link_build.go). With the build tag kvx_system the package uses an
// installed kvx instead, through `#cgo pkg-config: kvx`, and links
// libkvx.so dynamically (link_system.go). See README.md.
package kvx

/*
#include "shim.h"
*/
import "C"

import (
	"strconv"
	"strings"
	"unsafe"
)

// Version is the kvx library version ("0.1.0").
func Version() string { return C.GoString(C.kvx_version()) }

// Quant is the element format of KV pages.
type Quant uint32

const (
	QuantFP16 Quant = C.KVX_QUANT_FP16 // IEEE binary16
	QuantE4M3 Quant = C.KVX_QUANT_E4M3 // OCP FP8 E4M3FN
	QuantE5M2 Quant = C.KVX_QUANT_E5M2 // OCP FP8 E5M2
	QuantBF16 Quant = C.KVX_QUANT_BF16 // bfloat16 (kvx extension, quant_format 3): the KV dtype of most models
)

// ParseQuant is the Quant named "fp16", "e4m3", "e5m2" or "bf16" (the
// names String gives and the kvx CLI takes); ErrQuant for another name.
func ParseQuant(name string) (Quant, error) {
	for _, q := range []Quant{QuantFP16, QuantE4M3, QuantE5M2, QuantBF16} {
		if q.String() == name {
			return q, nil
		}
	}
	return 0, newError(CodeQuant, "quant "+strconv.Quote(name)+" is not fp16, e4m3, e5m2 or bf16")
}

// String is "fp16", "e4m3", "e5m2", "bf16", or "quant(N)" for an unknown one.
func (q Quant) String() string {
	if s := C.kvx_quant_name(C.uint32_t(q)); s != nil {
		return C.GoString(s)
	}
	return "quant(" + strconv.FormatUint(uint64(q), 10) + ")"
}

// ElemSize is the bytes of one element (2 or 1); 0 for an unknown quant.
func (q Quant) ElemSize() int { return int(C.kvx_quant_elem_size(C.uint32_t(q))) }

// Geometry is the shape of a model's KV cache.
type Geometry struct {
	Layers         uint32 // L
	KVHeads        uint32 // Hkv
	HeadDim        uint32 // D
	BlockTokens    uint32 // B of the chained block hashes
	Quant          Quant
	ModelSignature uint64 // first 8 bytes of the model's SHA-256, LE
}

func (g Geometry) c() C.kvx_geometry {
	return C.kvx_geometry{
		num_layers: C.uint32_t(g.Layers), kv_heads: C.uint32_t(g.KVHeads),
		head_dim: C.uint32_t(g.HeadDim), block_tokens: C.uint32_t(g.BlockTokens),
		quant: C.uint32_t(g.Quant), model_signature: C.uint64_t(g.ModelSignature),
	}
}

func geometryFromC(c *C.kvx_geometry) Geometry {
	return Geometry{
		Layers: uint32(c.num_layers), KVHeads: uint32(c.kv_heads), HeadDim: uint32(c.head_dim),
		BlockTokens: uint32(c.block_tokens), Quant: Quant(c.quant),
		ModelSignature: uint64(c.model_signature),
	}
}

// PageBytes is the size of a page of n tokens: 2*L*Hkv*n*D*elem (0 on
// overflow or an unknown quant).
func (g Geometry) PageBytes(nTokens uint32) uint64 {
	cg := g.c()
	return uint64(C.kvx_page_bytes(&cg, C.uint32_t(nTokens)))
}

// ScaleCount is the number of f32 scales of one block: L*2*Hkv.
func (g Geometry) ScaleCount() uint64 {
	cg := g.c()
	return uint64(C.kvx_scale_count(&cg))
}

// Coord is a 32-bit coordinate: shard byte, 16-bit radix block, spectral
// cartridge byte.
type Coord uint32

// MakeCoord builds a coordinate from its three fields.
func MakeCoord(shard uint8, block uint16, spectral uint8) Coord {
	return Coord(uint32(shard)<<24 | uint32(block)<<8 | uint32(spectral))
}

func (c Coord) Shard() uint8    { return uint8(c >> 24) }
func (c Coord) Block() uint16   { return uint16(c >> 8) }
func (c Coord) Spectral() uint8 { return uint8(c) }

// FNV1a64 is the 64-bit FNV-1a hash of data.
func FNV1a64(data []byte) uint64 {
	if len(data) == 0 {
		return uint64(C.kvx_fnv1a64(nil, 0))
	}
	return uint64(C.kvx_fnv1a64(unsafe.Pointer(&data[0]), C.size_t(len(data))))
}

// BlockHash is the chained block hash H(parent, tokens); len(tokens) is B.
func BlockHash(parent uint64, tokens []uint32) uint64 {
	if len(tokens) == 0 {
		return uint64(C.kvx_block_hash(C.uint64_t(parent), nil, 0))
	}
	return uint64(C.kvx_block_hash(C.uint64_t(parent), (*C.uint32_t)(&tokens[0]), C.uint32_t(len(tokens))))
}

// BlockHashes are the chained hashes of every full block of tokens.
func BlockHashes(tokens []uint32, blockTokens uint32) []uint64 {
	if blockTokens == 0 || len(tokens) < int(blockTokens) {
		return nil
	}
	out := make([]uint64, len(tokens)/int(blockTokens))
	n := C.kvx_block_hashes((*C.uint64_t)(&out[0]), (*C.uint32_t)(&tokens[0]), C.size_t(len(tokens)),
		C.uint32_t(blockTokens))
	return out[:int(n)]
}

// DigestBytes is the size of a prefix digest.
const DigestBytes = int(C.KVX_DIGEST_BYTES)

// PrefixDigests are the prefix digests of every full block of tokens: the
// SHA-256 chain d_0 = SHA-256(le_u32 tokens of block 0), d_i =
// SHA-256(d_{i-1} || le_u32 tokens of block i). The 64-bit chained hash
// (BlockHashes) names a block; the digest is its proof (FNV-1a collides
// on purpose in seconds): the store serves a block for a prompt only when
// its stored digest equals the prompt's. Nil when blockTokens is 0 or
// tokens hold no full block. One cgo crossing.
func PrefixDigests(tokens []uint32, blockTokens uint32) [][32]byte {
	if blockTokens == 0 || len(tokens) < int(blockTokens) {
		return nil
	}
	out := make([][32]byte, len(tokens)/int(blockTokens))
	n := C.kvx_prefix_digests((*[C.KVX_DIGEST_BYTES]C.uint8_t)(unsafe.Pointer(&out[0])), (*C.uint32_t)(&tokens[0]),
		C.size_t(len(tokens)), C.uint32_t(blockTokens))
	return out[:int(n)]
}

// PrefixDigestNext is one link of the chain: SHA-256(prev || le_u32
// block), prev nil for the first block of a sequence; len(block) is B.
func PrefixDigestNext(prev *[32]byte, block []uint32) [32]byte {
	var out [32]byte
	var cp *C.uint8_t
	if prev != nil {
		cp = (*C.uint8_t)(&prev[0])
	}
	var ct *C.uint32_t
	if len(block) > 0 {
		ct = (*C.uint32_t)(&block[0])
	}
	C.kvx_prefix_digest_next((*C.uint8_t)(&out[0]), cp, ct, C.uint32_t(len(block)))
	return out
}

// CRC32C is CRC-32C (Castagnoli) of data, continuing from crc (start at 0).
func CRC32C(crc uint32, data []byte) uint32 {
	if len(data) == 0 {
		return crc
	}
	return uint32(C.kvx_crc32c(C.uint32_t(crc), unsafe.Pointer(&data[0]), C.size_t(len(data))))
}

// CRC32 is CRC-32 (IEEE, as zlib) of data, continuing from crc.
func CRC32(crc uint32, data []byte) uint32 {
	if len(data) == 0 {
		return crc
	}
	return uint32(C.kvx_crc32(C.uint32_t(crc), unsafe.Pointer(&data[0]), C.size_t(len(data))))
}

// cbytes is a zero-copy view of n bytes of C memory at p (nil for NULL).
// cString is C.CString for a path or a name, refusing one that holds a NUL
// byte (C would see only what comes before it: another directory, another
// tenant). code: CodePath for paths, CodeInvalid for the rest. Free with C.free.
func cString(s string, code int, what string) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, newError(code, what+" "+strconv.Quote(s)+" holds a NUL byte")
	}
	return C.CString(s), nil
}

func cbytes(p unsafe.Pointer, n uint64) []byte {
	if p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(p), int(n))
}
