// client.go - the sender: the cached prefix of a prompt from a local store
// to a remote receiver, only the blocks it lacks.

package transfer

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	mrand "math/rand"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C is KvChunk.crc32c of a payload.
func CRC32C(payload []byte) uint32 { return crc32.Checksum(payload, castagnoli) }

// Client pushes to one receiver.
type Client struct {
	c tlkvpb.KvTransferClient
}

// NewClient uses conn (grpc.Dial's); the caller closes it.
func NewClient(conn grpc.ClientConnInterface) *Client {
	return &Client{c: tlkvpb.NewKvTransferClient(conn)}
}

// Tail is the prompt's partial last block, which a sender holds only in
// memory (stores keep full blocks): its token ids (1..B-1, the prompt's
// ids after the pushed full blocks) and its one-block envelope
// (BlockEnvelope with hash 0).
type Tail struct {
	Tokens   []uint32
	Envelope []byte
}

// PushOptions tune Push; the zero value is the protocol's default.
type PushOptions struct {
	Format      uint16 // envelope version; 0 = PickFormat's rule for the store
	Tail        *Tail  // nil: full blocks only
	NoHasBlocks bool   // send every block's payload (what dedup saves is measured against this)
	NoRetry     bool   // on ABORTED (a block reported held is gone) fail instead of resending with payloads; on a busy HasBlocks fail instead of retrying
	MaxBlocks   int    // 0 = every cached block of the prompt
}

// A HasBlocks refused as busy is sent again hasBlocksRetries times, first
// after hasBlocksRetry, each wait twice the last plus up to as much
// jitter: 8 ms to 1,024 ms, 2.04 to 4.08 s in all.
const (
	hasBlocksRetry   = 8 * time.Millisecond
	hasBlocksRetries = 8
)

// PushResult says what a push moved; the receiver's counts are Response.
type PushResult struct {
	BlocksSent       uint32 // chunks sent with a payload (the tail included)
	BlocksReferenced uint32 // full blocks sent empty and found held
	BytesSent        uint64 // payload bytes sent, no framing
	TailTokens       uint32
	Durable          bool
	Retried          bool // an ABORTED push was sent again with every payload
	HasBlocksBusy    bool // HasBlocks stayed refused as busy: every payload was sent
	Response         *tlkvpb.PushKvResponse
}

