// limits_test.go - the bounds of a receiver: its streams (StreamIdle
// against idle and trickling streams and slow sinks, MaxStreamBytes at its
// boundary), its connections (ServerOptions' MaxHeaderListBytes,
// MaxConnStreams, ConnIdle, HandshakeTimeout; kvxd's flags of the same
// names; LimitListener, kvxd's --max-conns) and kvxd's metrics server,
// against raw HTTP/2 and TCP clients.
package transfer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"kvx.dev/transfer/tlkvpb"
)

// rawH2 is a raw HTTP/2 client connection: it answers the server's
// SETTINGS and PINGs and reports what the server does as events: "rst N"
// (stream N reset), "status N CODE" (stream N ended with grpc-status),
// "goaway", "eof" (the connection ended).
type rawH2 struct {
	conn     net.Conn
	mu       sync.Mutex // the framer's writes
	fr       *http2.Framer
	enc      *hpack.Encoder // the connection's HPACK state, under mu
	hb       bytes.Buffer
	settings chan map[http2.SettingID]uint32 // the server's first SETTINGS
	events   chan string
}

func dialRawH2(t *testing.T, addr string) *rawH2 {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &rawH2{conn: c, fr: http2.NewFramer(c, c), settings: make(chan map[http2.SettingID]uint32, 1),
		events: make(chan string, 64)}
	r.enc = hpack.NewEncoder(&r.hb)
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	err = r.fr.WriteSettings()
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		first := true
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				r.events <- "eof"
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if f.IsAck() {
					continue
				}
				if first {
					m := map[http2.SettingID]uint32{}
					f.ForeachSetting(func(s http2.Setting) error { m[s.ID] = s.Val; return nil }) //nolint:errcheck
					r.settings <- m
					first = false
				}
				r.mu.Lock()
				r.fr.WriteSettingsAck() //nolint:errcheck
				r.mu.Unlock()
			case *http2.PingFrame:
				if !f.IsAck() {
					r.mu.Lock()
					r.fr.WritePing(true, f.Data) //nolint:errcheck
					r.mu.Unlock()
				}
			case *http2.GoAwayFrame:
				r.events <- "goaway"
			case *http2.RSTStreamFrame:
				r.events <- fmt.Sprintf("rst %d", f.StreamID)
			case *http2.MetaHeadersFrame:
				if f.StreamEnded() {
					r.events <- fmt.Sprintf("status %d %s", f.StreamID, grpcStatusOf(f))
				}
			}
		}
	}()
	return r
}

