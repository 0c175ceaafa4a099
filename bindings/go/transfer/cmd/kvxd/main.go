// kvxd is kvx's tl.kv.v1 daemon: `kvxd serve` receives pushes into a store
// over gRPC, `kvxd push` sends a prompt's cached prefix from a local store
// to a remote kvxd. The protocol and its rules: docs/TRANSFER.md.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer"
	"kvx.dev/transfer/tlkvpb"
)

const usage = `usage: kvxd <command> [options]

kvx's tl.kv.v1 daemon: KV blocks between engines over gRPC, only the
blocks the receiver lacks, verified on arrival, durable before they are
acknowledged (docs/TRANSFER.md).

commands:
  serve --store DIR [--listen ADDR] [--tls-cert F --tls-key F [--client-ca F]]
        [--insecure] [--lease-ttl D] [--max-streams N] [--max-stream-bytes N]
        [--stream-idle D] [--max-leases N] [--max-has-blocks N]
        [--max-header-list-bytes N] [--max-conn-streams N] [--conn-idle D]
        [--handshake-timeout D] [--max-conns N] [--metrics ADDR] [--drain D]
      Receive pushes into the store DIR (created with kvx store create),
      holding its writer lock; kvx store prefix/get/stat/verify work beside
      it. --listen defaults to 127.0.0.1:7450; a non-loopback address needs
      TLS (--tls-cert, --tls-key; --client-ca requires client certificates
      signed by that CA: mTLS) or --insecure. --lease-ttl (default 30s):
      how long blocks HasBlocks reported held stay pinned for the push.
      --max-streams (64): PushKv streams at once. --max-stream-bytes (0, no
      limit): payload bytes of one stream. --stream-idle (30s): a PushKv
      stream that brings no whole chunk for D is cut (DEADLINE_EXCEEDED,
      nothing of it published). --max-leases (4096): live HasBlocks
      leases; past it the oldest is released first. --max-has-blocks (8):
      HasBlocks calls in flight; past it a call is refused before its
      request is read (UNAVAILABLE), and each must be answered within
      --stream-idle. Each connection: --max-header-list-bytes (16384): a
      call whose HTTP/2 header list, decoded, is larger is reset before it
      runs; --max-conn-streams (--max-streams + --max-has-blocks + 8):
      calls open at once on it; --conn-idle (60s): closed after D with no
      call open; --handshake-timeout (10s): its TLS handshake and HTTP/2
      preface must be done within D. --max-conns (256, at most 1048576):
      connections open at once; past it kvxd accepts the next only as one
      closes (the others wait in the kernel's queue). --metrics ADDR serves
      Prometheus metrics on http://ADDR/metrics (a bare :PORT binds
      127.0.0.1; a request's headers must arrive within
      --handshake-timeout, its answer be read within 30s, an idle
      connection is closed after --conn-idle, and --max-conns caps its
      connections apart). Both listeners follow one rule: a non-loopback
      address serves TLS (the metrics as https://, with the same
      certificate and --client-ca) or needs --insecure. Ranges, checked
      when parsed: --lease-ttl 1ms..4294967295ms in whole ms (HasBlocks
      answers it as a uint32 of ms), --max-streams and --max-has-blocks
      1..1048576 (their sum is a uint32), --max-leases at least 1,
      --stream-idle, --conn-idle and --handshake-timeout at least 1ms,
      --drain 0 or more.
      SIGTERM or SIGINT: stop accepting, let streams in flight finish for
      --drain (10s), abort the rest (nothing of them is published), flush,
      exit 0. Prints "kvxd: listening on ADDR" once it serves.

  push --store DIR --to ADDR [--format v1|v2|v3] [--ca F] [--cert F --key F]
       [--insecure] [--json] [--timeout D] TOKEN...
      Push the cached prefix of TOKEN... (full blocks held in DIR, opened
      read-only) to the kvxd at ADDR: HasBlocks, then one PushKv stream
      that sends only the blocks the receiver lacks. The format defaults
      to the lossless one for DIR's quant (fp16, e5m2: v1; e4m3: v2; bf16:
      v3). TLS when --ca or --cert is given or ADDR is not loopback (system
      roots without --ca); plaintext to a loopback ADDR or with --insecure.
      Prints "blocks sent N, referenced N, bytes sent N, tail tokens N,
      durable true"; --json: {"blocks_sent", "blocks_referenced",
      "bytes_sent", "tail_tokens", "durable"}. --timeout (none): give up
      after D. Exit 0 only when the receiver answered durable=true with the
      counts of what was sent; any other answer is a failure (exit 1, the
      field at fault on stderr).

exit status: 0 ok; 1 failed (the gRPC status and the receiver's message on
stderr, or the field of the receiver's answer that does not acknowledge
the push); 2 usage.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "serve":
		return serve(args[1:], stdout, stderr)
	case "push":
		return push(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "kvxd: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvxd "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return 0, false
		}
		fmt.Fprintf(stderr, "%s: %v\n\n%s", fs.Name(), err, usage)
		return 2, false
	}
	return 0, true
}

// isLoopback: the host of addr is a loopback address or "localhost".
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func serve(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("serve", stderr)
	dir := fs.String("store", "", "")
	listen := fs.String("listen", "127.0.0.1:7450", "")
	cert := fs.String("tls-cert", "", "")
	key := fs.String("tls-key", "", "")
	clientCA := fs.String("client-ca", "", "")
	insecure := fs.Bool("insecure", false, "")
	ttl := fs.Duration("lease-ttl", 30*time.Second, "")
	maxStreams := fs.Int("max-streams", 64, "")
	maxBytes := fs.Uint64("max-stream-bytes", 0, "")
	streamIdle := fs.Duration("stream-idle", 30*time.Second, "")
	maxLeases := fs.Int("max-leases", 4096, "")
	maxHas := fs.Int("max-has-blocks", 8, "")
	maxHeader := fs.Uint("max-header-list-bytes", transfer.DefaultMaxHeaderListBytes, "")
	maxConnStreams := fs.Uint("max-conn-streams", 0, "")
	connIdle := fs.Duration("conn-idle", transfer.DefaultConnIdle, "")
	handshake := fs.Duration("handshake-timeout", transfer.DefaultHandshakeTimeout, "")
	maxConns := fs.Int("max-conns", transfer.DefaultMaxConns, "")
	metricsAddr := fs.String("metrics", "", "")
	drain := fs.Duration("drain", 10*time.Second, "")
	if rc, ok := parse(fs, args, stdout, stderr); !ok {
		return rc
	}
	fail := func(code int, format string, a ...interface{}) int {
		fmt.Fprintf(stderr, "kvxd serve: "+format+"\n", a...)
		return code
	}
	if *dir == "" || fs.NArg() != 0 {
		return fail(2, "--store DIR is required and no other argument is taken (kvxd --help)")
	}
	if (*cert == "") != (*key == "") {
		return fail(2, "--tls-cert and --tls-key go together")
	}
	if *clientCA != "" && *cert == "" {
		return fail(2, "--client-ca needs --tls-cert and --tls-key")
	}
	// Every value is checked here against the range of the type it is
	// sent or stored in (HasBlocks answers lease_ttl_ms in a uint32; the
	// per-connection stream cap is a uint32 sum of the stream caps).
	for _, r := range []struct {
		name      string
		v, lo, hi int64
		unit      string
	}{
		{"--lease-ttl", int64(*ttl / time.Millisecond), 1, math.MaxUint32, "ms"},
		{"--max-streams", int64(*maxStreams), 1, 1 << 20, ""},
		{"--max-leases", int64(*maxLeases), 1, math.MaxInt64, ""},
		{"--max-has-blocks", int64(*maxHas), 1, 1 << 20, ""},
		{"--max-header-list-bytes", int64(*maxHeader), 1024, 1 << 24, ""},
		{"--max-conn-streams", int64(*maxConnStreams), 0, 1 << 20, " (0: --max-streams + --max-has-blocks + 8)"},
		{"--max-conns", int64(*maxConns), 1, 1 << 20, ""},
		{"--stream-idle", int64(*streamIdle / time.Millisecond), 1, math.MaxInt64, "ms"},
		{"--conn-idle", int64(*connIdle / time.Millisecond), 1, math.MaxInt64, "ms"},
		{"--handshake-timeout", int64(*handshake / time.Millisecond), 1, math.MaxInt64, "ms"},
		{"--drain", int64(*drain / time.Millisecond), 0, math.MaxInt64, "ms"},
	} {
		if r.v < r.lo || r.v > r.hi {
			unit, extra := r.unit, ""
			if unit != "ms" {
				unit, extra = "", r.unit
			}
			if r.hi == math.MaxInt64 {
				return fail(2, "%s must be at least %d%s%s", r.name, r.lo, unit, extra)
			}
			return fail(2, "%s must be %d%s .. %d%s%s", r.name, r.lo, unit, r.hi, unit, extra)
		}
	}
	if *ttl%time.Millisecond != 0 {
		return fail(2, "--lease-ttl must be a whole number of milliseconds (HasBlocks answers it in ms), not %v", *ttl)
	}
	var tc *tls.Config
	if *cert != "" {
		pair, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			return fail(1, "%v", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
		if *clientCA != "" {
			pool, err := loadPool(*clientCA)
			if err != nil {
				return fail(1, "%v", err)
			}
			tc.ClientCAs = pool
			tc.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	// One listener policy for both listeners: a non-loopback address
	// serves TLS (the same certificate and client CA) or needs --insecure.
	metricsListen := *metricsAddr
	if strings.HasPrefix(metricsListen, ":") {
		metricsListen = "127.0.0.1" + metricsListen
	}
	for _, l := range []struct{ flag, addr string }{{"--listen", *listen}, {"--metrics", metricsListen}} {
		if l.addr != "" && !isLoopback(l.addr) && tc == nil && !*insecure {
			return fail(2, "%s %s is not a loopback address: give --tls-cert and --tls-key (and --client-ca for mTLS), or --insecure", l.flag, l.addr)
		}
	}
	var gopts []grpc.ServerOption
	if tc != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tc)))
	}

	st, err := kvx.Open(*dir, &kvx.OpenOptions{NoWait: true})
	if err != nil {
		return fail(1, "%s: %v", *dir, err)
	}
	defer st.Close()

	reg := prometheus.NewRegistry()
	var m *transfer.Metrics
	if *metricsAddr != "" {
		if m, err = transfer.NewMetrics(reg); err != nil {
			return fail(1, "metrics: %v", err)
		}
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	srv := transfer.NewServer(st, transfer.ServerOptions{LeaseTTL: *ttl, MaxStreams: *maxStreams,
		MaxStreamBytes: *maxBytes, StreamIdle: *streamIdle, MaxLeases: *maxLeases, MaxHasBlocks: *maxHas,
		MaxHeaderListBytes: uint32(*maxHeader), MaxConnStreams: uint32(*maxConnStreams), ConnIdle: *connIdle,
		HandshakeTimeout: *handshake, Metrics: m})
	gs := grpc.NewServer(append(srv.GRPCOptions(), gopts...)...)
	tlkvpb.RegisterKvTransferServer(gs, srv)

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(1, "%v", err)
	}
	// past --max-conns, Accept waits for a connection to close: a client
	// opening connections by the thousand cannot run kvxd out of file
	// descriptors and memory
	lis = transfer.LimitListener(lis, *maxConns, m)
	if metricsListen != "" {
		ml, err := net.Listen("tcp", metricsListen)
		if err != nil {
			return fail(1, "metrics: %v", err)
		}
		ml = transfer.LimitListener(ml, *maxConns, nil) // its own --max-conns, not in the gauge
		scheme := "http"
		if tc != nil {
			ml, scheme = tls.NewListener(ml, tc), "https"
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		// bounded like the gRPC connections: a client that never finishes
		// its request, never reads the answer or keeps an idle connection
		// holds nothing for good
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: *handshake, ReadTimeout: *handshake,
			WriteTimeout: metricsWriteTimeout, IdleTimeout: *connIdle, MaxHeaderBytes: int(*maxHeader)}
		go hs.Serve(ml) //nolint:errcheck // ends with the process
		fmt.Fprintf(stdout, "kvxd: metrics on %s://%s/metrics\n", scheme, ml.Addr())
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	fmt.Fprintf(stdout, "kvxd: listening on %s (store %s)\n", lis.Addr(), *dir)
	if f, ok := stdout.(*os.File); ok {
		f.Sync() //nolint:errcheck
	}

	select {
	case sig := <-sigs:
		fmt.Fprintf(stderr, "kvxd: %v: draining streams (up to %v)\n", sig, *drain)
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(*drain):
			gs.Stop() // cancels the streams left: each is destroyed, nothing of it published
		}
	case err := <-served:
		srv.Close()
		return fail(1, "serve: %v", err)
	}
	srv.Close()
	if err := st.Flush(); err != nil {
		return fail(1, "flush: %v", err)
	}
	if err := st.Close(); err != nil {
		return fail(1, "close: %v", err)
	}
	fmt.Fprintln(stderr, "kvxd: stopped")
	return 0
}

// metricsWriteTimeout bounds the writing of one /metrics answer.
const metricsWriteTimeout = 30 * time.Second

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return pool, nil
}

// dialOptions: TLS with --ca / --cert (or to a non-loopback address),
// plaintext to loopback or with --insecure.
func dialOptions(to, ca, cert, key string, insecure bool) ([]grpc.DialOption, error) {
	if (cert == "") != (key == "") {
		return nil, errors.New("--cert and --key go together")
	}
	if insecure && (ca != "" || cert != "") {
		return nil, errors.New("--insecure excludes --ca, --cert and --key")
	}
	opts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(transfer.MaxRecvMsgSize))}
	if insecure || (ca == "" && cert == "" && isLoopback(to)) {
		return append(opts, grpc.WithInsecure()), nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pool, err := loadPool(ca)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc))), nil
}

func push(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("push", stderr)
	dir := fs.String("store", "", "")
	to := fs.String("to", "", "")
	format := fs.String("format", "", "")
	ca := fs.String("ca", "", "")
	cert := fs.String("cert", "", "")
	key := fs.String("key", "", "")
	insecure := fs.Bool("insecure", false, "")
	asJSON := fs.Bool("json", false, "")
	timeout := fs.Duration("timeout", 0, "")
	if rc, ok := parse(fs, args, stdout, stderr); !ok {
		return rc
	}
	fail := func(code int, format string, a ...interface{}) int {
		fmt.Fprintf(stderr, "kvxd push: "+format+"\n", a...)
		return code
	}
	if *dir == "" || *to == "" || fs.NArg() == 0 {
		return fail(2, "--store DIR, --to ADDR and at least one TOKEN are required (kvxd --help)")
	}
	if *timeout < 0 {
		return fail(2, "--timeout must be 0 (none) or more, not %v", *timeout)
	}
	var version uint16
	switch *format {
	case "":
	case "v1", "1":
		version = 1
	case "v2", "2":
		version = 2
	case "v3", "3":
		version = 3
	default:
		return fail(2, "--format %q is not v1, v2 or v3", *format)
	}
	tokens := make([]uint32, fs.NArg())
	for i, a := range fs.Args() {
		v, err := strconv.ParseUint(a, 10, 32)
		if err != nil {
			return fail(2, "token %q is not a uint32", a)
		}
		tokens[i] = uint32(v)
	}
	dopts, err := dialOptions(*to, *ca, *cert, *key, *insecure)
	if err != nil {
		return fail(2, "%v", err)
	}
	st, err := kvx.Open(*dir, &kvx.OpenOptions{ReadOnly: true})
	if err != nil {
		return fail(1, "%s: %v", *dir, err)
	}
	defer st.Close()
	ctx := context.Background()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	conn, err := grpc.DialContext(ctx, *to, dopts...)
	if err != nil {
		return fail(1, "%s: %v", *to, err)
	}
	defer conn.Close()
	r, err := transfer.NewClient(conn).Push(ctx, st, tokens, &transfer.PushOptions{Format: version})
	if err != nil {
		if errors.Is(err, transfer.ErrNotAcknowledged) { // answered, but not durable or not what was sent
			return fail(1, "%s: %v", *to, err)
		}
		if s, ok := status.FromError(err); ok {
			return fail(1, "%s: %s: %s", *to, codeName(s.Code().String()), s.Message())
		}
		return fail(1, "%v", err)
	}
	if *asJSON {
		out, _ := json.Marshal(map[string]interface{}{"blocks_sent": r.BlocksSent, "blocks_referenced": r.BlocksReferenced,
			"bytes_sent": r.BytesSent, "tail_tokens": r.TailTokens, "durable": r.Durable})
		fmt.Fprintln(stdout, string(out))
	} else {
		fmt.Fprintf(stdout, "blocks sent %d, referenced %d, bytes sent %d, tail tokens %d, durable %v\n",
			r.BlocksSent, r.BlocksReferenced, r.BytesSent, r.TailTokens, r.Durable)
	}
	return 0
}

// codeName: "DataLoss" -> "DATA_LOSS" (the proto's spelling).
func codeName(s string) string {
	if s == "Canceled" {
		return "CANCELLED"
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}
