// attack_test.go - kvxd against hostile or broken peers, over real gRPC:
// streams left idle or trickling bytes, HasBlocks lease floods, huge
// requests, streams cut at every point, reconnect storms, a lease named by
// another client, the byte limit at its boundary, SIGTERM during a flood
// with the metrics scraped. What must hold: nothing acknowledged is lost,
// nothing half-pushed is served, no wrong block is served, no slot, lease
// or goroutine is held for good.
package transfer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

// eventually polls cond every 20 ms up to limit (a generous upper bound,
// not a timing assertion).
func eventually(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// trickler is a raw HTTP/2 client that opens a call (PushKv unless
// named) and sends one gRPC message a byte at a time, as a slowloris would: the message never
// completes, so gRPC never hands the handler a chunk.
type trickler struct {
	conn   net.Conn
	mu     sync.Mutex // the framer's writes
	fr     *http2.Framer
	status chan string // grpc-status of stream 1 ("rst" for a reset)
}

func startTrickle(t *testing.T, addr string) *trickler {
	t.Helper()
	return startTrickleCall(t, addr, "/tl.kv.v1.KvTransfer/PushKv")
}

func startTrickleCall(t *testing.T, addr, path string) *trickler {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	tr := &trickler{conn: c, fr: http2.NewFramer(c, c), status: make(chan string, 1)}
	tr.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path},
		{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}) //nolint:errcheck
	}
	tr.mu.Lock()
	err = tr.fr.WriteSettings()
	if err == nil {
		err = tr.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	}
	if err == nil { // a 4 KiB message's prefix: the rest comes a byte at a time
		err = tr.fr.WriteData(1, false, []byte{0, 0, 0, 0x10, 0})
	}
	tr.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	go func() { // the server's frames: settings and pings answered, stream 1's end noted
		for {
			f, err := tr.fr.ReadFrame()
			if err != nil {
				select {
				case tr.status <- "conn: " + err.Error():
				default:
				}
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					tr.mu.Lock()
					tr.fr.WriteSettingsAck() //nolint:errcheck
					tr.mu.Unlock()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					tr.mu.Lock()
					tr.fr.WritePing(true, f.Data) //nolint:errcheck
					tr.mu.Unlock()
				}
			case *http2.MetaHeadersFrame:
				if f.StreamID == 1 && f.StreamEnded() {
					select {
					case tr.status <- "grpc-status=" + grpcStatusOf(f):
					default:
					}
				}
			case *http2.RSTStreamFrame:
				if f.StreamID == 1 {
					select {
					case tr.status <- "rst":
					default:
					}
				}
			}
		}
	}()
	go func() { // one byte every 50 ms until the connection fails
		for i := 0; i < 1000; i++ {
			time.Sleep(50 * time.Millisecond)
			tr.mu.Lock()
			err := tr.fr.WriteData(1, false, []byte{0})
			tr.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return tr
}

func grpcStatusOf(f *http2.MetaHeadersFrame) string {
	for _, h := range f.Fields {
		if h.Name == "grpc-status" {
			return h.Value
		}
	}
	return "?"
}

// Streams opened and left idle (no chunk, or one chunk and then nothing)
// and a stream trickling one byte every 50 ms held --max-streams for good:
// every other sender got RESOURCE_EXHAUSTED for as long as they stayed
// (there was no idle timeout). Now a stream that brings no whole chunk
// for StreamIdle is cut with DEADLINE_EXCEEDED, nothing of it published,
// and the slots come back.
func TestAttackIdleStreamsCut(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	good, stalled := tokensOf(40, 3*B), tokensOf(41, 3*B)
	putPrompt(t, a, good)
	putPrompt(t, a, stalled)
	rec := &recorder{seen: make(chan struct{}, 8)}
	ts := startServer(t, b, ServerOptions{MaxStreams: 3, StreamIdle: time.Second, Sink: rec})
	conn := dial(t, ts.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	silent, err := kc.PushKv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	one, err := kc.PushKv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := one.Send(chunkOf(t, a, stalled, 0, false)); err != nil {
		t.Fatal(err)
	}
	select { // the one-chunk stream's handler runs
	case <-rec.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled stream's chunk was not seen")
	}
	tr := startTrickle(t, ts.addr)
	// all three slots are taken now (a push would be refused: TestStreamLimits)
	if !eventually(10*time.Second, func() bool { return len(ts.sem) == 3 }) {
		t.Fatalf("three open streams did not fill --max-streams 3: %d", len(ts.sem))
	}
	// ... and once the idle ones are cut, a push goes through
	var pushed bool
	if !eventually(20*time.Second, func() bool {
		_, err := NewClient(conn).Push(context.Background(), a, good, nil)
		pushed = err == nil
		return pushed || status.Code(err) != codes.ResourceExhausted
	}) || !pushed {
		t.Fatal("idle streams held --max-streams for good: no push got through in 20 s")
	}
	for name, st := range map[string]tlkvpb.KvTransfer_PushKvClient{"silent": silent, "one chunk": one} {
		// the answer, without half-closing (an empty stream closed is a push)
		if err := st.RecvMsg(new(tlkvpb.PushKvResponse)); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("the %s stream: %v, want DEADLINE_EXCEEDED", name, err)
		}
	}
	select {
	case s := <-tr.status:
		if s != "grpc-status=4" && s != "rst" {
			t.Fatalf("the trickling stream ended with %q, want grpc-status=4 (DEADLINE_EXCEEDED)", s)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the trickling stream was never cut")
	}
	if served(t, b, stalled) != 0 || served(t, b, good) != 3 {
		t.Fatal("a cut stream published, or the good push was lost")
	}
}

type slowSink struct{ d time.Duration }

func (k slowSink) Block(ctx context.Context, b Block) error      { time.Sleep(k.d); return nil }
func (k slowSink) Done(ctx context.Context, r Result, err error) {}

// The idle clock runs only while the stream waits for a chunk: a sink (or
// a write) slower than StreamIdle never cuts a sender whose chunks are
// already there.
func TestAttackSlowSinkNotIdle(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(46, 6*B)
	putPrompt(t, a, tokens)
	ts := startServer(t, b, ServerOptions{StreamIdle: 100 * time.Millisecond, Sink: slowSink{250 * time.Millisecond}})
	r, err := NewClient(dial(t, ts.addr)).Push(context.Background(), a, tokens, nil)
	if err != nil || !r.Durable || served(t, b, tokens) != 6 {
		t.Fatalf("a push through a sink slower than --stream-idle: %v", err)
	}
}

// kvxd cuts an idle stream too (--stream-idle), so one silent client on
// --max-streams 1 holds it only that long; a non-positive --stream-idle or
// --max-leases is a usage error.
func TestAttackKvxdIdleStream(t *testing.T) {
	a, adir := createStore(t, testGeom, 0)
	b, bdir := createStore(t, testGeom, 0)
	tokens := tokensOf(45, 2*B)
	putPrompt(t, a, tokens)
	a.Close()
	b.Close()
	for _, bad := range [][]string{{"--stream-idle", "0s"}, {"--max-leases", "0"}} {
		if _, errOut, code := runKvxd(t, append([]string{"serve", "--store", bdir}, bad...)...); code != 2 {
			t.Fatalf("kvxd serve %v: exit %d: %s", bad, code, errOut)
		}
	}
	p := startKvxd(t, bdir, "--max-streams", "1", "--stream-idle", "300ms", "--metrics", "127.0.0.1:0")
	conn := dial(t, p.addr)
	silent, err := tlkvpb.NewKvTransferClient(conn).PushKv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { // its handler holds the slot
		resp, err := http.Get("http://" + p.metrics + "/metrics")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return bytes.Contains(body, []byte("\nkvx_transfer_streams_active 1\n"))
	}) {
		t.Fatal("the silent stream did not take the one slot")
	}
	if err := silent.RecvMsg(new(tlkvpb.PushKvResponse)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the silent stream: %v, want DEADLINE_EXCEEDED", err)
	}
	if _, errOut, code := runKvxd(t, append([]string{"push", "--store", adir, "--to", p.addr}, tokenArgs(tokens)...)...); code != 0 {
		t.Fatalf("kvxd push after the idle stream was cut: %d %s", code, errOut)
	}
}

// A HasBlocks flood kept one lease (a C batch pinning shards, a timer)
// per call for the whole ttl, with no cap: memory and every eviction's
// pin scan grew with the flood. Now at most MaxLeases live, the oldest
// released first; a victim's HasBlocks still gets a lease, and a push
// naming a lease the flood pushed out still succeeds (its blocks are
// held, pinned by the stream from its chunk on).
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

// The largest HasBlocks gRPC lets through (about 530,000 hashes) is
// answered, one past the receive limit is refused by gRPC, and a request
// naming more blocks than its tokens hold is INVALID_ARGUMENT; kvxd keeps
// serving.
func TestAttackHugeHasBlocks(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(70, 3*B)
	putPrompt(t, a, tokens)
	putPrompt(t, b, tokens)
	ts := startServer(t, b, ServerOptions{})
	conn := dial(t, ts.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	n := (MaxRecvMsgSize - 64) / 8
	hashes := make([]uint64, n)
	copy(hashes, kvx.BlockHashes(tokens, B))
	for i := 3; i < n; i++ {
		hashes[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	t0 := time.Now()
	r, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: hashes, BlockTokens: B})
	if err != nil {
		t.Fatalf("%d hashes: %v", n, err)
	}
	if len(r.Held) != n || !r.Held[0] || !r.Held[2] || r.Held[3] || r.LeaseId == "" {
		t.Fatalf("%d hashes: %d held flags, lease %q", n, len(r.Held), r.LeaseId)
	}
	t.Logf("HasBlocks of %d hashes: %v", n, time.Since(t0))
	_, err = kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: make([]uint64, n+8200), BlockTokens: B})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a request past the receive limit: %v", err)
	}
	_, err = kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: hashes[:100000],
		Tokens: make([]uint32, 1000), BlockTokens: B})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("100000 hashes with 1000 tokens: %v", err)
	}
	ts.release(r.LeaseId)
	if res, err := NewClient(conn).Push(context.Background(), a, tokens, nil); err != nil || res.BlocksReferenced != 3 {
		t.Fatalf("a push after the huge requests: %v %+v", err, res)
	}
}

