// transfer_test.go - the protocol through a Server on loopback gRPC: dedup
// byte counts, every status code with nothing published, leases, limits,
// the FNV collision, concurrent pushers, streams cut at every point, the
// sink.
package transfer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

// A second push of the same prompt moves only what is missing: bytes =
// (missing full blocks + 1 tail) x envelope size, exactly; the sink sees
// every block, the tail included (never stored).
// PROMISE: XFER-2, XFER-4
func TestPushDedup(t *testing.T) {
	ctx := context.Background()
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	const nb = 6
	tokens := tokensOf(1, nb*B+3)
	putPrompt(t, a, tokens)
	rec := &recorder{}
	ts := startServer(t, b, ServerOptions{Sink: rec})
	c := NewClient(dial(t, ts.addr))
	env := uint64(envSize(1))

	// 1: the first 2 blocks only
	r, err := c.Push(ctx, a, tokens, &PushOptions{MaxBlocks: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.BlocksSent != 2 || r.BlocksReferenced != 0 || r.BytesSent != 2*env || !r.Durable || r.Response.BlocksStored != 2 {
		t.Fatalf("first push: %+v %+v", r, r.Response)
	}
	if got := served(t, b, tokens); got != 2 {
		t.Fatalf("receiver serves %d blocks, want 2", got)
	}
	// 2: all 6 and a 3-token tail: 4 missing + 1 tail move
	tail := tailOf(t, tokens, nb, 3)
	r, err = c.Push(ctx, a, tokens, &PushOptions{Tail: tail})
	if err != nil {
		t.Fatal(err)
	}
	if r.BlocksSent != 5 || r.BlocksReferenced != 2 || r.BytesSent != (4+1)*env || r.TailTokens != 3 || !r.Durable {
		t.Fatalf("second push: %+v", r)
	}
	resp := r.Response
	if resp.BlocksStored != 4 || resp.BlocksReferenced != 2 || resp.BytesReceived != (4+1)*env || resp.TailTokens != 3 {
		t.Fatalf("second push, the receiver's answer: %+v", resp)
	}
	if got := served(t, b, tokens); got != nb {
		t.Fatalf("receiver serves %d blocks, want %d", got, nb)
	}
	// 3: everything held: the tail alone moves
	r, err = c.Push(ctx, a, tokens, &PushOptions{Tail: tail})
	if err != nil {
		t.Fatal(err)
	}
	if r.BlocksSent != 1 || r.BlocksReferenced != nb || r.BytesSent != env || r.Response.BlocksStored != 0 {
		t.Fatalf("third push: %+v %+v", r, r.Response)
	}
	// without HasBlocks every block moves
	r, err = c.Push(ctx, a, tokens, &PushOptions{NoHasBlocks: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.BytesSent != nb*env || r.Response.BlocksStored != 0 {
		t.Fatalf("push without HasBlocks: %+v %+v", r, r.Response)
	}

	blocks, done := rec.snapshot()
	// 2 + 7 + 7 + 6 blocks seen, in order, the tails with their payload
	if len(blocks) != 22 || len(done) != 4 {
		t.Fatalf("sink saw %d blocks, %d ends", len(blocks), len(done))
	}
	for _, err := range done {
		if err != nil {
			t.Fatalf("sink Done: %v", err)
		}
	}
	last := blocks[8]
	if !last.Tail || last.NTokens != 3 || string(last.Payload) != string(tail.Envelope) || last.Index != nb {
		t.Fatalf("sink's tail: %+v", last.BlockInfo)
	}
	if b0 := blocks[2]; !b0.Referenced || b0.Payload != nil || b0.Hash != kvx.BlockHashes(tokens, B)[0] {
		t.Fatalf("sink's referenced block 0: %+v", b0.BlockInfo)
	}
	if b2 := blocks[4]; !b2.Stored || len(b2.Payload) != int(env) {
		t.Fatalf("sink's stored block 2: %+v", b2.BlockInfo)
	}
	if ts.Leases() != 0 {
		t.Fatalf("%d leases left after the pushes", ts.Leases())
	}
}

// statusCase: chunks that fail a stream, and the code they must get.
type statusCase struct {
	name   string
	code   codes.Code
	msg    string // a substring of the status message ("" = any)
	chunks func(t *testing.T, a, odd *kvx.Store, tokens []uint32) []*tlkvpb.KvChunk
}

// Every status code of the protocol; each stream starts with a valid block
// 0 (which would be stored) and nothing of it may be published.
// PROMISE: XFER-8, XFER-10, XFER-11, XFER-16
func TestStatusCodesPublishNothing(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	oddGeom := testGeom
	oddGeom.HeadDim = 8 // same B, other dimensions
	odd, _ := createStore(t, oddGeom, 0)
	tokens := tokensOf(2, 3*B)
	putPrompt(t, a, tokens)
	putPrompt(t, odd, tokens)
	h := kvx.BlockHashes(tokens, B)
	good := func(t *testing.T, i int) *tlkvpb.KvChunk { return chunkOf(t, a, tokens, i, false) }
	with := func(f func(c *tlkvpb.KvChunk)) func(t *testing.T, a, odd *kvx.Store, tokens []uint32) []*tlkvpb.KvChunk {
		return func(t *testing.T, a, odd *kvx.Store, tokens []uint32) []*tlkvpb.KvChunk {
			c := good(t, 1)
			f(c)
			return []*tlkvpb.KvChunk{good(t, 0), c}
		}
	}
	recrc := func(c *tlkvpb.KvChunk) { c.Crc32C = CRC32C(c.Payload) }
	cases := []statusCase{
		{"kv_format 0", codes.FailedPrecondition, "", with(func(c *tlkvpb.KvChunk) { c.KvFormat = 0 })},
		{"kv_format 9", codes.FailedPrecondition, "", with(func(c *tlkvpb.KvChunk) { c.KvFormat = 9; c.Payload = []byte("not even an envelope") })},
		{"wrong model_signature", codes.FailedPrecondition, "", with(func(c *tlkvpb.KvChunk) { c.ModelSignature = 0xdead })},
		{"payload over 4 MiB", codes.DataLoss, "", with(func(c *tlkvpb.KvChunk) {
			c.Payload = make([]byte, MaxPayload+1)
			recrc(c)
		})},
		{"n_blocks 2", codes.DataLoss, "", func(t *testing.T, a, odd *kvx.Store, tokens []uint32) []*tlkvpb.KvChunk {
			v, err := a.Prefix(tokens[:2*B])
			if err != nil || v.Len() != 2 {
				t.Fatalf("Prefix: %v", err)
			}
			env, err := a.Export(v, 1)
			v.Release()
			if err != nil {
				t.Fatal(err)
			}
			c := good(t, 1)
			c.Payload = env
			recrc(c)
			return []*tlkvpb.KvChunk{good(t, 0), c}
		}},
		{"envelope hash not the chunk's", codes.DataLoss, "", with(func(c *tlkvpb.KvChunk) {
			c.Payload = envelopeOf(t, a, tokens, 0, 1) // block 0's envelope in block 1's chunk
			recrc(c)
		})},
		{"crc32c mismatch", codes.DataLoss, "", with(func(c *tlkvpb.KvChunk) { c.Crc32C ^= 1 })},
		{"payload bit flipped, crc32c of it", codes.DataLoss, "", with(func(c *tlkvpb.KvChunk) {
			c.Payload[len(c.Payload)/2] ^= 0x40
			recrc(c)
		})},
		{"tokens not hashing to block_hash", codes.DataLoss, "", with(func(c *tlkvpb.KvChunk) {
			c.Tokens = append([]uint32(nil), c.Tokens...)
			c.Tokens[0]++
		})},
		{"block_hash not the chain", codes.DataLoss, "", with(func(c *tlkvpb.KvChunk) { c.BlockHash ^= 1 })},
		{"dimensions differ", codes.DataLoss, "", with(func(c *tlkvpb.KvChunk) {
			c.Payload = envelopeOf(t, odd, tokens, 1, 1)
			recrc(c)
		})},
		{"empty payload, never leased", codes.Aborted, fmt.Sprintf("%016x", h[1]), with(func(c *tlkvpb.KvChunk) {
			c.Payload, c.Crc32C = nil, 0
		})},
		{"empty payload, unknown lease", codes.Aborted, fmt.Sprintf("%016x", h[1]), with(func(c *tlkvpb.KvChunk) {
			c.Payload, c.Crc32C, c.LeaseId = nil, 0, "0123456789abcdef0123456789abcdef"
		})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := createStore(t, testGeom, 0)
			ts := startServer(t, b, ServerOptions{})
			conn := dial(t, ts.addr)
			_, err := pushChunks(context.Background(), conn, tc.chunks(t, a, odd, tokens))
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want %v", err, tc.code)
			}
			if tc.msg != "" && !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("message %q does not name %q", status.Convert(err).Message(), tc.msg)
			}
			if n := served(t, b, tokens); n != 0 {
				t.Fatalf("%d blocks published by a failed stream", n)
			}
			if n := blocksIn(t, b); n != 0 {
				t.Fatalf("stat: %d blocks after a failed stream", n)
			}
			// the receiver still takes the prompt afterwards
			if _, err := NewClient(conn).Push(context.Background(), a, tokens, nil); err != nil {
				t.Fatalf("a good push after: %v", err)
			}
			if n := served(t, b, tokens); n != 3 {
				t.Fatalf("served %d after a good push", n)
			}
		})
	}
}

// HasBlocks: hashes that are not the chain of the tokens are
// INVALID_ARGUMENT (and pin nothing); a model_signature not the store's is
// FAILED_PRECONDITION; B other than the store's INVALID_ARGUMENT.
// PROMISE: XFER-8, XFER-12, XFER-18
func TestHasBlocksStatus(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(3, 4*B)
	putPrompt(t, a, tokens)
	putPrompt(t, b, tokens)
	ts := startServer(t, b, ServerOptions{})
	c := tlkvpb.NewKvTransferClient(dial(t, ts.addr))
	ctx := context.Background()
	h := kvx.BlockHashes(tokens, B)
	bad := append([]uint64(nil), h...)
	bad[2] ^= 1
	for _, tc := range []struct {
		name string
		req  *tlkvpb.HasBlocksRequest
		code codes.Code
	}{
		{"not the chain", &tlkvpb.HasBlocksRequest{BlockHashes: bad, Tokens: tokens}, codes.InvalidArgument},
		{"fewer tokens than blocks", &tlkvpb.HasBlocksRequest{BlockHashes: h, Tokens: tokens[:3*B]}, codes.InvalidArgument},
		{"other block_tokens", &tlkvpb.HasBlocksRequest{BlockHashes: h, Tokens: tokens, BlockTokens: 8}, codes.InvalidArgument},
		{"other model", &tlkvpb.HasBlocksRequest{BlockHashes: h, Tokens: tokens, ModelSignature: 7}, codes.FailedPrecondition},
	} {
		_, err := c.HasBlocks(ctx, tc.req)
		if status.Code(err) != tc.code {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.code)
		}
	}
	if ts.Leases() != 0 {
		t.Fatalf("a refused HasBlocks left %d leases", ts.Leases())
	}
	resp, err := c.HasBlocks(ctx, &tlkvpb.HasBlocksRequest{BlockHashes: h, Tokens: append(tokens, 1, 2), BlockTokens: B,
		ModelSignature: testGeom.ModelSignature})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Held) != 4 || !resp.Held[0] || !resp.Held[3] || len(resp.LeaseId) != 32 || resp.LeaseTtlMs != 30000 {
		t.Fatalf("HasBlocks: %+v", resp)
	}
	resp2, err := c.HasBlocks(ctx, &tlkvpb.HasBlocksRequest{BlockHashes: h, Tokens: tokens})
	if err != nil || resp2.LeaseId == resp.LeaseId {
		t.Fatalf("a second lease: %v %q", err, resp2.GetLeaseId())
	}
	if ts.Leases() != 2 {
		t.Fatalf("%d leases, want 2", ts.Leases())
	}
	// nothing held: no lease kept
	other := tokensOf(4, 2*B)
	resp3, err := c.HasBlocks(ctx, &tlkvpb.HasBlocksRequest{BlockHashes: kvx.BlockHashes(other, B), Tokens: other})
	if err != nil || resp3.LeaseId != "" || resp3.Held[0] || resp3.Held[1] {
		t.Fatalf("HasBlocks of blocks not held: %v %+v", err, resp3)
	}
}