// call opens stream id on path with the gRPC headers and extra fields
// (each encoded with HPACK indexing, so a field repeated costs a byte or
// two of wire), ended at once (an empty DATA frame) when end.
func (r *rawH2) call(t *testing.T, id uint32, path string, end bool, extra ...hpack.HeaderField) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hb.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path},
		{":authority", "kvx"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		r.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}) //nolint:errcheck
	}
	for _, f := range extra {
		r.enc.WriteField(f) //nolint:errcheck
	}
	if r.hb.Len() > 16000 {
		t.Fatalf("a header block of %d bytes does not fit one frame", r.hb.Len())
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hb.Bytes(),
		EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if end { // an empty DATA frame ends it, as gRPC clients do (grpc-go 1.33's
		// server never hands its handler the end of a stream ended by HEADERS)
		if err := r.fr.WriteData(id, true, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// wait waits up to limit for event want, skipping others; false if it
// did not come.
func (r *rawH2) wait(want string, limit time.Duration) bool {
	deadline := time.After(limit)
	for {
		select {
		case e := <-r.events:
			if e == want {
				return true
			}
			if e == "eof" && want != "eof" {
				return false
			}
		case <-deadline:
			return false
		}
	}
}

// padHeaders are n copies of one 3,000-byte field: the first is indexed
// into the HPACK table, the others are one-byte references to it, so
// about 3 KB of wire decode to n x 3 KB of header list.
func padHeaders(n int) []hpack.HeaderField {
	f := hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("p", 3000)}
	out := make([]hpack.HeaderField, n)
	for i := range out {
		out[i] = f
	}
	return out
}

// gRPC's default header list limit is 16 MiB: a call with 60 KB of
// indexed headers (about 3 KB of wire; 4 KB of wire reach 12 MiB) was
// decoded whole, kept in the call's context, and ran its handler or the
// HasBlocks tap. Now a call whose decoded header list passes
// MaxHeaderListBytes (16 KiB by default, advertised in SETTINGS with
// MaxConnStreams) is reset before either runs; a call within it runs.
// PROMISE: XFER-23
func TestAttackHeaderListFlood(t *testing.T) {
	b, _ := createStore(t, testGeom, 0)
	ts := startServer(t, b, ServerOptions{})
	r := dialRawH2(t, ts.addr)
	select {
	case s := <-r.settings:
		if s[http2.SettingMaxHeaderListSize] != DefaultMaxHeaderListBytes || s[http2.SettingMaxConcurrentStreams] != 64+8+8 {
			t.Fatalf("the server's SETTINGS: %v", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no SETTINGS from the server")
	}
	r.call(t, 1, "/tl.kv.v1.KvTransfer/PushKv", false, padHeaders(20)...)
	if !r.wait("rst 1", 5*time.Second) {
		t.Fatal("a PushKv with 60 KB of headers was not reset")
	}
	r.call(t, 3, "/"+hasBlocksMethod, false, padHeaders(20)...)
	if !r.wait("rst 3", 5*time.Second) {
		t.Fatal("a HasBlocks with 60 KB of headers was not reset")
	}
	if n := len(ts.hasSem); n != 0 {
		t.Fatalf("a HasBlocks reset for its headers took a slot: %d held", n)
	}
	// 3 KB of headers is a call like any other: an empty push, answered
	r.call(t, 5, "/tl.kv.v1.KvTransfer/PushKv", true, padHeaders(1)...)
	if !r.wait("status 5 0", 5*time.Second) {
		t.Fatal("a PushKv with 3 KB of headers was not answered OK")
	}
	// and the connection still serves gRPC calls
	conn := dial(t, ts.addr)
	if _, err := tlkvpb.NewKvTransferClient(conn).HasBlocks(context.Background(),
		&tlkvpb.HasBlocksRequest{BlockTokens: B}); err != nil {
		t.Fatalf("HasBlocks after the flood: %v", err)
	}
}

// kvxd kept a connection that opened no call for good (gRPC's
// MaxConnectionIdle is infinite), gave a connection 120 s to finish its
// handshake, and its metrics server had no timeout at all (a request
// left unfinished held its connection for good). With short flag values:
// an idle HTTP/2 connection gets a GOAWAY and is closed, a TCP connection
// that sends nothing is closed, a metrics request whose headers never end
// is closed; the flags reach the SETTINGS; a call past
// --max-header-list-bytes is reset and a gRPC call within it answered.
// PROMISE: XFER-23
func TestKvxdConnectionBounds(t *testing.T) {
	b, bdir := createStore(t, testGeom, 0)
	b.Close()
	if _, errOut, code := runKvxd(t, "serve", "--store", bdir, "--max-header-list-bytes", "100"); code != 2 {
		t.Fatalf("--max-header-list-bytes 100: exit %d (%s)", code, errOut)
	}
	p := startKvxd(t, bdir, "--conn-idle", "1s", "--handshake-timeout", "1s", "--max-header-list-bytes", "4096",
		"--max-conn-streams", "5", "--metrics", "127.0.0.1:0")
	t0 := time.Now()
	idle := dialRawH2(t, p.addr)
	select {
	case s := <-idle.settings:
		if s[http2.SettingMaxHeaderListSize] != 4096 || s[http2.SettingMaxConcurrentStreams] != 5 {
			t.Fatalf("kvxd's SETTINGS: %v", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no SETTINGS from kvxd")
	}
	closed := func(c net.Conn) bool { // the peer closes c within 10 s
		c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
		var buf [512]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				ne, ok := err.(net.Error)
				return !ok || !ne.Timeout()
			}
		}
	}
	silent, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	slow, err := net.Dial("tcp", p.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := slow.Write([]byte("GET /metrics HTTP/1.1\r\nHost: kvx\r\n")); err != nil {
		t.Fatal(err)
	}

	big := dialRawH2(t, p.addr)
	big.call(t, 1, "/tl.kv.v1.KvTransfer/PushKv", false, padHeaders(2)...)
	if !big.wait("rst 1", 5*time.Second) {
		t.Fatal("a call with 6 KB of headers past --max-header-list-bytes 4096 was not reset")
	}
	if _, err := tlkvpb.NewKvTransferClient(dial(t, p.addr)).HasBlocks(context.Background(),
		&tlkvpb.HasBlocksRequest{BlockTokens: B}); err != nil {
		t.Fatalf("a gRPC call within --max-header-list-bytes 4096: %v", err)
	}

	if !idle.wait("goaway", 10*time.Second) || !idle.wait("eof", 10*time.Second) {
		t.Fatal("an HTTP/2 connection idle past --conn-idle 1s was not closed")
	}
	if d := time.Since(t0); d < 900*time.Millisecond {
		t.Fatalf("the idle connection was closed after %v, before --conn-idle 1s", d)
	}
	if !closed(silent) {
		t.Fatal("a connection that sent nothing was kept past --handshake-timeout 1s")
	}
	if !closed(slow) {
		t.Fatal("a metrics request whose headers never end was kept past --handshake-timeout 1s")
	}
}

// LimitListener (kvxd's --max-conns): Accept waits while n of the
// connections it returned are open; a connection's first Close frees its
// place and a second frees nothing more; closing the listener ends an
// Accept waiting at a full cap (grpc.Server.Stop waits for its Serve
// loop); kvx_transfer_connections_open follows.
// PROMISE: XFER-23
func TestLimitListenerReleasesOnce(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListener(inner, 2, m)
	defer l.Close()
	open := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvx_transfer_connections_open" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no kvx_transfer_connections_open")
		return -1
	}
	dialOne := func() {
		t.Helper()
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	accept := func() chan accepted {
		ch := make(chan accepted, 1)
		go func() {
			c, err := l.Accept()
			ch <- accepted{c, err}
		}()
		return ch
	}
	take := func(ch chan accepted, what string) net.Conn {
		t.Helper()
		select {
		case a := <-ch:
			if a.err != nil {
				t.Fatalf("%s: Accept: %v", what, a.err)
			}
			return a.c
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: Accept still waits", what)
		}
		return nil
	}
	waits := func(ch chan accepted, what string) {
		t.Helper()
		select {
		case a := <-ch:
			t.Fatalf("%s: Accept returned past the cap of 2 (%v)", what, a.err)
		case <-time.After(300 * time.Millisecond):
		}
	}

	dialOne()
	a1 := take(accept(), "the 1st")
	dialOne()
	a2 := take(accept(), "the 2nd")
	dialOne()
	pending := accept()
	waits(pending, "the 3rd, 2 open")
	if v := open(); v != 2 {
		t.Fatalf("connections_open %v with 2 open", v)
	}
	a1.Close()
	a1.Close() //nolint:errcheck // the second Close: must free nothing more
	a3 := take(pending, "the 3rd, one closed")
	dialOne()
	pending = accept()
	waits(pending, "the 4th, after one connection closed twice")
	if v := open(); v != 2 {
		t.Fatalf("connections_open %v with 2 open (one closed twice)", v)
	}
	a2.Close()
	a4 := take(pending, "the 4th, a second one closed")
	dialOne()
	pending = accept()
	waits(pending, "the 5th, 2 open")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-pending:
		if a.err == nil {
			t.Fatal("an Accept waiting at the cap returned a connection after the listener closed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("closing the listener did not end an Accept waiting at the cap")
	}
	a3.Close()
	a4.Close()
	a4.Close() //nolint:errcheck
	if v := open(); v != 0 {
		t.Fatalf("connections_open %v with none open", v)
	}
}

// kvxd accepted every connection, each kept until --handshake-timeout or
// --conn-idle closed it: a client opening thousands ran it out of file
// descriptors and memory. With --max-conns 3 and three connections held
// open (HTTP/2 preface done), a fourth client is not accepted (it waits in
// the kernel's queue: its HasBlocks is not answered within 1 s), and is
// served once one of the three closes; kvx_transfer_connections_open
// counts 3 throughout; 0, -1 and 2^20+1 are usage errors.
// PROMISE: XFER-23, XFER-29
func TestKvxdMaxConns(t *testing.T) {
	b, bdir := createStore(t, testGeom, 0)
	b.Close()
	for _, v := range []string{"0", "-1", "1048577"} {
		if _, errOut, code := runKvxd(t, "serve", "--store", bdir, "--max-conns", v); code != 2 ||
			!strings.Contains(errOut, "--max-conns") {
			t.Fatalf("--max-conns %s: exit %d (%s)", v, code, errOut)
		}
	}
	p := startKvxd(t, bdir, "--max-conns", "3", "--metrics", "127.0.0.1:0")
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	gauge := func() string {
		t.Helper()
		resp, err := hc.Get("http://" + p.metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			if v := strings.TrimPrefix(line, "kvx_transfer_connections_open "); v != line {
				return v
			}
		}
		t.Fatalf("no kvx_transfer_connections_open in the metrics:\n%s", body)
		return ""
	}
	held := make([]*rawH2, 3)
	for i := range held {
		held[i] = dialRawH2(t, p.addr)
		select {
		case <-held[i].settings:
		case <-time.After(5 * time.Second):
			t.Fatalf("held connection %d: no SETTINGS from kvxd under --max-conns 3", i)
		}
	}
	if g := gauge(); g != "3" {
		t.Fatalf("kvx_transfer_connections_open %s with 3 held", g)
	}
	kc := tlkvpb.NewKvTransferClient(dial(t, p.addr))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := kc.HasBlocks(ctx, &tlkvpb.HasBlocksRequest{BlockTokens: B})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a 4th connection's HasBlocks with 3 held under --max-conns 3: %v (want DEADLINE_EXCEEDED: not accepted)", err)
	}
	held[0].conn.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kc.HasBlocks(ctx, &tlkvpb.HasBlocksRequest{BlockTokens: B}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("the 4th connection's HasBlocks once one of the 3 closed: %v", err)
	}
	if g := gauge(); g != "3" {
		t.Fatalf("kvx_transfer_connections_open %s with 2 held and the 4th served", g)
	}
}

// Streams opened and left idle (no chunk, or one chunk and then nothing)
// and a stream trickling one byte every 50 ms held --max-streams for good:
// every other sender got RESOURCE_EXHAUSTED for as long as they stayed
// (there was no idle timeout). Now a stream that brings no whole chunk
// for StreamIdle is cut with DEADLINE_EXCEEDED, nothing of it published,
// and the slots come back.
// PROMISE: XFER-15
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
// PROMISE: XFER-15
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

// --max-stream-bytes at its boundary: payloads of exactly the limit are
// accepted, one byte more is RESOURCE_EXHAUSTED with nothing published.
// PROMISE: XFER-14
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