// --max-stream-bytes at its boundary: payloads of exactly the limit are
// accepted, one byte more is RESOURCE_EXHAUSTED with nothing published.
func TestAttackStreamBytesBoundary(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(80, 3*B)
	putPrompt(t, a, tokens)
	for _, limit := range []int{3 * envSize(1), 3*envSize(1) - 1} {
		b, _ := createStore(t, testGeom, 0)
		ts := startServer(t, b, ServerOptions{MaxStreamBytes: uint64(limit)})
		r, err := NewClient(dial(t, ts.addr)).Push(context.Background(), a, tokens, nil)
		if limit == 3*envSize(1) {
			if err != nil || r.BytesSent != uint64(limit) || served(t, b, tokens) != 3 {
				t.Fatalf("payloads of exactly the limit: %v %+v", err, r)
			}
		} else if status.Code(err) != codes.ResourceExhausted || served(t, b, tokens) != 0 || blocksIn(t, b) != 0 {
			t.Fatalf("one byte over the limit: %v", err)
		}
	}
}

// A chunk may name a lease another client made (the 128-bit id is the
// only credential): the lease then ends with that stream. The harm is
// bounded: the owner's push still references what is held, and an
// unknown id references nothing.
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

// Streams cut at every point (after HasBlocks, after opening, mid-stream,
// after the last chunk before CloseSend, right after CloseSend), 30 each
// over a reconnect storm of fresh connections: no acknowledged push is
// lost, no cut-before-the-end stream publishes anything, none publishes
// part of its prompt, and afterwards no lease, slot or goroutine is left.
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

