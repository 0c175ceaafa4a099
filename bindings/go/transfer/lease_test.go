// lease_test.go - leases under hostile use: a HasBlocks flood past
// --max-leases, leases pinning a whole store, a lease named by another
// client, a lease's or stream's destroy racing Store.Close.
package transfer

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

// A HasBlocks flood kept one lease (a C batch pinning shards, a timer)
// per call for the whole ttl, with no cap: memory and every eviction's
// pin scan grew with the flood. Now at most MaxLeases live, the oldest
// released first; a victim's HasBlocks still gets a lease, and a push
// naming a lease the flood pushed out still succeeds (its blocks are
// held, pinned by the stream from its chunk on).
// PROMISE: XFER-19
func TestAttackLeaseFlood(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	victim, bait := tokensOf(50, 4*B), tokensOf(51, 2*B)
	putPrompt(t, a, victim)
	putPrompt(t, b, victim)
	putPrompt(t, b, bait)
	const maxLeases = 64
	ts := startServer(t, b, ServerOptions{MaxLeases: maxLeases, LeaseTTL: time.Hour})
	conn := dial(t, ts.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	has := func(tokens []uint32) *tlkvpb.HasBlocksResponse {
		t.Helper()
		resp, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: kvx.BlockHashes(tokens, B),
			Tokens: tokens, BlockTokens: B, ModelSignature: testGeom.ModelSignature})
		if err != nil {
			t.Fatalf("HasBlocks: %v", err)
		}
		return resp
	}
	vl := has(victim)
	if vl.LeaseId == "" {
		t.Fatal("no lease for a held prompt")
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 250; i++ {
				if _, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: kvx.BlockHashes(bait, B),
					Tokens: bait, BlockTokens: B}); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d flood calls failed", failed.Load())
	}
	if n := ts.Leases(); n > maxLeases {
		t.Fatalf("2000 HasBlocks left %d leases live, over the cap of %d", n, maxLeases)
	}
	if r := has(victim); r.LeaseId == "" || len(r.Held) != 4 || !r.Held[3] {
		t.Fatalf("the victim after the flood: %+v", r)
	}
	// a push naming the victim's first lease (pushed out by the flood)
	chunks := []*tlkvpb.KvChunk{}
	for i := 0; i < 4; i++ {
		chunks = append(chunks, chunkOf(t, a, victim, i, true))
	}
	chunks[0].LeaseId = vl.LeaseId
	resp, err := pushChunks(context.Background(), conn, chunks)
	if err != nil || resp.BlocksReferenced != 4 || !resp.Durable {
		t.Fatalf("the victim's push after its lease was pushed out: %v %+v", err, resp)
	}
	if served(t, b, victim) != 4 {
		t.Fatal("the victim's prompt is not served")
	}
}

// Leases pinning every held shard of a full store: a push that needs room
// neither evicts a leased block nor fails; the store goes over its
// capacity while the pins last (the engine's choice: pinned shards are not
// evicted), and only until the leases lapse: then the next flush brings it
// back under. Never for good.
// PROMISE: XFER-20
func TestAttackLeasesPinFullStore(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 1<<20)
	var held [][]uint32
	for seq := 300; ; seq++ {
		p := tokensOf(seq, 8*B)
		putPrompt(t, b, p)
		if err := b.GC(); err != nil {
			t.Fatal(err)
		}
		if st, _ := b.Stat(); st.Evictions > 0 || seq > 2000 {
			break
		}
		held = append(held, p)
	}
	fresh, after := tokensOf(60, 100*B), tokensOf(61, 2*B)
	putPrompt(t, a, fresh)
	putPrompt(t, a, after)
	ts := startServer(t, b, ServerOptions{LeaseTTL: 1500 * time.Millisecond})
	conn := dial(t, ts.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	var leased [][]uint32
	for _, p := range held {
		r, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: kvx.BlockHashes(p, B),
			Tokens: p, BlockTokens: B})
		if err != nil {
			t.Fatal(err)
		}
		if r.LeaseId != "" && r.Held[7] {
			leased = append(leased, p)
		}
	}
	c := NewClient(conn)
	_, err := c.Push(context.Background(), a, fresh, nil)
	if err != nil && status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a push into a pinned full store: %v", err)
	}
	if err != nil && served(t, b, fresh) != 0 {
		t.Fatal("a refused push published")
	}
	if ts.Leases() == 0 {
		t.Fatal("the leases lapsed before the check (a 1.5 s ttl)")
	}
	for _, p := range leased {
		if n := served(t, b, p); n != 8 {
			t.Fatalf("a leased prompt lost blocks to a push: %d of 8 served", n)
		}
	}
	st, _ := b.Stat()
	t.Logf("%d prompts leased in a full 1 MiB store; a 100-block push: %v; %d bytes held", len(leased), err, st.Bytes)
	if !eventually(20*time.Second, func() bool { return ts.Leases() == 0 }) {
		t.Fatal("leases outlived their ttl")
	}
	if err != nil {
		if r, err := c.Push(context.Background(), a, fresh, nil); err != nil || !r.Durable || served(t, b, fresh) != 100 {
			t.Fatalf("the push once the leases lapsed: %v", err)
		}
	}
	if r, err := c.Push(context.Background(), a, after, nil); err != nil || !r.Durable {
		t.Fatalf("a push once the leases lapsed: %v", err)
	}
	if st, _ := b.Stat(); st.Bytes > st.CapacityBytes {
		t.Fatalf("the store stays over its capacity after the leases lapsed: %d > %d", st.Bytes, st.CapacityBytes)
	}
	if served(t, b, after) != 2 {
		t.Fatal("the last acknowledged push is not served")
	}
}

