// bench_push_test.go - tl.kv.v1 push throughput on loopback against its
// physical reference in the same run: a bare gRPC stream of the same
// envelope bytes (same service, same messages, the sender sending
// pre-built envelopes from memory) whose receiver writes them to a file and
// fsyncs once at the end. Not part of the test suite (seconds of disk
// writes); run with
//
//	KVX_XFER_BENCH=1 [KVX_XFER_BENCH_MIB=256] [KVX_XFER_BENCH_RUNS=3] \
//	    go test -count=1 -run TestBenchPushVsBareStream -v
package transfer

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

// bareServer writes every payload to a file and fsyncs once at the end.
type bareServer struct {
	tlkvpb.UnimplementedKvTransferServer
	dir string
	n   int
}

func (s *bareServer) PushKv(st tlkvpb.KvTransfer_PushKvServer) error {
	s.n++
	f, err := os.Create(filepath.Join(s.dir, "bare"+strconv.Itoa(s.n)))
	if err != nil {
		return err
	}
	defer f.Close()
	var total uint64
	for {
		ch, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if _, err := f.Write(ch.Payload); err != nil {
			return err
		}
		total += uint64(len(ch.Payload))
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return st.SendAndClose(&tlkvpb.PushKvResponse{BytesReceived: total, Durable: true})
}

func TestBenchPushVsBareStream(t *testing.T) {
	if os.Getenv("KVX_XFER_BENCH") == "" {
		t.Skip("KVX_XFER_BENCH=1 runs it")
	}
	mib := 256
	if v, err := strconv.Atoi(os.Getenv("KVX_XFER_BENCH_MIB")); err == nil && v > 0 {
		mib = v
	}
	runs := 3
	if v, err := strconv.Atoi(os.Getenv("KVX_XFER_BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}
	// a 2 MiB fp16 page per block (L 32, Hkv 8, D 128, B 16): 2 MiB + 44 B envelopes
	g := kvx.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, Quant: kvx.QuantFP16, ModelSignature: 0x5eed}
	pb := int(g.PageBytes(16))
	nb := mib << 20 / pb
	dir := t.TempDir()
	a, err := kvx.Create(filepath.Join(dir, "a"), kvx.StoreOptions{Geometry: g, CapacityBytes: uint64(4*mib) << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	tokens := make([]uint32, nb*16)
	for i := range tokens {
		tokens[i] = uint32(i*7919+17) & 0xFFFFFF
	}
	pages := pagesFor(g, tokens)
	if _, err := a.Put(tokens, pages, nil); err != nil || a.Flush() != nil {
		t.Fatalf("Put: %v", err)
	}
	pages = nil
	envs := make([][]byte, nb)
	for i := range envs {
		v, err := a.GetBlock(tokens[:(i+1)*16])
		if err != nil {
			t.Fatal(err)
		}
		envs[i], err = a.Export(v, 1)
		v.Release()
		if err != nil {
			t.Fatal(err)
		}
	}
	total := uint64(nb * len(envs[0]))

	bareDir := filepath.Join(dir, "bare")
	os.Mkdir(bareDir, 0o700) //nolint:errcheck
	bare := startGRPC(t, &bareServer{dir: bareDir})
	var kvxT, bareT []time.Duration
	for r := 0; r < runs; r++ {
		// kvx: a fresh receiver store each run, so every block moves and is stored
		b, err := kvx.Create(filepath.Join(dir, "b"+strconv.Itoa(r)), kvx.StoreOptions{Geometry: g, CapacityBytes: uint64(4*mib) << 20})
		if err != nil {
			t.Fatal(err)
		}
		ts := startServer(t, b, ServerOptions{})
		c := NewClient(dial(t, ts.addr))
		t0 := time.Now()
		res, err := c.Push(context.Background(), a, tokens, nil)
		d := time.Since(t0)
		if err != nil || res.BytesSent != total || res.Response.BlocksStored != uint32(nb) || !res.Durable {
			t.Fatalf("kvx push: %v %+v", err, res)
		}
		kvxT = append(kvxT, d)
		ts.gs.Stop()
		ts.Close()
		b.Close()
		os.RemoveAll(filepath.Join(dir, "b"+strconv.Itoa(r))) //nolint:errcheck

		conn := dial(t, bare)
		t0 = time.Now()
		var chunks []*tlkvpb.KvChunk
		for i, e := range envs {
			chunks = append(chunks, &tlkvpb.KvChunk{KvFormat: 1, Payload: e, Crc32C: CRC32C(e), Tokens: tokens[i*16 : (i+1)*16]})
		}
		resp, err := pushChunks(context.Background(), conn, chunks)
		d = time.Since(t0)
		if err != nil || resp.BytesReceived != total {
			t.Fatalf("bare stream: %v", err)
		}
		bareT = append(bareT, d)
		os.RemoveAll(bareDir)    //nolint:errcheck
		os.Mkdir(bareDir, 0o700) //nolint:errcheck
	}
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	gbps := func(d time.Duration) float64 { return float64(total) / d.Seconds() / 1e9 }
	for r := range kvxT {
		t.Logf("run %d: kvx push %.3f s (%.2f GB/s), bare stream + fsync %.3f s (%.2f GB/s): %.2fx",
			r, kvxT[r].Seconds(), gbps(kvxT[r]), bareT[r].Seconds(), gbps(bareT[r]), bareT[r].Seconds()/kvxT[r].Seconds())
	}
	t.Logf("%d blocks, %d bytes per stream (%d x %d-byte envelopes = the formula's (missing full blocks + 0 tail) x envelope size)",
		nb, total, nb, len(envs[0]))
	t.Logf("median: kvx %.2f GB/s, bare %.2f GB/s: kvx/bare %.2fx (target >= 0.8x)",
		gbps(med(kvxT)), gbps(med(bareT)), med(bareT).Seconds()/med(kvxT).Seconds())
}

// startGRPC serves srv's KvTransfer on a loopback listener.
func startGRPC(t *testing.T, srv tlkvpb.KvTransferServer) string {
	t.Helper()
	ts := grpc.NewServer(GRPCServerOptions()...)
	tlkvpb.RegisterKvTransferServer(ts, srv)
	lis, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	go ts.Serve(lis) //nolint:errcheck
	t.Cleanup(ts.Stop)
	return lis.Addr().String()
}
