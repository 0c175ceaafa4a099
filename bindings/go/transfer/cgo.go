// cgo.go - the kvx_xfer_* calls of include/kvx.h, one crossing each.
//
// kvx_last_error() is thread-local and a goroutine may change OS thread
// between two cgo calls, so every wrapper returns the code, its gRPC
// status (kvx_xfer_grpc_code) and the message from the same C call. The
// chunk's pointers are passed as plain arguments (cgo forbids Go memory
// holding Go pointers), and the C struct is built on the C stack.

package transfer

/*
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvx.h"

typedef struct xfer_rc {
	int rc;
	int grpc;
	char msg[512];
} xfer_rc;

static xfer_rc xfer_ret(int rc) {
	xfer_rc r;
	r.rc = rc;
	r.grpc = rc ? kvx_xfer_grpc_code(rc) : 0;
	r.msg[0] = 0;
	if (rc) snprintf(r.msg, sizeof r.msg, "%s", kvx_last_error());
	return r;
}

static xfer_rc xfer_has_blocks(uint8_t *held, kvx_xfer_lease **lease, void *s, const uint64_t *hashes,
                               size_t n, const uint32_t *tokens, size_t nt, uint32_t B, uint64_t sig) {
	return xfer_ret(kvx_xfer_has_blocks(held, lease, (kvx_store *)s, hashes, n, tokens, nt, B, sig));
}

static xfer_rc xfer_stream_create(kvx_xfer_stream **out, void *s) {
	return xfer_ret(kvx_xfer_stream_create(out, (kvx_store *)s));
}

static xfer_rc xfer_stream_chunk(kvx_xfer_stream *st, uint32_t fmt, uint64_t hash, const void *payload,
                                 size_t len, uint32_t crc, const uint32_t *tokens, size_t nt, uint64_t sig,
                                 kvx_xfer_block *out) {
	kvx_xfer_chunk c;
	memset(&c, 0, sizeof c);
	c.kv_format = fmt;
	c.block_hash = hash;
	c.payload = len ? payload : NULL;
	c.payload_len = len;
	c.crc32c = crc;
	c.tokens = nt ? tokens : NULL;
	c.n_tokens = nt;
	c.model_signature = sig;
	return xfer_ret(kvx_xfer_stream_chunk(st, &c, out));
}

static xfer_rc xfer_stream_finish(kvx_xfer_stream *st, kvx_xfer_result *out) {
	return xfer_ret(kvx_xfer_stream_finish(st, out));
}

static xfer_rc xfer_pick_format(uint16_t *out, const kvx_geometry *g, uint16_t req) {
	return xfer_ret(kvx_xfer_pick_format(out, g, req));
}

// One block of n_tokens (1..B) from a KVX page of g's quant (page_bytes(g,
// n_tokens) bytes; scales nullable) as a one-block envelope of version, hash
// 0 (a partial tail) or the block's, into buf of cap bytes.
static xfer_rc xfer_block_envelope(void *buf, size_t cap, uint16_t version, const kvx_geometry *g,
                                   uint64_t hash, const void *page, uint32_t n_tokens, const float *scales) {
	size_t P = kvx_envelope_payload_bytes(version, g);
	if (!P) return xfer_ret(kvx_xfer_pick_format(&version, g, version));
	uint8_t *pl = malloc(P);
	if (!pl) return xfer_ret(-ENOMEM);
	int rc = kvx_page_to_envelope_payload(pl, version, g, page, n_tokens, scales);
	if (!rc) {
		kvx_envelope_block_in b;
		memset(&b, 0, sizeof b);
		b.hash = hash;
		b.n_tokens = n_tokens;
		b.payload = pl;
		if (version == KVX_ENVELOPE_V2) b.scales = (const float *)(pl + P - kvx_scale_count(g) * 4);
		rc = kvx_envelope_export(buf, cap, version, g, &b, 1);
	}
	xfer_rc r = xfer_ret(rc);
	free(pl);
	return r;
}
*/
import "C"

import (
	"errors"
	"sync/atomic"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvx "kvx.dev/kvx"
)

// Error is a kvx transfer failure: the library's code, its gRPC status and
// the library's message (which names the block).
type Error struct {
	Code    int        // KVX_E* or -errno
	GRPC    codes.Code // kvx_xfer_grpc_code(Code)
	Message string
}

func (e *Error) Error() string { return "kvx transfer: " + e.Message }

// GRPCStatus lets status.FromError / status.Code see the code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.GRPC, e.Message) }