// fill evicts: other prompts fill a small store several times over.
func fill(t *testing.T, s *kvx.Store, n int) {
	t.Helper()
	for seq := 100; seq < 100+n; seq++ {
		putPrompt(t, s, tokensOf(seq, 8*B))
	}
	if err := s.GC(); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stat()
	if err != nil || st.Evictions == 0 {
		t.Fatalf("no eviction: %+v %v", st, err)
	}
}

// A lease pins what HasBlocks reported held until it expires; a push that
// names an expired lease whose blocks were evicted meanwhile gets ABORTED
// (nothing published), and Client.Push then resends with payloads.
// PROMISE: XFER-11, XFER-18
func TestLeaseExpiresBeforePush(t *testing.T) {
	for _, expire := range []bool{false, true} {
		t.Run(fmt.Sprintf("expire=%v", expire), func(t *testing.T) {
			a, _ := createStore(t, testGeom, 0)
			b, _ := createStore(t, testGeom, 1<<20)
			const nb = 8
			tokens := tokensOf(5, nb*B)
			putPrompt(t, a, tokens)
			ttl := time.Hour
			if expire {
				ttl = 150 * time.Millisecond
			}
			ts := startServer(t, b, ServerOptions{LeaseTTL: ttl})
			conn := dial(t, ts.addr)
			c := NewClient(conn)
			ctx := context.Background()
			if _, err := c.Push(ctx, a, tokens, nil); err != nil {
				t.Fatal(err)
			}
			resp, err := tlkvpb.NewKvTransferClient(conn).HasBlocks(ctx, &tlkvpb.HasBlocksRequest{
				BlockHashes: kvx.BlockHashes(tokens, B), Tokens: tokens})
			if err != nil || resp.LeaseId == "" {
				t.Fatalf("HasBlocks: %v %+v", err, resp)
			}
			for i, h := range resp.Held {
				if !h {
					t.Fatalf("block %d not held", i)
				}
			}
			if expire {
				deadline := time.Now().Add(5 * time.Second)
				for ts.Leases() != 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if ts.Leases() != 0 {
					t.Fatal("the lease did not expire")
				}
			}
			fill(t, b, 64)
			var chunks []*tlkvpb.KvChunk
			for i := 0; i < nb; i++ {
				ch := chunkOf(t, a, tokens, i, true)
				ch.LeaseId = resp.LeaseId
				chunks = append(chunks, ch)
			}
			blocksBefore := blocksIn(t, b)
			r, err := pushChunks(ctx, conn, chunks)
			if !expire {
				if err != nil || r.BlocksReferenced != nb {
					t.Fatalf("push under a live lease: %v %+v", err, r)
				}
				if ts.Leases() != 0 {
					t.Fatal("the push did not release its lease")
				}
				if n := served(t, b, tokens); n != nb {
					t.Fatalf("served %d, want %d", n, nb)
				}
				return
			}
			if status.Code(err) != codes.Aborted {
				t.Fatalf("push after the lease expired and eviction: %v, want ABORTED", err)
			}
			if n := served(t, b, tokens); n == nb {
				t.Fatalf("the evicted prompt is served whole after a failed push")
			}
			if n := blocksIn(t, b); n != blocksBefore {
				t.Fatalf("the ABORTED push changed the store: %d blocks, %d before", n, blocksBefore)
			}
			pr, err := c.Push(ctx, a, tokens, nil)
			if err != nil || pr.Response.BlocksStored+pr.BlocksReferenced != nb {
				t.Fatalf("Client.Push after: %v %+v", err, pr)
			}
			if n := served(t, b, tokens); n != nb {
				t.Fatalf("served %d after the resend, want %d", n, nb)
			}
		})
	}
}