// Push sends the cached prefix of tokens held in store (verified full
// blocks, kvx.Store.Prefix) and opts.Tail: HasBlocks with the prompt's
// tokens, then one PushKv stream, block 0 first, an empty payload for each
// block the receiver holds and a one-block envelope with its CRC-32C for
// every other. It returns nil once the receiver acknowledged the push: it
// answered durable=true with counts matching what was sent (otherwise an
// *AckError, errors.Is ErrNotAcknowledged, naming the field).
// An ABORTED answer (a block reported held was evicted meanwhile) is
// retried once with every payload unless opts.NoRetry. A HasBlocks the
// receiver refused as busy (UNAVAILABLE: kvxd's --max-has-blocks) is
// retried with backoff (hasBlocksRetries, 2 to 4 s in all); if it stays
// refused, the push sends every payload (PushResult.HasBlocksBusy), as
// with NoHasBlocks. With opts.NoRetry the refusal is the push's error.
func (c *Client) Push(ctx context.Context, store *kvx.Store, tokens []uint32, opts *PushOptions) (PushResult, error) {
	var o PushOptions
	if opts != nil {
		o = *opts
	}
	g := store.Geometry()
	B := int(g.BlockTokens)
	version, err := PickFormat(g, o.Format)
	if err != nil {
		return PushResult{}, err
	}
	max := len(tokens) / B
	if o.MaxBlocks > 0 && o.MaxBlocks < max {
		max = o.MaxBlocks
	}
	var hashes []uint64
	if max > 0 {
		v, err := store.PrefixMax(tokens, max)
		if err != nil {
			return PushResult{}, err
		}
		hashes = make([]uint64, v.Len())
		for i := range hashes {
			hashes[i] = v.At(i).Hash()
		}
		v.Release()
	}
	n := len(hashes)
	if o.Tail != nil {
		t := o.Tail.Tokens
		if len(t) == 0 || len(t) >= B || len(tokens) < n*B+len(t) {
			return PushResult{}, fmt.Errorf("kvx transfer: the tail must be 1..%d tokens following the %d cached blocks", B-1, n)
		}
		for i, id := range t {
			if tokens[n*B+i] != id {
				return PushResult{}, fmt.Errorf("kvx transfer: tail token %d is not the prompt's token %d", i, n*B+i)
			}
		}
	}
	held := make([]bool, n)
	var leaseID string
	busy := false
	if !o.NoHasBlocks && n > 0 {
		req := &tlkvpb.HasBlocksRequest{BlockHashes: hashes, Tokens: tokens[:n*B], BlockTokens: uint32(B),
			ModelSignature: g.ModelSignature}
		resp, err := c.c.HasBlocks(ctx, req)
		wait := hasBlocksRetry
		for i := 0; i < hasBlocksRetries && status.Code(err) == codes.Unavailable && !o.NoRetry; i++ {
			select {
			case <-ctx.Done():
				return PushResult{}, status.FromContextError(ctx.Err()).Err()
			case <-time.After(wait + time.Duration(mrand.Int63n(int64(wait)))):
			}
			wait *= 2
			resp, err = c.c.HasBlocks(ctx, req)
		}
		switch {
		case status.Code(err) == codes.Unavailable && !o.NoRetry:
			busy = true // every payload goes, as with NoHasBlocks
		case err != nil:
			return PushResult{}, err
		case len(resp.Held) != n:
			return PushResult{}, fmt.Errorf("kvx transfer: HasBlocks answered %d held flags for %d blocks", len(resp.Held), n)
		default:
			held, leaseID = resp.Held, resp.LeaseId
		}
	}
	r, err := c.stream(ctx, store, tokens, hashes, held, leaseID, version, o.Tail)
	if status.Code(err) == codes.Aborted && !o.NoRetry {
		r, err = c.stream(ctx, store, tokens, hashes, make([]bool, n), "", version, o.Tail)
		r.Retried = true
	}
	r.HasBlocksBusy = busy
	return r, err
}

