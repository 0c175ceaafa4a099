// helpers_test.go - stores, prompts, servers and processes for the tests,
// and a raw HTTP/2 client that trickles a message (a slowloris).
//
// Stores are real kvx stores (the core Go package over the C library);
// servers are a Server on a real loopback gRPC listener, or the kvxd
// binary as a separate process. KVXD names the binary to test (ctest
// passes the CMake-built one); without it TestMain builds cmd/kvxd into a
// temporary directory with the same environment (CGO_LDFLAGS).
package transfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

// B = 4 (the C tests' collision fixture is for B = 4); 512-byte fp16 pages,
// 556-byte v1 one-block envelopes.
var testGeom = kvx.Geometry{Layers: 1, KVHeads: 2, HeadDim: 16, BlockTokens: 4, Quant: kvx.QuantFP16,
	ModelSignature: 0x1122334455667788}

const B = 4

var kvxdPath string

func TestMain(m *testing.M) {
	if os.Getenv("KVX_XFER_HELPER") != "" {
		os.Exit(helperMain())
	}
	code := func() int {
		kvxdPath = os.Getenv("KVXD")
		if kvxdPath == "" {
			dir, err := os.MkdirTemp("", "kvxd-bin")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			kvxdPath = filepath.Join(dir, "kvxd")
			cmd := exec.Command("go", "build", "-o", kvxdPath, "./cmd/kvxd")
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				fmt.Fprintln(os.Stderr, "building kvxd:", err)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

// envSize is a one-block envelope's bytes for testGeom in version v.
func envSize(v int) int {
	P := int(testGeom.Layers * 2 * testGeom.KVHeads * testGeom.BlockTokens * testGeom.HeadDim)
	if v == 2 {
		P += int(testGeom.Layers*2*testGeom.KVHeads) * 4
	} else {
		P *= 2
	}
	return 28 + 12 + P + 4
}

// tokensOf is prompt seq: n ids; prompts of the same family share their
// first `shared` tokens.
func tokensOf(seq, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32((seq*1000003+i*7919+1)&0xFFFFFF) + 1
	}
	return t
}

func sharedTokens(family, seq, shared, n int) []uint32 {
	t := tokensOf(seq+1000*family+7, n)
	copy(t, tokensOf(family, shared))
	return t
}

// pagesFor: each full block's page is derived from its hash, so a page
// served for the wrong block is always noticed.
func pagesFor(g kvx.Geometry, tokens []uint32) []byte {
	pb := int(g.PageBytes(g.BlockTokens))
	hs := kvx.BlockHashes(tokens, g.BlockTokens)
	out := make([]byte, pb*len(hs))
	for i, h := range hs {
		fillPage(out[i*pb:(i+1)*pb], h)
	}
	finite(g.Quant, out)
	return out
}

// finite masks random bytes to finite values of q (no NaN or inf), so
// every envelope version carries them exactly.
func finite(q kvx.Quant, p []byte) {
	if q.ElemSize() == 1 {
		for j := range p {
			p[j] &= 0xBF // exponent's top bit clear: finite in E4M3FN and E5M2
		}
		return
	}
	for j := 1; j < len(p); j += 2 {
		p[j] &= 0xBF // the high byte: finite in f16 and bf16
	}
}

// fillPage: xorshift bytes from seed; f16 values of any bit pattern are
// fine for a v1 export of an fp16 store (copied as is).
func fillPage(p []byte, seed uint64) {
	x := seed | 1
	for j := 0; j+8 <= len(p); j += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(p[j:], x)
	}
}

func createStore(t testing.TB, g kvx.Geometry, capacity uint64) (*kvx.Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	s, err := kvx.Create(dir, kvx.StoreOptions{Geometry: g, CapacityBytes: capacity})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

// putPrompt stores the full blocks of tokens (flushed).
func putPrompt(t testing.TB, s *kvx.Store, tokens []uint32) {
	t.Helper()
	g := s.Geometry()
	if _, err := s.Put(tokens, pagesFor(g, tokens), nil); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// served is how many leading blocks of tokens s serves, failing the test
// when a served page is not the block's own.
func served(t testing.TB, s *kvx.Store, tokens []uint32) int {
	t.Helper()
	v, err := s.Prefix(tokens)
	if err != nil {
		t.Fatalf("Prefix: %v", err)
	}
	defer v.Release()
	want := pagesFor(s.Geometry(), tokens)
	pb := int(s.Geometry().PageBytes(B))
	for i := 0; i < v.Len(); i++ {
		if string(v.At(i).Page()) != string(want[i*pb:(i+1)*pb]) {
			t.Fatalf("block %d served with the wrong bytes", i)
		}
	}
	return v.Len()
}

func blocksIn(t testing.TB, s *kvx.Store) uint64 {
	t.Helper()
	st, err := s.Stat()
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	return st.Blocks
}

// testServer is a Server on a loopback listener.
type testServer struct {
	*Server
	addr string
	gs   *grpc.Server
}

func startServer(t testing.TB, store *kvx.Store, opts ServerOptions, gopts ...grpc.ServerOption) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(store, opts)
	gs := grpc.NewServer(append(srv.GRPCOptions(), gopts...)...)
	tlkvpb.RegisterKvTransferServer(gs, srv)
	go gs.Serve(lis) //nolint:errcheck
	ts := &testServer{Server: srv, addr: lis.Addr().String(), gs: gs}
	t.Cleanup(func() { gs.Stop(); srv.Close() })
	return ts
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.Dial(addr, grpc.WithInsecure(),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// envelopeOf exports block i of tokens (held in s) as a one-block envelope.
func envelopeOf(t testing.TB, s *kvx.Store, tokens []uint32, i int, version uint16) []byte {
	t.Helper()
	v, err := s.GetBlock(tokens[:(i+1)*B])
	if err != nil {
		t.Fatalf("GetBlock %d: %v", i, err)
	}
	defer v.Release()
	env, err := s.Export(v, version)
	if err != nil {
		t.Fatalf("Export: %v", err)
	}
	return env
}

// chunkOf is block i of tokens as a sender makes it (payload or empty).
func chunkOf(t testing.TB, s *kvx.Store, tokens []uint32, i int, empty bool) *tlkvpb.KvChunk {
	t.Helper()
	hs := kvx.BlockHashes(tokens[:(i+1)*B], B)
	ch := &tlkvpb.KvChunk{KvFormat: 1, BlockHash: hs[i], Tokens: tokens[i*B : (i+1)*B],
		ModelSignature: testGeom.ModelSignature}
	if !empty {
		ch.Payload = envelopeOf(t, s, tokens, i, 1)
		ch.Crc32C = CRC32C(ch.Payload)
	}
	return ch
}

// tailOf is a tail of n tokens after the full blocks of tokens[:nb*B].
func tailOf(t testing.TB, tokens []uint32, nb, n int) *Tail {
	t.Helper()
	page := make([]byte, testGeom.PageBytes(uint32(n)))
	fillPage(page, uint64(tokens[nb*B])*31+uint64(n))
	env, err := BlockEnvelope(testGeom, 1, 0, page, uint32(n), nil)
	if err != nil {
		t.Fatalf("BlockEnvelope: %v", err)
	}
	return &Tail{Tokens: tokens[nb*B : nb*B+n], Envelope: env}
}

// pushChunks sends chunks on one stream and returns the answer.
func pushChunks(ctx context.Context, conn *grpc.ClientConn, chunks []*tlkvpb.KvChunk) (*tlkvpb.PushKvResponse, error) {
	st, err := tlkvpb.NewKvTransferClient(conn).PushKv(ctx)
	if err != nil {
		return nil, err
	}
	for _, ch := range chunks {
		if err := st.Send(ch); err != nil {
			break // the server ended the stream: CloseAndRecv has its status
		}
	}
	return st.CloseAndRecv()
}

// recorder is a Sink that keeps what it saw.
type recorder struct {
	mu     sync.Mutex
	blocks []Block
	done   []error
	seen   chan struct{} // one send per block, when not nil
}

func (r *recorder) Block(ctx context.Context, b Block) error {
	r.mu.Lock()
	r.blocks = append(r.blocks, b)
	r.mu.Unlock()
	if r.seen != nil {
		select {
		case r.seen <- struct{}{}:
		default:
		}
	}
	return nil
}

func (r *recorder) Done(ctx context.Context, res Result, err error) {
	r.mu.Lock()
	r.done = append(r.done, err)
	r.mu.Unlock()
}

func (r *recorder) snapshot() ([]Block, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Block(nil), r.blocks...), append([]error(nil), r.done...)
}

// kvxd is a running kvxd serve process.
type kvxdProc struct {
	cmd     *exec.Cmd
	addr    string
	metrics string
	out     *syncBuf
	exited  chan error
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startKvxd runs `kvxd serve --store dir --listen 127.0.0.1:0 args...` and
// waits for its "listening on" line.
func startKvxd(t testing.TB, dir string, args ...string) *kvxdProc {
	t.Helper()
	listen := "127.0.0.1:0"
	for i, a := range args {
		if a == "--listen" {
			listen = args[i+1]
			args = append(append([]string{}, args[:i]...), args[i+2:]...)
			break
		}
	}
	full := append([]string{"serve", "--store", dir, "--listen", listen}, args...)
	p := &kvxdProc{cmd: exec.Command(kvxdPath, full...), out: &syncBuf{}, exited: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill() //nolint:errcheck
			<-p.exited
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		out := p.out.String()
		if i := strings.Index(out, "kvxd: listening on "); i >= 0 {
			rest := out[i+len("kvxd: listening on "):]
			p.addr = strings.Fields(rest)[0]
			if j := strings.Index(out, "kvxd: metrics on http://"); j >= 0 {
				p.metrics = strings.TrimSuffix(strings.Fields(out[j+len("kvxd: metrics on http://"):])[0], "/metrics")
			}
			return p
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("kvxd exited (%v): %s", err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("kvxd did not start: %s", p.out.String())
	return nil
}

// wait waits for the process to exit and returns its exit code.
func (p *kvxdProc) wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("kvxd did not exit: %s", p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// runKvxd runs kvxd with args and returns stdout, stderr and the exit code.
func runKvxd(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(kvxdPath, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("kvxd %v: %v", args, err)
		}
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

func tokenArgs(tokens []uint32) []string {
	out := make([]string, len(tokens))
	for i, v := range tokens {
		out[i] = fmt.Sprint(v)
	}
	return out
}

// kvxCLI is the kvx command of the build the package links (KVX_CLI, else
// ../../../build/kvx); "" when there is none.
func kvxCLI() string {
	if p := os.Getenv("KVX_CLI"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		return ""
	}
	p, _ := filepath.Abs("../../../build/kvx")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

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
