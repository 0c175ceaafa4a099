// hasblocks_test.go - HasBlocks against hostile callers: the largest request
// gRPC takes, the --max-has-blocks cap checked by kvxd's tap before a
// request is read (memory, slots held by trickled calls, the slot freed
// however a call ends, the path's spellings).
package transfer

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

// The largest HasBlocks gRPC lets through (about 530,000 hashes) is
// answered, one past the receive limit is refused by gRPC, and a request
// naming more blocks than its tokens hold is INVALID_ARGUMENT; kvxd keeps
// serving.
// PROMISE: XFER-14
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

// 100 concurrent HasBlocks of 4 MiB on one connection took kvxd's peak
// resident memory past 700 MiB (1.3 GiB seen): gRPC reads each unary
// request whole before the handler runs, and nothing capped the calls in
// flight, so more calls or connections took it further. kvxd's tap now
// refuses a HasBlocks past --max-has-blocks (8) as it opens, before its
// request is read: the peak stays under 256 MiB, the refused calls get
// UNAVAILABLE, some are answered, and HasBlocks works after the storm.
// PROMISE: XFER-13
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
// PROMISE: XFER-13
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
// PROMISE: XFER-13
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

// gRPC routes a :path with or without its leading '/' ("tl.kv.v1.KvTransfer
// /HasBlocks" reaches HasBlocks too); the tap compared the raw path, so
// the unslashed spelling went past the cap and the memory attack worked
// again. Both spellings count now.
// PROMISE: XFER-13
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