// An empty payload for a block reported held only later evicted, with the
// client's retry: ABORTED is answered by a resend with every payload.
// PROMISE: XFER-18
func TestClientRetriesAborted(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(6, 3*B)
	putPrompt(t, a, tokens)
	ts := startServer(t, b, ServerOptions{})
	conn := dial(t, ts.addr)
	// a sender that claims the receiver holds block 0 (it does not)
	ch := chunkOf(t, a, tokens, 0, true)
	_, err := pushChunks(context.Background(), conn, []*tlkvpb.KvChunk{ch, chunkOf(t, a, tokens, 1, false)})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("got %v, want ABORTED", err)
	}
	if served(t, b, tokens) != 0 {
		t.Fatal("published after ABORTED")
	}
}

// --max-stream-bytes and --max-streams: RESOURCE_EXHAUSTED, nothing published.
// PROMISE: XFER-14
func TestStreamLimits(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(7, 3*B)
	putPrompt(t, a, tokens)
	rec := &recorder{seen: make(chan struct{}, 4)}
	ts := startServer(t, b, ServerOptions{MaxStreamBytes: uint64(2 * envSize(1)), MaxStreams: 1, Sink: rec})
	conn := dial(t, ts.addr)
	_, err := NewClient(conn).Push(context.Background(), a, tokens, nil)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("3 blocks over a 2-block limit: %v", err)
	}
	if served(t, b, tokens) != 0 {
		t.Fatal("published over the byte limit")
	}
	// one stream open, a second refused
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := tlkvpb.NewKvTransferClient(conn).PushKv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for len(rec.seen) > 0 { // the first push's blocks
		<-rec.seen
	}
	if err := st.Send(chunkOf(t, a, tokens, 0, false)); err != nil {
		t.Fatal(err)
	}
	select { // the open stream's handler holds the one slot
	case <-rec.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the open stream's chunk was not seen")
	}
	_, err = pushChunks(context.Background(), conn, []*tlkvpb.KvChunk{chunkOf(t, a, tokens, 0, false)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second stream over --max-streams 1: %v", err)
	}
	cancel()
	if served(t, b, tokens) != 0 {
		t.Fatal("published by a canceled stream")
	}
}