func fromC(r C.xfer_rc) error {
	if r.rc == 0 {
		return nil
	}
	return &Error{Code: int(r.rc), GRPC: codes.Code(r.grpc), Message: C.GoString(&r.msg[0])}
}

// GRPCCode is the status kvx_xfer_grpc_code gives a kvx code.
func GRPCCode(code int) codes.Code { return codes.Code(C.kvx_xfer_grpc_code(C.int(code))) }

// withC runs f on the store's C handle (kvx.Store.WithCStore).
func withC(s *kvx.Store, f func(cs unsafe.Pointer) error) error {
	err := s.WithCStore(f)
	var ke *kvx.Error
	if errors.As(err, &ke) { // ErrClosed and the like: not a transfer code
		return &Error{Code: ke.Code, GRPC: codes.Unavailable, Message: ke.Error()}
	}
	return err
}

func cGeometry(g kvx.Geometry) C.kvx_geometry {
	return C.kvx_geometry{
		num_layers: C.uint32_t(g.Layers), kv_heads: C.uint32_t(g.KVHeads),
		head_dim: C.uint32_t(g.HeadDim), block_tokens: C.uint32_t(g.BlockTokens),
		quant: C.uint32_t(g.Quant), model_signature: C.uint64_t(g.ModelSignature),
	}
}

// PickFormat is the envelope version a sender uses for a store of geometry
// g (kvx_xfer_pick_format): requested 0 applies the rule (FP16, E5M2 -> 1;
// E4M3 -> 2; BF16 -> 3 when a block fits 4 MiB, else 2), 1..3 is checked.
func PickFormat(g kvx.Geometry, requested uint16) (uint16, error) {
	cg := cGeometry(g)
	var v C.uint16_t
	if err := fromC(C.xfer_pick_format(&v, &cg, C.uint16_t(requested))); err != nil {
		return 0, err
	}
	return uint16(v), nil
}

// BlockEnvelope builds a one-block envelope of version from a KVX page of
// n tokens (1..B; len(page) = g.PageBytes(n)) in g's quant: what a sender
// pushes for a block it holds only in memory, such as the prompt's partial
// tail (hash 0; a full block's hash is its chained FNV-1a 64). scales: nil
// or L*2*Hkv FP8 scales.
func BlockEnvelope(g kvx.Geometry, version uint16, hash uint64, page []byte, nTokens uint32, scales []float32) ([]byte, error) {
	// len(page) 0: a geometry with a zero dimension (its pages are 0 bytes)
	if nTokens == 0 || nTokens > g.BlockTokens || len(page) == 0 || uint64(len(page)) != g.PageBytes(nTokens) {
		return nil, &Error{Code: int(kvx.CodeTokens), GRPC: codes.InvalidArgument,
			Message: "BlockEnvelope: the page is not one block of n tokens (1..B) of this geometry"}
	}
	if scales != nil && uint64(len(scales)) != g.ScaleCount() {
		return nil, &Error{Code: int(kvx.CodeInvalid), GRPC: codes.InvalidArgument,
			Message: "BlockEnvelope: scales must be nil or L*2*Hkv"}
	}
	cg := cGeometry(g)
	P := uint64(C.kvx_envelope_payload_bytes(C.uint16_t(version), &cg))
	size := 28 + 12 + P + 4
	buf := make([]byte, size)
	var sp *C.float
	if len(scales) > 0 {
		sp = (*C.float)(unsafe.Pointer(&scales[0]))
	}
	if err := fromC(C.xfer_block_envelope(unsafe.Pointer(&buf[0]), C.size_t(size), C.uint16_t(version), &cg,
		C.uint64_t(hash), unsafe.Pointer(&page[0]), C.uint32_t(nTokens), sp)); err != nil {
		return nil, err
	}
	return buf, nil
}

// lease is a C lease (kvx_xfer_lease *).
type cLease = *C.kvx_xfer_lease

// hasBlocks is kvx_xfer_has_blocks on s.
func hasBlocks(s *kvx.Store, hashes []uint64, tokens []uint32, blockTokens uint32, sig uint64) ([]bool, cLease, error) {
	held := make([]byte, len(hashes)+1)
	var l *C.kvx_xfer_lease
	var hp *C.uint64_t
	if len(hashes) > 0 {
		hp = (*C.uint64_t)(unsafe.Pointer(&hashes[0]))
	}
	var tp *C.uint32_t
	if len(tokens) > 0 {
		tp = (*C.uint32_t)(unsafe.Pointer(&tokens[0]))
	}
	err := withC(s, func(cs unsafe.Pointer) error {
		return fromC(C.xfer_has_blocks((*C.uint8_t)(unsafe.Pointer(&held[0])), &l, cs, hp, C.size_t(len(hashes)),
			tp, C.size_t(len(tokens)), C.uint32_t(blockTokens), C.uint64_t(sig)))
	})
	if err != nil {
		return nil, nil, err
	}
	out := make([]bool, len(hashes))
	for i := range out {
		out[i] = held[i] != 0
	}
	return out, l, nil
}

