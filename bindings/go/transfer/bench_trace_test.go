// bench_trace_test.go - the Mooncake conversation trace (FAST'25,
// ../shared/data/mooncake_fast25_conversation_trace.jsonl) replayed
// between two stores over tl.kv.v1: the bytes a prefill engine moves to a
// decode engine with HasBlocks (only the blocks the receiver lacks) against
// without it (every block of every prompt), and the HasBlocks bytes against
// the spec's formula, (missing full blocks + 0 tail) x envelope size,
// exactly. Each request's hash_ids name its blocks (equal ids, equal
// prefix), so each id becomes B deterministic token ids. Not part of the
// test suite; run with
//
//	KVX_XFER_BENCH=1 [KVX_XFER_TRACE_REQUESTS=2000] [KVX_XFER_TRACE=FILE] \
//	    go test -count=1 -run TestBenchTraceReplay -v
package transfer

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	kvx "kvx.dev/kvx"
)

func TestBenchTraceReplay(t *testing.T) {
	if os.Getenv("KVX_XFER_BENCH") == "" {
		t.Skip("KVX_XFER_BENCH=1 runs it")
	}
	limit := 2000
	if v, err := strconv.Atoi(os.Getenv("KVX_XFER_TRACE_REQUESTS")); err == nil && v > 0 {
		limit = v
	}
	// the test runs in bindings/go/transfer; ../shared sits beside the
	// repository (KVX_XFER_TRACE names another copy of the file)
	path := filepath.Join("..", "..", "..", "..", "shared", "data", "mooncake_fast25_conversation_trace.jsonl")
	if p := os.Getenv("KVX_XFER_TRACE"); p != "" {
		path = p
	}
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("trace not found: %v", err)
	}
	defer f.Close()
	var reqs [][]uint64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() && len(reqs) < limit {
		var r struct {
			HashIDs []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("trace line %d: %v", len(reqs)+1, err)
		}
		reqs = append(reqs, r.HashIDs)
	}
	// 4 KiB e4m3 pages: the byte counts, not the page size, are the point
	g := kvx.Geometry{Layers: 1, KVHeads: 2, HeadDim: 64, BlockTokens: 16, Quant: kvx.QuantE4M3, ModelSignature: 0x5eed}
	const B = 16
	capacity := uint64(8) << 30
	a, _ := createStore(t, g, capacity)
	with, _ := createStore(t, g, capacity)
	without, _ := createStore(t, g, capacity)
	cWith := NewClient(dial(t, startServer(t, with, ServerOptions{}).addr))
	cWithout := NewClient(dial(t, startServer(t, without, ServerOptions{}).addr))
	envBytes := uint64(28 + 12 + 4 + int(g.Layers*2*g.KVHeads*B*g.HeadDim) + int(g.Layers*2*g.KVHeads)*4) // v2
	seen := map[uint64]bool{}                                                                             // chained hashes the receiver holds
	var bytesWith, bytesWithout, missingAll, blocksAll uint64
	var tWith, tWithout time.Duration
	ctx := context.Background()
	for _, ids := range reqs {
		tokens := make([]uint32, 0, len(ids)*B)
		for _, id := range ids {
			for j := 0; j < B; j++ {
				tokens = append(tokens, uint32(id*B)+uint32(j)+1)
			}
		}
		if _, err := a.Put(tokens, pagesFor(g, tokens), nil); err != nil {
			t.Fatalf("Put: %v", err)
		}
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, h := range kvx.BlockHashes(tokens, B) {
			if !seen[h] {
				missingAll++
				seen[h] = true
			}
			blocksAll++
		}
		t0 := time.Now()
		rw, err := cWith.Push(ctx, a, tokens, nil)
		tWith += time.Since(t0)
		if err != nil || !rw.Durable {
			t.Fatalf("push with HasBlocks: %v", err)
		}
		t0 = time.Now()
		ro, err := cWithout.Push(ctx, a, tokens, &PushOptions{NoHasBlocks: true})
		tWithout += time.Since(t0)
		if err != nil || !ro.Durable {
			t.Fatalf("push without HasBlocks: %v", err)
		}
		bytesWith += rw.BytesSent
		bytesWithout += ro.BytesSent
	}
	if bytesWith != missingAll*envBytes {
		t.Fatalf("with HasBlocks: %d bytes, the formula gives %d missing blocks x %d = %d", bytesWith, missingAll,
			envBytes, missingAll*envBytes)
	}
	if bytesWithout != blocksAll*envBytes {
		t.Fatalf("without HasBlocks: %d bytes, want %d blocks x %d", bytesWithout, blocksAll, envBytes)
	}
	t.Logf("%d requests, %d blocks (%d distinct): with HasBlocks %d bytes in %.2f s, without %d bytes in %.2f s: "+
		"%.3fx the bytes (%.1f%% saved), HasBlocks bytes = formula exactly",
		len(reqs), blocksAll, missingAll, bytesWith, tWith.Seconds(), bytesWithout, tWithout.Seconds(),
		float64(bytesWith)/float64(bytesWithout), 100*(1-float64(bytesWith)/float64(bytesWithout)))
}