// A crafted FNV collision: the receiver holds block X, the sender's block
// Y has the same chained hash. Reported held by hash alone (HasBlocks
// without tokens), Y sent empty is ABORTED (never a reference to X);
// resent with its payload it is stored beside X and each prompt gets its
// own bytes.
// PROMISE: XFER-3, XFER-11
func TestCollisionNeverReferencesWrongBlock(t *testing.T) {
	collA := []uint32{2849051040, 4145281261, 3375848879, 1394986490}
	collB := []uint32{2849051040, 4145281261, 3465670547, 1026208435}
	ha, hb := kvx.BlockHashes(collA, B), kvx.BlockHashes(collB, B)
	if ha[0] != hb[0] {
		t.Fatalf("the fixture does not collide: %x %x", ha[0], hb[0])
	}
	a, _ := createStore(t, testGeom, 0) // sender: Y
	b, _ := createStore(t, testGeom, 0) // receiver: X
	pb := int(testGeom.PageBytes(B))
	pageX, pageY := make([]byte, pb), make([]byte, pb)
	fillPage(pageX, 1)
	fillPage(pageY, 2)
	if _, err := b.Put(collA, pageX, nil); err != nil || b.Flush() != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(collB, pageY, nil); err != nil || a.Flush() != nil {
		t.Fatal(err)
	}
	ts := startServer(t, b, ServerOptions{})
	conn := dial(t, ts.addr)
	ctx := context.Background()
	resp, err := tlkvpb.NewKvTransferClient(conn).HasBlocks(ctx, &tlkvpb.HasBlocksRequest{BlockHashes: hb})
	if err != nil || len(resp.Held) != 1 || !resp.Held[0] {
		t.Fatalf("HasBlocks by hash alone: %v %+v", err, resp)
	}
	ch := &tlkvpb.KvChunk{KvFormat: 1, BlockHash: hb[0], Tokens: collB, LeaseId: resp.LeaseId}
	_, err = pushChunks(ctx, conn, []*tlkvpb.KvChunk{ch})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("Y sent empty: %v, want ABORTED", err)
	}
	if v, err := b.GetBlock(collB); err == nil {
		v.Release()
		t.Fatal("Y is served after the ABORTED push")
	}
	// the client: HasBlocks with tokens says not held; Y moves with its payload
	r, err := NewClient(conn).Push(ctx, a, collB, nil)
	if err != nil || r.BlocksSent != 1 || r.Response.BlocksStored != 1 {
		t.Fatalf("Client.Push of Y: %v %+v", err, r)
	}
	for _, c := range []struct {
		toks []uint32
		page []byte
	}{{collA, pageX}, {collB, pageY}} {
		v, err := b.GetBlock(c.toks)
		if err != nil {
			t.Fatal(err)
		}
		if string(v.At(0).Page()) != string(c.page) {
			t.Fatalf("block %v served with the other block's bytes", c.toks)
		}
		v.Release()
	}
}

