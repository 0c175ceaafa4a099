// client_test.go - transfer.Client.Push against a busy receiver: a HasBlocks
// refused as busy is retried with backoff, then the push sends every
// payload.
package transfer

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// transfer.Client.Push retries a HasBlocks refused as busy: with the one
// slot of --max-has-blocks 1 held by a call that never finishes its
// request, a push with NoRetry fails UNAVAILABLE at once, and a plain
// push waits out the held call (cut at the 1 s idle limit): its HasBlocks
// is answered (the receiver holds the prompt: every block referenced).
// PROMISE: XFER-22
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
// PROMISE: XFER-22
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
