// ack_test.go - the sender decides what counts as acknowledged: a
// receiver's answer that is not durable, or whose counts differ from what
// was sent, is an error of Push and a failure of kvxd push.
package transfer

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"kvx.dev/transfer/tlkvpb"
)

// ackServer is a receiver that stores nothing: HasBlocks reports nothing
// held, and PushKv answers the counts of what it received, changed by lie.
type ackServer struct {
	tlkvpb.UnimplementedKvTransferServer
	lie func(*tlkvpb.PushKvResponse)
}

func (s *ackServer) HasBlocks(ctx context.Context, req *tlkvpb.HasBlocksRequest) (*tlkvpb.HasBlocksResponse, error) {
	return &tlkvpb.HasBlocksResponse{Held: make([]bool, len(req.BlockHashes))}, nil
}

func (s *ackServer) PushKv(st tlkvpb.KvTransfer_PushKvServer) error {
	resp := &tlkvpb.PushKvResponse{Durable: true}
	for {
		ch, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		resp.BytesReceived += uint64(len(ch.Payload))
		switch {
		case len(ch.Tokens) < B:
			resp.TailTokens = uint32(len(ch.Tokens))
		case len(ch.Payload) == 0:
			resp.BlocksReferenced++
		default:
			resp.BlocksStored++
		}
	}
	s.lie(resp)
	return st.SendAndClose(resp)
}

// Push returned nil for an answer with durable=false (an empty
// PushKvResponse, from a receiver that is not kvx, a proxy or a broken
// one, is one) or with counts not matching what was sent, and kvxd push
// exited 0: an engine freeing its KV on success lost blocks never made
// durable. Now each is an *AckError naming the field, and kvxd push
// exits 1.
// PROMISE: XFER-5
func TestPushRefusesUnacknowledgedAnswer(t *testing.T) {
	ctx := context.Background()
	a, adir := createStore(t, testGeom, 0)
	const nb = 3
	tokens := tokensOf(7, nb*B+2)
	putPrompt(t, a, tokens)
	tail := tailOf(t, tokens, nb, 2)
	for _, c := range []struct {
		name  string
		tail  bool
		lie   func(*tlkvpb.PushKvResponse)
		field string // "" = acknowledged
	}{
		{"honest", true, func(*tlkvpb.PushKvResponse) {}, ""},
		{"honest without a tail", false, func(*tlkvpb.PushKvResponse) {}, ""},
		{"empty answer", true, func(r *tlkvpb.PushKvResponse) { *r = tlkvpb.PushKvResponse{} }, "durable"},
		{"durable=false", true, func(r *tlkvpb.PushKvResponse) { r.Durable = false }, "durable"},
		{"bytes_received short", true, func(r *tlkvpb.PushKvResponse) { r.BytesReceived-- }, "bytes_received"},
		{"bytes_received over", false, func(r *tlkvpb.PushKvResponse) { r.BytesReceived++ }, "bytes_received"},
		{"tail_tokens short", true, func(r *tlkvpb.PushKvResponse) { r.TailTokens-- }, "tail_tokens"},
		{"tail_tokens without a tail", false, func(r *tlkvpb.PushKvResponse) { r.TailTokens = 1 }, "tail_tokens"},
		{"blocks_stored over", true, func(r *tlkvpb.PushKvResponse) { r.BlocksStored++ }, "blocks_stored"},
		{"blocks_referenced", true, func(r *tlkvpb.PushKvResponse) { r.BlocksReferenced = 1 }, "blocks_referenced"},
		// a block sent with its payload that the receiver already held is
		// counted in neither: fewer stored is an acknowledgement
		{"blocks_stored fewer", true, func(r *tlkvpb.PushKvResponse) { r.BlocksStored = 1 }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := startGRPC(t, &ackServer{lie: c.lie})
			o := &PushOptions{}
			if c.tail {
				o.Tail = tail
			}
			r, err := NewClient(dial(t, addr)).Push(ctx, a, tokens, o)
			if c.field == "" {
				if err != nil || !r.Durable {
					t.Fatalf("an acknowledging answer: %v %+v", err, r)
				}
				return
			}
			var ae *AckError
			if !errors.As(err, &ae) || !errors.Is(err, ErrNotAcknowledged) {
				t.Fatalf("Push returned %v (%+v), want an *AckError", err, r)
			}
			if ae.Field != c.field || !strings.Contains(err.Error(), c.field) || ae.Response == nil {
				t.Fatalf("AckError %+v (%v), want field %s", ae, err, c.field)
			}
		})
	}
	a.Close()

	// kvxd push: exit 1 with the field on stderr, nothing on stdout
	bad := startGRPC(t, &ackServer{lie: func(r *tlkvpb.PushKvResponse) { r.Durable = false }})
	out, errOut, code := runKvxd(t, append([]string{"push", "--store", adir, "--to", bad}, tokenArgs(tokens)...)...)
	if code != 1 || out != "" || !strings.Contains(errOut, "durable=false") {
		t.Fatalf("kvxd push to a receiver answering durable=false: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	short := startGRPC(t, &ackServer{lie: func(r *tlkvpb.PushKvResponse) { r.BytesReceived /= 2 }})
	out, errOut, code = runKvxd(t, append([]string{"push", "--store", adir, "--to", short, "--json"}, tokenArgs(tokens)...)...)
	if code != 1 || out != "" || !strings.Contains(errOut, "bytes_received") {
		t.Fatalf("kvxd push to a receiver answering half the bytes: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	good := startGRPC(t, &ackServer{lie: func(*tlkvpb.PushKvResponse) {}})
	out, errOut, code = runKvxd(t, append([]string{"push", "--store", adir, "--to", good}, tokenArgs(tokens)...)...)
	if code != 0 || !strings.HasSuffix(out, "durable true\n") {
		t.Fatalf("kvxd push to an honest receiver: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