// 32 pushers at once, prompts sharing prefixes (4 families x 8 prompts, a
// 3-block shared prefix, 3 own blocks): every push durable, every prompt
// served whole with its own bytes.
// PROMISE: XFER-22
func TestConcurrentPushers(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	const n, shared, own = 32, 3, 3
	prompts := make([][]uint32, n)
	for i := range prompts {
		prompts[i] = sharedTokens(i%4, i, shared*B, (shared+own)*B)
		putPrompt(t, a, prompts[i])
	}
	ts := startServer(t, b, ServerOptions{})
	var wg sync.WaitGroup
	errs := make([]error, n)
	res := make([]PushResult, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := NewClient(dial(t, ts.addr))
			res[i], errs[i] = c.Push(context.Background(), a, prompts[i], nil)
		}(i)
	}
	wg.Wait()
	stored := 0
	for i := range errs {
		if errs[i] != nil {
			t.Fatalf("pusher %d: %v", i, errs[i])
		}
		if !res[i].Durable || res[i].BlocksSent+res[i].BlocksReferenced != shared+own {
			t.Fatalf("pusher %d: %+v", i, res[i])
		}
		stored += int(res[i].Response.BlocksStored)
	}
	for i, p := range prompts {
		if got := served(t, b, p); got != shared+own {
			t.Fatalf("prompt %d: served %d", i, got)
		}
	}
	if stored < 4*shared+n*own {
		t.Fatalf("%d blocks stored, at least %d are distinct", stored, 4*shared+n*own)
	}
	if ts.Leases() != 0 {
		t.Fatalf("%d leases left", ts.Leases())
	}
}

