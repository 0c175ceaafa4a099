// fuzz_test.go - FuzzChunk: the chunk handler (one kvx_xfer_stream_chunk
// through the package's wrapper, as PushKv calls it) on arbitrary chunks.
// Its seeds run with every `go test`; fuzz with
//
//	go test -run '^$' -fuzz FuzzChunk -fuzztime 60s
package transfer

import (
	"encoding/binary"
	"testing"

	"google.golang.org/grpc/codes"

	kvx "kvx.dev/kvx"
)

func u32bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

// PROMISE: XFER-3, XFER-7, XFER-16
func FuzzChunk(f *testing.F) {
	// the receiver holds the prompt's first 2 of 3 blocks
	recv, _ := createStore(f, testGeom, 0)
	send, _ := createStore(f, testGeom, 0)
	tokens := tokensOf(20, 3*B+2)
	putPrompt(f, send, tokens)
	putPrompt(f, recv, tokens[:2*B])
	h := kvx.BlockHashes(tokens, B)
	env0 := envelopeOf(f, send, tokens, 0, 1)
	env2 := envelopeOf(f, send, tokens, 2, 1)
	tail := tailOf(f, tokens, 3, 2)
	sig := testGeom.ModelSignature
	t0 := u32bytes(tokens[:B])
	f.Add(uint32(1), h[0], env0, CRC32C(env0), t0, sig, false)                        // valid, held already
	f.Add(uint32(1), h[0], []byte{}, uint32(0), t0, uint64(0), false)                 // empty: referenced
	f.Add(uint32(1), h[0], env0, uint32(0), t0, sig, true)                            // crc fixed by the harness
	f.Add(uint32(2), h[0], env0, CRC32C(env0), t0, sig, false)                        // version differs
	f.Add(uint32(0), h[0], env0, CRC32C(env0), t0, sig, false)                        // format 0
	f.Add(uint32(1), h[2], env2, CRC32C(env2), u32bytes(tokens[2*B:3*B]), sig, false) // not block 0's chain
	f.Add(uint32(1), uint64(0), tail.Envelope, CRC32C(tail.Envelope), u32bytes(tail.Tokens), sig, false)
	f.Add(uint32(1), h[0], env0[:len(env0)-5], uint32(0), t0, sig, true) // truncated
	f.Add(uint32(3), h[0], []byte("TLKV"), uint32(0), []byte{1, 2, 3}, uint64(7), true)
	before := blocksIn(f, recv)

	f.Fuzz(func(t *testing.T, format uint32, hash uint64, payload []byte, crc uint32, tokBytes []byte, msig uint64, fixCRC bool) {
		toks := make([]uint32, len(tokBytes)/4)
		for i := range toks {
			toks[i] = binary.LittleEndian.Uint32(tokBytes[4*i:])
		}
		if fixCRC {
			crc = CRC32C(payload)
		}
		cs, err := newCStream(recv)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.destroy() // never finished: nothing may be published
		info, err := cs.chunk(&Chunk{KvFormat: format, BlockHash: hash, Payload: payload, CRC32C: crc, Tokens: toks,
			ModelSignature: msig})
		if err != nil {
			e, ok := err.(*Error)
			if !ok || e.Message == "" {
				t.Fatalf("not a transfer error with a message: %#v", err)
			}
			switch e.GRPC {
			case codes.FailedPrecondition, codes.DataLoss, codes.Aborted, codes.InvalidArgument:
			default:
				t.Fatalf("code %v for a bad chunk: %s", e.GRPC, e.Message)
			}
			if format != 1 && format != 2 && format != 3 && e.GRPC != codes.FailedPrecondition {
				t.Fatalf("kv_format %d answered %v, not FAILED_PRECONDITION (checked first)", format, e.GRPC)
			}
			return
		}
		// accepted: the receiver's own hash of the tokens, never the sent one
		if info.Index != 0 || int(info.NTokens) != len(toks) {
			t.Fatalf("accepted chunk: %+v for %d tokens", info, len(toks))
		}
		if info.Tail {
			if len(toks) >= B || info.Stored || info.Referenced || hash != 0 {
				t.Fatalf("a tail: %+v (hash %x)", info, hash)
			}
		} else if want := kvx.BlockHash(0, toks); len(toks) != B || info.Hash != want || hash != want {
			t.Fatalf("accepted block hash %x, tokens hash to %x, sent %x", info.Hash, want, hash)
		}
		if len(payload) == 0 && !info.Tail && !info.Referenced {
			t.Fatalf("an empty payload accepted without a reference: %+v", info)
		}
		if p := cs.progress(); p.BytesReceived != uint64(len(payload)) {
			t.Fatalf("progress %d bytes, payload %d", p.BytesReceived, len(payload))
		}
	})
	if n := blocksIn(f, recv); n != before {
		f.Fatalf("unfinished streams published: %d blocks, %d before", n, before)
	}
}