// destroyHook, when set (tests), runs inside the destroys' critical section.
var destroyHook atomic.Pointer[func()]

func runDestroyHook() {
	if h := destroyHook.Load(); h != nil {
		(*h)()
	}
}

// destroyLease unpins lease l of store s. Under the store's read lock: a
// Close of the store waits for it (after a close it only frees).
func destroyLease(s *kvx.Store, l cLease) {
	s.WithCloseExcluded(func() {
		runDestroyHook()
		C.kvx_xfer_lease_destroy(l)
	})
}

// BlockInfo is what one accepted chunk was (kvx_xfer_block).
type BlockInfo struct {
	Index      uint32 // position in the stream, 0 first
	NTokens    uint32
	Hash       uint64 // recomputed from the tokens; 0 for the tail
	Stored     bool   // newly written (durable once the push is answered)
	Referenced bool   // empty payload, found held
	Tail       bool   // the partial tail: checked, never stored
}

// Result is PushKvResponse's fields (kvx_xfer_result).
type Result struct {
	BlocksStored     uint32
	BlocksReferenced uint32
	BytesReceived    uint64
	TailTokens       uint32
	Durable          bool
}

func resultFromC(r *C.kvx_xfer_result) Result {
	return Result{BlocksStored: uint32(r.blocks_stored), BlocksReferenced: uint32(r.blocks_referenced),
		BytesReceived: uint64(r.bytes_received), TailTokens: uint32(r.tail_tokens), Durable: r.durable != 0}
}

// cStream is one kvx_xfer_stream; owned by one goroutine at a time.
type cStream struct {
	s  *kvx.Store
	st *C.kvx_xfer_stream
}

func newCStream(s *kvx.Store) (*cStream, error) {
	var st *C.kvx_xfer_stream
	err := withC(s, func(cs unsafe.Pointer) error { return fromC(C.xfer_stream_create(&st, cs)) })
	if err != nil {
		return nil, err
	}
	return &cStream{s: s, st: st}, nil
}

// Chunk is the fields of one KvChunk the core checks.
type Chunk struct {
	KvFormat       uint32
	BlockHash      uint64
	Payload        []byte
	CRC32C         uint32
	Tokens         []uint32
	ModelSignature uint64
}

func (c *cStream) chunk(k *Chunk) (BlockInfo, error) {
	var b C.kvx_xfer_block
	var pp unsafe.Pointer
	if len(k.Payload) > 0 {
		pp = unsafe.Pointer(&k.Payload[0])
	}
	var tp *C.uint32_t
	if len(k.Tokens) > 0 {
		tp = (*C.uint32_t)(unsafe.Pointer(&k.Tokens[0]))
	}
	err := withC(c.s, func(unsafe.Pointer) error {
		return fromC(C.xfer_stream_chunk(c.st, C.uint32_t(k.KvFormat), C.uint64_t(k.BlockHash), pp,
			C.size_t(len(k.Payload)), C.uint32_t(k.CRC32C), tp, C.size_t(len(k.Tokens)),
			C.uint64_t(k.ModelSignature), &b))
	})
	if err != nil {
		return BlockInfo{}, err
	}
	return BlockInfo{Index: uint32(b.index), NTokens: uint32(b.n_tokens), Hash: uint64(b.hash),
		Stored: b.stored != 0, Referenced: b.referenced != 0, Tail: b.tail != 0}, nil
}

func (c *cStream) finish() (Result, error) {
	var r C.kvx_xfer_result
	err := withC(c.s, func(unsafe.Pointer) error { return fromC(C.xfer_stream_finish(c.st, &r)) })
	return resultFromC(&r), err
}

func (c *cStream) progress() Result {
	var r C.kvx_xfer_result
	C.kvx_xfer_stream_progress(&r, c.st)
	return resultFromC(&r)
}

// destroy drops what an unfinished stream wrote and frees it, under the
// store's read lock as destroyLease.
func (c *cStream) destroy() {
	if c.st != nil {
		c.s.WithCloseExcluded(func() {
			runDestroyHook()
			C.kvx_xfer_stream_destroy(c.st)
		})
		c.st = nil
	}
}