// The sender cuts the stream (its context canceled) after some chunks:
// nothing published, the lease released, the receiver goes on.
// PROMISE: XFER-16
func TestSenderCancelsMidStream(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(8, 6*B)
	putPrompt(t, a, tokens)
	rec := &recorder{seen: make(chan struct{}, 16)}
	ts := startServer(t, b, ServerOptions{Sink: rec})
	conn := dial(t, ts.addr)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := tlkvpb.NewKvTransferClient(conn).PushKv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := st.Send(chunkOf(t, a, tokens, i, false)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		<-rec.seen
	}
	cancel()
	waitDone(t, rec, 1)
	if _, done := rec.snapshot(); done[0] == nil {
		t.Fatal("a cut stream ended well")
	}
	if served(t, b, tokens) != 0 || blocksIn(t, b) != 0 {
		t.Fatal("a cut stream published blocks")
	}
	if _, err := NewClient(conn).Push(context.Background(), a, tokens, nil); err != nil || served(t, b, tokens) != 6 {
		t.Fatalf("push after: %v", err)
	}
}

func waitDone(t *testing.T, rec *recorder, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, done := rec.snapshot(); len(done) >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the stream did not end")
}

// PickFormat and BlockEnvelope follow the C rules.
// PROMISE: XFER-6
func TestPickFormat(t *testing.T) {
	for _, c := range []struct {
		q    kvx.Quant
		want uint16
	}{{kvx.QuantFP16, 1}, {kvx.QuantE5M2, 1}, {kvx.QuantE4M3, 2}, {kvx.QuantBF16, 3}} {
		g := testGeom
		g.Quant = c.q
		v, err := PickFormat(g, 0)
		if err != nil || v != c.want {
			t.Errorf("%v: %d %v, want %d", c.q, v, err, c.want)
		}
	}
	if _, err := PickFormat(testGeom, 7); err == nil {
		t.Error("format 7 accepted")
	}
	if _, err := BlockEnvelope(testGeom, 1, 0, make([]byte, 3), 2, nil); err == nil {
		t.Error("a short page accepted")
	}
	// a geometry with a zero dimension has 0-byte pages: an error, not a
	// panic indexing the empty page
	zero := testGeom
	zero.HeadDim = 0
	if _, err := BlockEnvelope(zero, 1, 0, nil, 2, []float32{}); err == nil {
		t.Error("an empty page of a zero geometry accepted")
	}
	env, err := BlockEnvelope(testGeom, 1, 0, make([]byte, testGeom.PageBytes(2)), 2, nil)
	if err != nil || len(env) != envSize(1) {
		t.Fatalf("tail envelope: %d %v", len(env), err)
	}
	if _, err := kvx.ParseEnvelope(env, &testGeom); err != nil {
		t.Fatalf("the tail envelope does not parse: %v", err)
	}
}