func (c *Client) stream(ctx context.Context, store *kvx.Store, tokens []uint32, hashes []uint64, held []bool,
	leaseID string, version uint16, tail *Tail) (PushResult, error) {
	g := store.Geometry()
	B := int(g.BlockTokens)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.c.PushKv(ctx)
	if err != nil {
		return PushResult{}, err
	}
	var r PushResult
	send := func(ch *tlkvpb.KvChunk) error {
		if err := st.Send(ch); err != nil {
			if errors.Is(err, io.EOF) { // the receiver ended the stream: its status says why
				_, err = st.CloseAndRecv()
			}
			return err
		}
		return nil
	}
	// The envelopes are made one block ahead of the send (a goroutine), so
	// the local export (lookup, CRC check, conversion) overlaps the wire.
	type made struct {
		ch  *tlkvpb.KvChunk
		err error
	}
	ahead := make(chan made, 2)
	go func() {
		defer close(ahead)
		for i, h := range hashes {
			ch := &tlkvpb.KvChunk{KvFormat: uint32(version), BlockHash: h, Tokens: tokens[i*B : (i+1)*B],
				ModelSignature: g.ModelSignature}
			if i == 0 {
				ch.LeaseId = leaseID
			}
			var err error
			if !held[i] {
				ch.Payload, err = blockEnvelope(store, tokens[:(i+1)*B], h, version)
				ch.Crc32C = CRC32C(ch.Payload)
			}
			select {
			case ahead <- made{ch, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() { // the producer ends once ctx is canceled (deferred above)
		cancel()
		for range ahead {
		}
	}()
	for m := range ahead {
		if m.err != nil {
			return r, m.err
		}
		if len(m.ch.Payload) == 0 {
			r.BlocksReferenced++
		} else {
			r.BlocksSent++
			r.BytesSent += uint64(len(m.ch.Payload))
		}
		if err := send(m.ch); err != nil {
			return r, err
		}
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if tail != nil {
		ch := &tlkvpb.KvChunk{KvFormat: uint32(version), Payload: tail.Envelope, Crc32C: CRC32C(tail.Envelope),
			Tokens: tail.Tokens, ModelSignature: g.ModelSignature}
		if len(hashes) == 0 {
			ch.LeaseId = leaseID
		}
		r.BlocksSent++
		r.BytesSent += uint64(len(tail.Envelope))
		if err := send(ch); err != nil {
			return r, err
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return r, err
	}
	r.Response = resp
	r.TailTokens = resp.TailTokens
	r.Durable = resp.Durable
	tailTokens := 0
	if tail != nil {
		tailTokens = len(tail.Tokens)
	}
	return r, checkAck(resp, len(hashes), r.BlocksReferenced, r.BytesSent, tailTokens)
}

// ErrNotAcknowledged matches (errors.Is) every *AckError: the receiver
// answered the push, but its answer does not acknowledge what was sent.
var ErrNotAcknowledged = errors.New("kvx transfer: the receiver's answer does not acknowledge the push")

// AckError is Push's error when the receiver answered without error but
// its PushKvResponse does not acknowledge the push as sent: durable false
// (the blocks may not survive a crash), or a count that differs from what
// was sent. Nothing of the push may be taken as delivered: a sender must
// not free the KV it pushed. Field is the PushKvResponse field at fault
// (the first checked: "durable", "blocks_referenced", "bytes_received",
// "tail_tokens", "blocks_stored"); Got is the receiver's value, Want what
// the sender expected (for blocks_stored, the most it may be).
type AckError struct {
	Field     string
	Got, Want uint64
	Response  *tlkvpb.PushKvResponse
}

func (e *AckError) Error() string {
	if e.Field == "durable" {
		return "kvx transfer: the receiver answered durable=false: the push is not acknowledged"
	}
	if e.Field == "blocks_stored" {
		return fmt.Sprintf("kvx transfer: the receiver answered blocks_stored=%d, more than the %d full blocks sent with a payload: the push is not acknowledged",
			e.Got, e.Want)
	}
	return fmt.Sprintf("kvx transfer: the receiver answered %s=%d, the sender sent %d: the push is not acknowledged",
		e.Field, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrNotAcknowledged) true.
func (e *AckError) Is(target error) bool { return target == ErrNotAcknowledged }

// checkAck is nil when resp acknowledges a stream of fullBlocks full
// blocks, referenced of them sent empty, bytesSent payload bytes and a
// tail of tailTokens tokens (0: none). A block sent with its payload that
// the receiver already held counts in neither blocks_stored nor
// blocks_referenced, so blocks_stored may be less than the blocks sent
// with a payload, never more.
func checkAck(resp *tlkvpb.PushKvResponse, fullBlocks int, referenced uint32, bytesSent uint64, tailTokens int) error {
	fail := func(field string, got, want uint64) error {
		return &AckError{Field: field, Got: got, Want: want, Response: resp}
	}
	switch {
	case !resp.Durable:
		return fail("durable", 0, 1)
	case resp.BlocksReferenced != referenced:
		return fail("blocks_referenced", uint64(resp.BlocksReferenced), uint64(referenced))
	case resp.BytesReceived != bytesSent:
		return fail("bytes_received", resp.BytesReceived, bytesSent)
	case uint64(resp.TailTokens) != uint64(tailTokens):
		return fail("tail_tokens", uint64(resp.TailTokens), uint64(tailTokens))
	case uint64(resp.BlocksStored)+uint64(resp.BlocksReferenced) > uint64(fullBlocks):
		return fail("blocks_stored", uint64(resp.BlocksStored), uint64(fullBlocks)-uint64(referenced))
	}
	return nil
}

// blockEnvelope is the one-block envelope of the block ending at the last
// full block of prefix (matched by digest, CRC-checked by the export).
func blockEnvelope(store *kvx.Store, prefix []uint32, hash uint64, version uint16) ([]byte, error) {
	v, err := store.GetBlock(prefix)
	if err != nil {
		return nil, err
	}
	defer v.Release()
	if v.Len() != 1 || v.At(0).Hash() != hash {
		return nil, fmt.Errorf("kvx transfer: block %016x changed in the local store during the push", hash)
	}
	return store.Export(v, version)
}