// SIGTERM while 6 pushers, a HasBlocks flooder, two idle streams and a
// metrics scraper hammer a kvxd process: it exits 0 within its drain, the
// metrics endpoint answered throughout, every acknowledged push is served
// whole with its own bytes after a reopen, and no other push is served in
// part.
func TestAttackKvxdSigtermDuringFlood(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, bdir := createStore(t, testGeom, 0)
	const nb = 4
	var prompts [][]uint32
	for i := 0; i < 240; i++ {
		p := tokensOf(7000+i, nb*B)
		putPrompt(t, a, p)
		prompts = append(prompts, p)
	}
	b.Close()
	p := startKvxd(t, bdir, "--max-streams", "4", "--drain", "500ms", "--stream-idle", "1h",
		"--metrics", "127.0.0.1:0")
	conn := dial(t, p.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 2; i++ { // idle streams: cut by the drain, not waited for
		if _, err := kc.PushKv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var acked sync.Map
	var nacked, scrapes, scrapeFails atomic.Int32
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 6; w++ {
		w := w
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := NewClient(conn)
			for i := w; i < len(prompts); i += 6 {
				select {
				case <-stop:
					return
				default:
				}
				if r, err := c.Push(ctx, a, prompts[i], nil); err == nil && r.Durable {
					acked.Store(i, true)
					nacked.Add(1)
				}
			}
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			q := prompts[i%len(prompts)]
			kc.HasBlocks(ctx, &tlkvpb.HasBlocksRequest{BlockHashes: kvx.BlockHashes(q, B), Tokens: q, BlockTokens: B}) //nolint:errcheck
		}
	}()
	go func() {
		defer wg.Done()
		hc := &http.Client{Timeout: 10 * time.Second}
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := hc.Get("http://" + p.metrics + "/metrics")
			if err != nil {
				return // kvxd is gone
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			scrapes.Add(1)
			if resp.StatusCode != 200 || !bytes.Contains(body, []byte("kvx_transfer_streams_active")) {
				scrapeFails.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	if !eventually(60*time.Second, func() bool { return nacked.Load() >= 20 }) {
		t.Fatalf("only %d pushes acknowledged under the flood", nacked.Load())
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t)
	close(stop)
	cancel()
	wg.Wait()
	if code != 0 {
		t.Fatalf("kvxd exited %d after SIGTERM: %s", code, p.out.String())
	}
	if scrapes.Load() == 0 || scrapeFails.Load() != 0 {
		t.Fatalf("metrics: %d scrapes, %d bad", scrapes.Load(), scrapeFails.Load())
	}
	r, err := kvx.Open(bdir, &kvx.OpenOptions{NoWait: true})
	if err != nil {
		t.Fatalf("the store after SIGTERM: %v", err)
	}
	defer r.Close()
	extra := 0
	for i, q := range prompts {
		n := served(t, r, q)
		_, ok := acked.Load(i)
		switch {
		case ok && n != nb:
			t.Fatalf("acknowledged prompt %d serves %d of %d blocks after SIGTERM", i, n, nb)
		case !ok && n != 0 && n != nb:
			t.Fatalf("unacknowledged prompt %d serves %d of %d blocks", i, n, nb)
		case !ok && n == nb:
			extra++
		}
	}
	if probs, err := r.Verify(); err != nil || len(probs) != 0 {
		t.Fatalf("Verify after SIGTERM: %v %v", err, probs)
	}
	t.Logf("%d pushes acknowledged before SIGTERM, %d more published whole without an answer", nacked.Load(), extra)
}

// 100 concurrent HasBlocks of 4 MiB on one connection took kvxd's peak
// resident memory past 700 MiB (1.3 GiB seen): gRPC reads each unary
// request whole before the handler runs, and nothing capped the calls in
// flight, so more calls or connections took it further. kvxd's tap now
// refuses a HasBlocks past --max-has-blocks (8) as it opens, before its
// request is read: the peak stays under 256 MiB, the refused calls get
// UNAVAILABLE, some are answered, and HasBlocks works after the storm.
func TestAttackConcurrentHugeHasBlocksMemory(t *testing.T) {
	b, bdir := createStore(t, testGeom, 0)
	b.Close()
	p := startKvxd(t, bdir)
	conn := dial(t, p.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	hashes := make([]uint64, (MaxRecvMsgSize-64)/8)
	for i := range hashes {
		hashes[i] = uint64(i+1) * 0x9E3779B97F4A7C15
	}
	var wg sync.WaitGroup
	var answered, refused atomic.Int64
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: hashes, BlockTokens: B})
			switch status.Code(err) {
			case codes.OK:
				answered.Add(1)
			case codes.Unavailable:
				refused.Add(1)
			default:
				t.Errorf("a concurrent HasBlocks: %v", err)
			}
		}()
	}
	wg.Wait()
	t.Logf("100 concurrent 4 MiB HasBlocks: %d answered, %d refused", answered.Load(), refused.Load())
	if answered.Load() == 0 {
		t.Fatal("no HasBlocks of the storm was answered")
	}
	// the slots come back: a small HasBlocks after the storm is answered
	if !eventually(10*time.Second, func() bool {
		_, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: hashes[:1], BlockTokens: B})
		return err == nil
	}) {
		t.Fatal("HasBlocks refused for good after the storm")
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Skip("no /proc")
	}
	var hwm int
	for _, line := range strings.Split(string(st), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			fmt.Sscan(strings.TrimPrefix(line, "VmHWM:"), &hwm) //nolint:errcheck
		}
	}
	t.Logf("kvxd's peak resident memory: %d MiB", hwm>>10)
	if hwm > 256<<10 {
		t.Fatalf("kvxd's peak resident memory after 100 concurrent 4 MiB HasBlocks: %d MiB (bound 256 MiB)", hwm>>10)
	}
}