// Each quant pushes in its lossless envelope version (E5M2 -> v1, E4M3 ->
// v2, BF16 -> v3) and the receiver serves the sender's bytes exactly;
// --format v1 from a BF16 store whose values f16 cannot hold fails at the
// sender (ELOSSY), moving nothing.
// PROMISE: XFER-6
func TestPushFormats(t *testing.T) {
	for _, c := range []struct {
		q       kvx.Quant
		version uint16
	}{{kvx.QuantE5M2, 1}, {kvx.QuantE4M3, 2}, {kvx.QuantBF16, 3}, {kvx.QuantFP16, 1}} {
		t.Run(c.q.String(), func(t *testing.T) {
			g := testGeom
			g.Quant = c.q
			a, _ := createStore(t, g, 0)
			b, _ := createStore(t, g, 0)
			tokens := tokensOf(30, 3*B)
			putPrompt(t, a, tokens)
			ts := startServer(t, b, ServerOptions{})
			c2 := NewClient(dial(t, ts.addr))
			v, err := PickFormat(g, 0)
			if err != nil || v != c.version {
				t.Fatalf("PickFormat: %d %v", v, err)
			}
			env := envelopeOf(t, a, tokens, 0, v)
			r, err := c2.Push(context.Background(), a, tokens, nil)
			if err != nil || r.BytesSent != uint64(3*len(env)) || r.Response.BlocksStored != 3 {
				t.Fatalf("push: %v %+v", err, r)
			}
			if n := served(t, b, tokens); n != 3 {
				t.Fatalf("served %d", n)
			}
			if c.q == kvx.QuantBF16 {
				other := tokensOf(31, 2*B)
				page := pagesFor(g, other)
				page[1] = 0x7f // a bf16 value far outside f16's range
				page[0] = 0x7f
				if _, err := a.Put(other, page, nil); err != nil || a.Flush() != nil {
					t.Fatal(err)
				}
				_, err := c2.Push(context.Background(), a, other, &PushOptions{Format: 1})
				if err == nil || !errors.Is(err, kvx.ErrLossy) {
					t.Fatalf("v1 from a bf16 store with a value f16 cannot hold: %v", err)
				}
				if served(t, b, other) != 0 {
					t.Fatal("a failed push published blocks")
				}
			}
		})
	}
}