// A chunk may name a lease another client made (the 128-bit id is the
// only credential): the lease then ends with that stream. The harm is
// bounded: the owner's push still references what is held, and an
// unknown id references nothing.
// PROMISE: XFER-19
func TestAttackForeignLease(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	mine, other := tokensOf(90, 3*B), tokensOf(91, 3*B)
	putPrompt(t, a, mine)
	putPrompt(t, a, other)
	putPrompt(t, b, mine)
	ts := startServer(t, b, ServerOptions{LeaseTTL: time.Hour})
	conn := dial(t, ts.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	r, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: kvx.BlockHashes(mine, B),
		Tokens: mine, BlockTokens: B})
	if err != nil || r.LeaseId == "" {
		t.Fatalf("HasBlocks: %v", err)
	}
	// the intruder names the lease and sends the owner's blocks empty
	// under another prompt's tokens: ABORTED, nothing published
	bad := chunkOf(t, a, other, 0, true)
	bad.LeaseId = r.LeaseId
	if _, err := pushChunks(context.Background(), conn, []*tlkvpb.KvChunk{bad}); status.Code(err) != codes.Aborted {
		t.Fatalf("an empty chunk of an unheld block under a foreign lease: %v", err)
	}
	if ts.Leases() != 0 {
		t.Fatal("the lease outlived the stream naming it")
	}
	if served(t, b, other) != 0 {
		t.Fatal("a foreign lease made an unheld block referenced")
	}
	var chunks []*tlkvpb.KvChunk
	for i := 0; i < 3; i++ {
		chunks = append(chunks, chunkOf(t, a, mine, i, true))
	}
	chunks[0].LeaseId = r.LeaseId // released already
	if resp, err := pushChunks(context.Background(), conn, chunks); err != nil || resp.BlocksReferenced != 3 {
		t.Fatalf("the owner's push after its lease was ended: %v %+v", err, resp)
	}
}

// A lease's and a stream's destroy ran outside the store's read lock, so
// a Store.Close at the same moment ran kvx_store_close during
// kvx_store_batch_destroy (kvx.h forbids any call on the store or its
// batches during close: the batch list is freed under it). Close now
// waits for a destroy in progress; a destroy after Close only frees.
// PROMISE: XFER-21
func TestAttackCloseWaitsForDestroys(t *testing.T) {
	for _, what := range []string{"stream", "lease"} {
		s, _ := createStore(t, testGeom, 0)
		tokens := tokensOf(31, 2*B)
		putPrompt(t, s, tokens)
		var destroy func()
		if what == "stream" {
			cs, err := newCStream(s)
			if err != nil {
				t.Fatal(err)
			}
			destroy = cs.destroy
		} else {
			held, l, err := hasBlocks(s, kvx.BlockHashes(tokens, B), tokens, 0, 0)
			if err != nil || l == nil || !held[0] {
				t.Fatalf("HasBlocks: %v %v %v", held, l, err)
			}
			destroy = func() { destroyLease(s, l) }
		}
		closed := make(chan struct{})
		hook := func() {
			go func() { s.Close(); close(closed) }()
			select {
			case <-closed:
				t.Errorf("%s: Store.Close ran while the %s was being destroyed", what, what)
			case <-time.After(200 * time.Millisecond):
			}
		}
		destroyHook.Store(&hook)
		destroy()
		destroyHook.Store(nil)
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Store.Close did not finish after the destroy", what)
		}
		// after the close: only frees (the batch was detached)
		if what == "stream" {
			s2, _ := createStore(t, testGeom, 0)
			cs, err := newCStream(s2)
			if err != nil {
				t.Fatal(err)
			}
			s2.Close()
			cs.destroy()
		}
	}
}