// The HasBlocks cap must not be a way to shut HasBlocks off: calls that
// open and never finish their request (a message trickled a byte every
// 50 ms) take the slots, and while they hold them another HasBlocks is
// refused (UNAVAILABLE, the process keeps serving pushes), but each is
// cut at StreamIdle (DEADLINE_EXCEEDED or a reset) and its slot comes
// back, so HasBlocks is answered again within about that time.
func TestAttackHasBlocksSlotsHeld(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(90, 3*B)
	putPrompt(t, a, tokens)
	ts := startServer(t, b, ServerOptions{MaxHasBlocks: 2, StreamIdle: 2 * time.Second})
	conn := dial(t, ts.addr)
	kc := tlkvpb.NewKvTransferClient(conn)
	t0 := time.Now()
	tr1 := startTrickleCall(t, ts.addr, "/"+hasBlocksMethod)
	tr2 := startTrickleCall(t, ts.addr, "/"+hasBlocksMethod)
	if !eventually(5*time.Second, func() bool { return len(ts.hasSem) == 2 }) {
		t.Fatalf("two trickled HasBlocks did not take both slots: %d", len(ts.hasSem))
	}
	hashes := kvx.BlockHashes(tokens, B)
	_, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: hashes, Tokens: tokens,
		BlockTokens: B})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a HasBlocks past --max-has-blocks while two are held: %v, want UNAVAILABLE", err)
	}
	if elapsed := time.Since(t0); elapsed < 2*time.Second {
		// a push (no HasBlocks) still goes through meanwhile
		if r, err := NewClient(conn).Push(context.Background(), a, tokens, &PushOptions{NoHasBlocks: true}); err != nil ||
			r.BlocksSent != 3 {
			t.Fatalf("a push while HasBlocks is saturated: %v %+v", err, r)
		}
	}
	for name, tr := range map[string]*trickler{"first": tr1, "second": tr2} {
		select {
		case s := <-tr.status:
			if s != "grpc-status=4" && s != "rst" {
				t.Fatalf("the %s trickled HasBlocks ended with %q, want grpc-status=4 (DEADLINE_EXCEEDED)", name, s)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the %s trickled HasBlocks was never cut: it holds its slot for good", name)
		}
	}
	if !eventually(5*time.Second, func() bool { return len(ts.hasSem) == 0 }) {
		t.Fatalf("the cut calls kept their slots: %d held", len(ts.hasSem))
	}
	r, err := kc.HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{BlockHashes: hashes, Tokens: tokens,
		BlockTokens: B})
	if err != nil || len(r.Held) != 3 {
		t.Fatalf("HasBlocks after the held calls were cut: %v", err)
	}
	ts.release(r.LeaseId)
}

