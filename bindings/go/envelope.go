// envelope.go - the TLKV export envelope (spec kv-block-hash-and-envelope):
// the byte layout of a tl.kv.v1 KvChunk payload, made by Store.Export and
// taken by Store.PutEnvelope. ParseEnvelope validates one with every reader
// rule of the spec (in C, one crossing) and decodes its block records in
// Go, zero-copy over the caller's buffer.
package kvx

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// Envelope versions Export writes.
const (
	EnvelopeV1 = uint16(C.KVX_ENVELOPE_V1) // f16 [L][2][Hkv][B][D]
	EnvelopeV2 = uint16(C.KVX_ENVELOPE_V2) // e4m3 [L][2][Hkv][B][D], then f32 scales [L][2][Hkv]
	EnvelopeV3 = uint16(C.KVX_ENVELOPE_V3) // bf16 [L][2][Hkv][B][D] (kvx extension, dtype 2)
)

// EnvelopeHeaderBytes is the size of an envelope's header; the envelope
// ends with a 4-byte CRC-32C of every byte before it, so an envelope of 0
// blocks is 32 bytes.
const EnvelopeHeaderBytes = int(C.KVX_ENVELOPE_HEADER_BYTES)

// Envelope is a validated envelope. Its payload slices point into the
// buffer given to ParseEnvelope (zero-copy): valid while that buffer is,
// and changed with it.
type Envelope struct {
	Version      uint16
	DType        uint16   // 1 = f16 (v1), 3 = f8 e4m3 (v2), 2 = bf16 (v3)
	Geometry     Geometry // BlockTokens, Layers, KVHeads, HeadDim; Quant FP16 (v1), E4M3 (v2) or BF16 (v3); no model signature
	PayloadBytes int      // P, the payload size of every block
	Blocks       []EnvelopeBlock
}

// EnvelopeBlock is one block record of an envelope.
type EnvelopeBlock struct {
	Hash    uint64 // chained block hash; 0 for a partial (tail) block
	Tokens  uint32 // the block's fill, 1..B
	Payload []byte // P bytes [L][2][Hkv][B][D] (v2: the scales are its tail)
}

// ParseEnvelope validates buf with every reader rule of the spec (length,
// magic, version and dtype, dimensions, CRC-32C, each block's n_tokens
// and hash rule): ErrFormat, or ErrVersion for an intact envelope of a
// version kvx does not read. expect (nil = any) gives the receiver's
// BlockTokens, Layers, KVHeads and HeadDim (BlockTokens 0 accepts any B):
// a mismatch is ErrShape.
func ParseEnvelope(buf []byte, expect *Geometry) (Envelope, error) {
	var info C.gokvx_envelope_info
	var p unsafe.Pointer
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	var ce *C.kvx_geometry
	if expect != nil {
		g := expect.c()
		ce = &g
	}
	if err := check(C.gokvx_envelope_parse(&info, p, C.size_t(len(buf)), ce)); err != nil {
		return Envelope{}, err
	}
	e := Envelope{
		Version: uint16(info.version), DType: uint16(info.dtype),
		Geometry: geometryFromC(&info.geometry), PayloadBytes: int(info.payload_bytes),
	}
	// C checked the exact length: 28 + n*(12+P) + 4.
	n := int(info.n_blocks)
	e.Blocks = make([]EnvelopeBlock, n)
	rec := 12 + e.PayloadBytes
	for i := range e.Blocks {
		r := buf[EnvelopeHeaderBytes+i*rec : EnvelopeHeaderBytes+(i+1)*rec]
		e.Blocks[i] = EnvelopeBlock{
			Hash:    binary.LittleEndian.Uint64(r[0:8]),
			Tokens:  binary.LittleEndian.Uint32(r[8:12]),
			Payload: r[12:rec:rec],
		}
	}
	return e, nil
}

// envelopeSize is 28 + n*(12+P) + 4 for version and g; false for a version
// Export does not write or a size that overflows an int.
func envelopeSize(version uint16, g Geometry, n int) (int, bool) {
	slabs, ok := mulAll(uint64(g.Layers), 2, uint64(g.KVHeads))
	if !ok {
		return 0, false
	}
	var p uint64
	switch version {
	case EnvelopeV1, EnvelopeV3:
		p, ok = mulAll(slabs, uint64(g.BlockTokens), uint64(g.HeadDim), 2)
	case EnvelopeV2:
		var bd uint64
		if bd, ok = mulAll(uint64(g.BlockTokens), uint64(g.HeadDim)); ok && bd+4 > bd {
			p, ok = mulAll(slabs, bd+4)
		} else {
			ok = false
		}
	default:
		return 0, false
	}
	if !ok || p > (1<<62) {
		return 0, false
	}
	body, ok := mulAll(uint64(n), 12+p)
	if !ok || body > (1<<62) {
		return 0, false
	}
	total := uint64(EnvelopeHeaderBytes) + body + 4
	if total > uint64(^uint(0)>>1) {
		return 0, false
	}
	return int(total), true
}

// mulAll is the product of xs, false on uint64 overflow.
func mulAll(xs ...uint64) (uint64, bool) {
	r := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(r, x)
		if hi != 0 {
			return 0, false
		}
		r = lo
	}
	return r, true
}