// Streams cut at every point (after HasBlocks, after opening, mid-stream,
// after the last chunk before CloseSend, right after CloseSend), 30 each
// over a reconnect storm of fresh connections: no acknowledged push is
// lost, no cut-before-the-end stream publishes anything, none publishes
// part of its prompt, and afterwards no lease, slot or goroutine is left.
// PROMISE: XFER-16
func TestAttackCancelEverywhere(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	const nb = 4
	ts := startServer(t, b, ServerOptions{MaxStreams: 4, LeaseTTL: 300 * time.Millisecond})
	warm := tokensOf(99, nb*B)
	putPrompt(t, a, warm)
	if _, err := NewClient(dial(t, ts.addr)).Push(context.Background(), a, warm, nil); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	base := runtime.NumGoroutine()
	points := []string{"after HasBlocks", "after open", "mid-stream", "before CloseSend", "after CloseSend", "acked"}
	type cut struct {
		point  string
		tokens []uint32
		acked  bool
	}
	var cuts []cut
	seq := 1000
	for round := 0; round < 30; round++ {
		for _, point := range points {
			tokens := tokensOf(seq, nb*B)
			seq++
			putPrompt(t, a, tokens)
			cuts = append(cuts, cut{point: point, tokens: tokens})
		}
	}
	// one attempt at cut c; true: refused for want of a slot (a cut
	// stream's handler may still be ending), try again
	attempt := func(c *cut) bool {
		conn := dial(t, ts.addr) // a fresh connection each time: a reconnect storm
		defer conn.Close()
		kc := tlkvpb.NewKvTransferClient(conn)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		hr, err := kc.HasBlocks(ctx, &tlkvpb.HasBlocksRequest{BlockHashes: kvx.BlockHashes(c.tokens, B),
			Tokens: c.tokens, BlockTokens: B})
		if err != nil {
			t.Errorf("HasBlocks: %v", err)
			return false
		}
		if c.point == "after HasBlocks" {
			return false
		}
		st, err := kc.PushKv(ctx)
		if err != nil {
			t.Errorf("PushKv: %v", err)
			return false
		}
		if c.point == "after open" {
			return false
		}
		last := nb
		if c.point == "mid-stream" {
			last = 2
		}
		for k := 0; k < last; k++ {
			ch := chunkOf(t, a, c.tokens, k, false)
			if k == 0 {
				ch.LeaseId = hr.LeaseId
			}
			if err := st.Send(ch); err != nil {
				break
			}
		}
		switch c.point {
		case "mid-stream", "before CloseSend":
			return false
		case "after CloseSend":
			st.CloseSend() //nolint:errcheck
			return false
		}
		resp, err := st.CloseAndRecv()
		if status.Code(err) == codes.ResourceExhausted {
			return true
		}
		if err != nil || !resp.Durable || resp.BlocksStored != nb {
			t.Errorf("a whole push: %v %+v", err, resp)
			return false
		}
		c.acked = true
		return false
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				for attempt(&cuts[i]) {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	for i := range cuts {
		next <- i
	}
	close(next)
	wg.Wait()
	if t.Failed() {
		return
	}
	published := 0
	for _, c := range cuts {
		n := served(t, b, c.tokens) // also fails on a wrong block
		switch {
		case c.acked && n != nb:
			t.Fatalf("an acknowledged push (%s) serves %d of %d blocks", c.point, n, nb)
		case c.point == "after CloseSend" && n == nb:
			published++ // the answer raced the cancel: whole, never in part
		case !c.acked && n != 0:
			t.Fatalf("a stream cut %s serves %d blocks", c.point, n)
		}
	}
	t.Logf("%d cut streams, %d cut right after CloseSend were published whole", len(cuts), published)
	if !eventually(20*time.Second, func() bool { return ts.Leases() == 0 }) {
		t.Fatalf("%d leases left", ts.Leases())
	}
	if !eventually(20*time.Second, func() bool { runtime.GC(); return runtime.NumGoroutine() <= base+4 }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: %d, %d before the cuts:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	}
	// every slot is free: four streams open at once, all acknowledged
	conn := dial(t, ts.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	var streams []tlkvpb.KvTransfer_PushKvClient
	var ps [][]uint32
	for i := 0; i < 4; i++ {
		p := tokensOf(5000+i, nb*B)
		putPrompt(t, a, p)
		s, err := kc.PushKv(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		streams, ps = append(streams, s), append(ps, p)
	}
	for k := 0; k < nb; k++ {
		for i, s := range streams {
			s.Send(chunkOf(t, a, ps[i], k, false)) //nolint:errcheck // CloseAndRecv has the status
		}
	}
	for i, s := range streams {
		if r, err := s.CloseAndRecv(); err != nil || !r.Durable || served(t, b, ps[i]) != nb {
			t.Fatalf("a slot was lost to the cut streams: %v", err)
		}
	}
}