// The tap frees a slot however a call ends, including the transport's
// own refusals after the tap let it in (a call past the connection's
// stream limit, a connection closing): gRPC cancels the call's context on
// every path, and the slot follows it. A call that reached its handler
// frees the slot as the handler returns, once.
func TestHasBlocksTapFreesOnCancel(t *testing.T) {
	b, _ := createStore(t, testGeom, 0)
	s := NewServer(b, ServerOptions{MaxHasBlocks: 1, StreamIdle: time.Hour})
	defer s.Close()
	info := &tap.Info{FullMethodName: "/" + hasBlocksMethod}
	ctx, cancel := context.WithCancel(context.Background())
	bounded, err := s.InTapHandle(ctx, info)
	if err != nil {
		t.Fatal(err)
	}
	if dl, ok := bounded.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
		t.Fatalf("the call's context has no StreamIdle deadline: %v %v", dl, ok)
	}
	if _, err := s.InTapHandle(context.Background(), info); status.Code(err) != codes.Unavailable {
		t.Fatalf("a second HasBlocks past MaxHasBlocks 1: %v", err)
	}
	if _, err := s.InTapHandle(context.Background(), &tap.Info{FullMethodName: "/tl.kv.v1.KvTransfer/PushKv"}); err != nil {
		t.Fatalf("PushKv went through the HasBlocks cap: %v", err)
	}
	cancel()
	if !eventually(5*time.Second, func() bool { return len(s.hasSem) == 0 }) {
		t.Fatal("a canceled call kept its slot")
	}
	if bounded.Err() == nil {
		t.Fatal("the bounded context outlived the call's")
	}
	// the interceptor frees the slot as the handler returns, before the
	// call's context ends (the answer is still to be written) ...
	ctx2, cancel2 := context.WithCancel(context.Background())
	bounded2, err := s.InTapHandle(ctx2, info)
	if err != nil {
		t.Fatalf("HasBlocks after the slot came back: %v", err)
	}
	if _, err := s.UnaryInterceptor(bounded2, nil, nil, func(ctx context.Context, req interface{}) (interface{}, error) {
		if len(s.hasSem) != 1 {
			t.Error("the slot was not held while the handler ran")
		}
		return nil, nil
	}); err != nil || len(s.hasSem) != 0 || bounded2.Err() != nil {
		t.Fatalf("after the handler: %v, %d slots held, call context %v", err, len(s.hasSem), bounded2.Err())
	}
	// ... and the call's end then frees nothing more: another call's slot
	// stays held
	ctx3, cancel3 := context.WithCancel(context.Background())
	defer cancel3()
	if _, err := s.InTapHandle(ctx3, info); err != nil {
		t.Fatal(err)
	}
	cancel2()
	time.Sleep(100 * time.Millisecond)
	if len(s.hasSem) != 1 {
		t.Fatalf("a call's end freed another call's slot: %d held", len(s.hasSem))
	}
}

// transfer.Client.Push retries a HasBlocks refused as busy: with the one
// slot of --max-has-blocks 1 held by a call that never finishes its
// request, a push with NoRetry fails UNAVAILABLE at once, and a plain
// push waits out the held call (cut at the 1 s idle limit): its HasBlocks
// is answered (the receiver holds the prompt: every block referenced).
func TestClientRetriesBusyHasBlocks(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(91, 3*B)
	putPrompt(t, a, tokens)
	putPrompt(t, b, tokens)
	ts := startServer(t, b, ServerOptions{MaxHasBlocks: 1, StreamIdle: time.Second})
	conn := dial(t, ts.addr)
	startTrickleCall(t, ts.addr, "/"+hasBlocksMethod)
	if !eventually(5*time.Second, func() bool { return len(ts.hasSem) == 1 }) {
		t.Fatal("the trickled HasBlocks did not take the slot")
	}
	if _, err := NewClient(conn).Push(context.Background(), a, tokens, &PushOptions{NoRetry: true}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a push with NoRetry while HasBlocks is busy: %v, want UNAVAILABLE", err)
	}
	r, err := NewClient(conn).Push(context.Background(), a, tokens, nil)
	if err != nil || !r.Durable || r.BlocksReferenced != 3 || r.BlocksSent != 0 || r.HasBlocksBusy {
		t.Fatalf("a push retrying a busy HasBlocks: %v %+v", err, r)
	}
}

// A HasBlocks that stays busy (a slowloris holds the only slot for the
// 30 s idle limit) does not fail the push: after its retries (2 to 4 s)
// it sends every payload, as with NoHasBlocks.
func TestPushFallsBackWhenHasBlocksBusy(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(92, 3*B)
	putPrompt(t, a, tokens)
	ts := startServer(t, b, ServerOptions{MaxHasBlocks: 1, StreamIdle: 30 * time.Second})
	startTrickleCall(t, ts.addr, "/"+hasBlocksMethod)
	if !eventually(5*time.Second, func() bool { return len(ts.hasSem) == 1 }) {
		t.Fatal("the trickled HasBlocks did not take the slot")
	}
	r, err := NewClient(dial(t, ts.addr)).Push(context.Background(), a, tokens, nil)
	if err != nil || !r.Durable || r.BlocksSent != 3 || !r.HasBlocksBusy {
		t.Fatalf("a push while HasBlocks is held by a slowloris: %v %+v", err, r)
	}
	if served(t, b, tokens) != 3 {
		t.Fatal("the push that fell back is not served")
	}
}

// gRPC routes a :path with or without its leading '/' ("tl.kv.v1.KvTransfer
// /HasBlocks" reaches HasBlocks too); the tap compared the raw path, so
// the unslashed spelling went past the cap and the memory attack worked
// again. Both spellings count now.
func TestAttackHasBlocksTapPathAlias(t *testing.T) {
	b, _ := createStore(t, testGeom, 0)
	ts := startServer(t, b, ServerOptions{MaxHasBlocks: 1, StreamIdle: 5 * time.Second})
	first := startTrickleCall(t, ts.addr, hasBlocksMethod) // no leading '/'
	if !eventually(5*time.Second, func() bool { return len(ts.hasSem) == 1 }) {
		t.Fatalf("an unslashed HasBlocks took no slot: %d held", len(ts.hasSem))
	}
	second := startTrickleCall(t, ts.addr, hasBlocksMethod)
	select {
	case st := <-second.status:
		if st != "rst" {
			t.Fatalf("a second unslashed HasBlocks past the cap of 1: %q, want a refused stream", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a second unslashed HasBlocks past the cap of 1 was let in")
	}
	select {
	case st := <-first.status:
		t.Fatalf("the first call ended early: %q", st)
	default:
	}
}

// A lease's and a stream's destroy ran outside the store's read lock, so
// a Store.Close at the same moment ran kvx_store_close during
// kvx_store_batch_destroy (kvx.h forbids any call on the store or its
// batches during close: the batch list is freed under it). Close now
// waits for a destroy in progress; a destroy after Close only frees.
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
