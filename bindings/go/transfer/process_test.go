// process_test.go - real processes on loopback: kvxd serve and kvxd push,
// a sender process killed mid-stream, kvxd killed -9 mid-stream and
// restarted, TLS and mTLS, metrics, SIGTERM (also during a flood), kvxd's
// idle-stream limit, and the generated code.
package transfer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

// helperMain is the test binary run as a sender process
// (KVX_XFER_HELPER=sender): it sends the first KVX_XFER_N chunks of
// prompt KVX_XFER_SEQ from the store KVX_XFER_STORE to KVX_XFER_ADDR,
// prints "sent", and waits to be killed.
func helperMain() int {
	seq, _ := strconv.Atoi(os.Getenv("KVX_XFER_SEQ"))
	n, _ := strconv.Atoi(os.Getenv("KVX_XFER_N"))
	s, err := kvx.Open(os.Getenv("KVX_XFER_STORE"), &kvx.OpenOptions{ReadOnly: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	conn, err := grpc.Dial(os.Getenv("KVX_XFER_ADDR"), grpc.WithInsecure())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st, err := tlkvpb.NewKvTransferClient(conn).PushKv(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tokens := tokensOf(seq, 8*B)
	h := kvx.BlockHashes(tokens, B)
	for i := 0; i < n; i++ {
		v, err := s.GetBlock(tokens[:(i+1)*B])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		env, err := s.Export(v, 1)
		v.Release()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := st.Send(&tlkvpb.KvChunk{KvFormat: 1, BlockHash: h[i], Payload: env, Crc32C: CRC32C(env),
			Tokens: tokens[i*B : (i+1)*B]}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Println("sent")
	select {}
}

// A sender process killed -9 after 3 of 8 chunks: the receiver's stream
// fails, nothing is published, and the receiver serves the next push.
// PROMISE: XFER-16
func TestSenderKilledMidStream(t *testing.T) {
	a, adir := createStore(t, testGeom, 0)
	b, _ := createStore(t, testGeom, 0)
	tokens := tokensOf(9, 8*B)
	putPrompt(t, a, tokens)
	rec := &recorder{seen: make(chan struct{}, 16)}
	ts := startServer(t, b, ServerOptions{Sink: rec})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVX_XFER_HELPER=sender", "KVX_XFER_STORE="+adir, "KVX_XFER_ADDR="+ts.addr,
		"KVX_XFER_SEQ=9", "KVX_XFER_N=3")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill() //nolint:errcheck
			cmd.Wait()         //nolint:errcheck
		}
	})
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "sent\n" {
		t.Fatalf("helper: %q", line)
	}
	for i := 0; i < 3; i++ {
		select {
		case <-rec.seen:
		case <-time.After(10 * time.Second):
			t.Fatal("the receiver did not see 3 blocks")
		}
	}
	cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck
	cmd.Wait()                          //nolint:errcheck
	exited = true
	waitDone(t, rec, 1)
	if _, done := rec.snapshot(); done[0] == nil {
		t.Fatal("the killed sender's stream ended well")
	}
	if served(t, b, tokens) != 0 || blocksIn(t, b) != 0 {
		t.Fatal("the killed sender's blocks were published")
	}
	r, err := NewClient(dial(t, ts.addr)).Push(context.Background(), a, tokens, nil)
	if err != nil || r.Response.BlocksStored != 8 || served(t, b, tokens) != 8 {
		t.Fatalf("push after: %v %+v", err, r)
	}
}

// kvxd push against kvxd serve, two stores, real processes: dedup counts in
// --json, the text line, readers beside the serving writer, metrics,
// SIGTERM exits 0 with the store released.
// PROMISE: XFER-2, XFER-26, XFER-27
func TestKvxdServeAndPush(t *testing.T) {
	a, adir := createStore(t, testGeom, 0)
	b, bdir := createStore(t, testGeom, 0)
	const nb = 5
	tokens := tokensOf(10, nb*B+2)
	putPrompt(t, a, tokens)
	a.Close()
	b.Close()
	p := startKvxd(t, bdir, "--metrics", "127.0.0.1:0")
	if p.metrics == "" {
		t.Fatalf("no metrics line: %s", p.out.String())
	}
	env := envSize(1)
	push := func(args ...string) map[string]interface{} {
		t.Helper()
		out, errOut, code := runKvxd(t, append([]string{"push", "--store", adir, "--to", p.addr, "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("kvxd push: %d %s", code, errOut)
		}
		var m map[string]interface{}
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("--json: %q: %v", out, err)
		}
		return m
	}
	// the first 3 blocks, then the whole prompt: only the 2 missing move
	m := push(tokenArgs(tokens[:3*B])...)
	if m["blocks_sent"] != 3.0 || m["blocks_referenced"] != 0.0 || m["bytes_sent"] != float64(3*env) || m["durable"] != true {
		t.Fatalf("first push: %v", m)
	}
	m = push(tokenArgs(tokens)...)
	want := map[string]interface{}{"blocks_sent": 2.0, "blocks_referenced": 3.0, "bytes_sent": float64(2 * env),
		"tail_tokens": 0.0, "durable": true}
	for k, v := range want {
		if m[k] != v {
			t.Fatalf("second push: %s = %v, want %v (%v)", k, m[k], v, m)
		}
	}
	out, errOut, code := runKvxd(t, "push", "--store", adir, "--to", p.addr, "--format", "v1", strings.Join(tokenArgs(tokens), " "))
	if code != 2 {
		t.Fatalf("a token list in one word: exit %d (%s%s)", code, out, errOut)
	}
	out, errOut, code = runKvxd(t, append([]string{"push", "--store", adir, "--to", p.addr, "--format", "v1"}, tokenArgs(tokens)...)...)
	if code != 0 || out != "blocks sent 0, referenced 5, bytes sent 0, tail tokens 0, durable true\n" {
		t.Fatalf("text output: %d %q %s", code, out, errOut)
	}
	// a reader beside the serving writer
	r, err := kvx.Open(bdir, &kvx.OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := served(t, r, tokens); n != nb {
		t.Fatalf("a reader beside kvxd serves %d blocks, want %d", n, nb)
	}
	r.Close()
	if _, err := kvx.Open(bdir, &kvx.OpenOptions{NoWait: true}); err == nil {
		t.Fatal("a second writer opened the store kvxd serves")
	}
	if cli := kvxCLI(); cli != "" {
		for _, args := range [][]string{{"store", "stat", bdir}, {"store", "verify", bdir},
			append([]string{"store", "prefix", bdir}, tokenArgs(tokens)...)} {
			out, err := exec.Command(cli, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("kvx %v beside kvxd: %v %s", args, err, out)
			}
			if args[1] == "prefix" && !strings.HasPrefix(string(out), fmt.Sprint(nb)) {
				t.Fatalf("kvx store prefix beside kvxd: %q", out)
			}
		}
	}
	// metrics
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		"kvx_transfer_pushes_total 3",
		"kvx_transfer_blocks_stored_total 5",
		"kvx_transfer_blocks_referenced_total 8",
		fmt.Sprintf("kvx_transfer_bytes_received_total %d", 5*env),
		`kvx_transfer_calls_total{code="OK",rpc="PushKv"} 3`,
		`kvx_transfer_calls_total{code="OK",rpc="HasBlocks"} 3`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Fatalf("metrics lack %q:\n%s", line, body)
		}
	}
	// SIGTERM: exit 0, the writer lock released
	p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
	if code := p.wait(t); code != 0 {
		t.Fatalf("kvxd exited %d after SIGTERM: %s", code, p.out.String())
	}
	w, err := kvx.Open(bdir, &kvx.OpenOptions{NoWait: true})
	if err != nil {
		t.Fatalf("the store after kvxd stopped: %v", err)
	}
	defer w.Close()
	if n := served(t, w, tokens); n != nb {
		t.Fatalf("served %d after the restart, want %d", n, nb)
	}
}

// Usage errors and --help.
// PROMISE: XFER-24, XFER-26
func TestKvxdUsage(t *testing.T) {
	out, _, code := runKvxd(t, "--help")
	if code != 0 || !strings.Contains(out, "push --store DIR --to ADDR") || !strings.Contains(out, "--max-stream-bytes") {
		t.Fatalf("--help: %d %q", code, out)
	}
	_, errOut, code := runKvxd(t, "serve", "--store", t.TempDir(), "--listen", "0.0.0.0:0")
	if code != 2 || !strings.Contains(errOut, "not a loopback address") {
		t.Fatalf("a non-loopback listen without TLS: %d %q", code, errOut)
	}
	if _, _, code := runKvxd(t, "push", "--store", t.TempDir(), "--to", "127.0.0.1:1", "--format", "v9", "1"); code != 2 {
		t.Fatalf("--format v9: exit %d", code)
	}
	if _, _, code := runKvxd(t, "frob"); code != 2 {
		t.Fatalf("an unknown command: exit %d", code)
	}
}

// kvxd killed -9 while a stream is in flight (5 of 8 chunks received), then
// restarted on the same store: the acknowledged prompt is intact, nothing
// of the cut stream is there (no block, no torn shard: verify is clean),
// and the prompt can be pushed again.
// The receiver's shards are small (8 KiB, a few blocks each), so the 5
// chunks of the cut stream seal shards before kvxd dies: those files wait
// in staging/ until the stream's finish, and recovery removes them, so
// nothing of the cut stream is adopted or served after the restart.
// PROMISE: XFER-4, XFER-17
func TestKvxdKilledMidStreamAndRestarted(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	bdir := filepath.Join(t.TempDir(), "store")
	b, err := kvx.Create(bdir, kvx.StoreOptions{Geometry: testGeom, ShardBytes: 8 << 10})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	acked, cut := tokensOf(11, 8*B), tokensOf(12, 8*B)
	putPrompt(t, a, acked)
	putPrompt(t, a, cut)
	b.Close()
	p := startKvxd(t, bdir)
	conn := dial(t, p.addr)
	if r, err := NewClient(conn).Push(context.Background(), a, acked, nil); err != nil || !r.Durable {
		t.Fatalf("acknowledged push: %v %+v", err, r)
	}
	st, err := tlkvpb.NewKvTransferClient(conn).PushKv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := st.Send(chunkOf(t, a, cut, i, false)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // let kvxd take them into its batch
	if ents, err := os.ReadDir(filepath.Join(bdir, "staging")); err != nil || len(ents) < 2 {
		out, _ := exec.Command("find", bdir).CombinedOutput()
		t.Logf("%s\n%s", out, p.out.String())
		t.Fatalf("before the kill: staging/ should hold the stream's sealed shards and its open writer: %v, %d files",
			err, len(ents))
	}
	p.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck
	p.wait(t)
	if _, err := st.CloseAndRecv(); err == nil {
		t.Fatal("the cut stream was acknowledged")
	}
	// restarted: recovery runs in kvxd's writer open
	p2 := startKvxd(t, bdir)
	r, err := kvx.Open(bdir, &kvx.OpenOptions{ReadOnly: true, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := served(t, r, acked); n != 8 {
		t.Fatalf("the acknowledged prompt: %d of 8 blocks after kill -9 and restart", n)
	}
	if n := served(t, r, cut); n != 0 {
		t.Fatalf("the cut stream left %d blocks", n)
	}
	if st, err := r.Stat(); err != nil || st.Blocks != 8 {
		t.Fatalf("after kill -9 and restart: %v, %d blocks in the store, want the 8 acknowledged", err, st.Blocks)
	}
	probs, err := r.Verify()
	if err != nil || len(probs) != 0 {
		t.Fatalf("verify after kill -9: %v %+v", err, probs)
	}
	r.Close()
	res, err := NewClient(dial(t, p2.addr)).Push(context.Background(), a, cut, nil)
	if err != nil || res.Response.BlocksStored != 8 {
		t.Fatalf("the cut prompt pushed again: %v %+v", err, res)
	}
}

// certs writes a CA, a server certificate for 127.0.0.1 and a client
// certificate (both signed by the CA), and a second CA's client
// certificate, as PEM files in dir.
func certs(t *testing.T, dir string) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	serial := int64(1)
	mk := func(tmpl *x509.Certificate, parent *x509.Certificate, pub *ecdsa.PrivateKey, signer *ecdsa.PrivateKey) (*x509.Certificate, []byte) {
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore = time.Now().Add(-time.Hour)
		tmpl.NotAfter = time.Now().Add(time.Hour)
		if parent == nil {
			parent = tmpl
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &pub.PublicKey, signer)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c, der
	}
	leaf := func(name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage, server bool) {
		k := key()
		tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		if server {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
		_, der := mk(tmpl, ca, k, caKey)
		write(name+".pem", "CERTIFICATE", der)
		kd, _ := x509.MarshalECPrivateKey(k)
		write(name+".key", "EC PRIVATE KEY", kd)
	}
	for _, ca := range []string{"ca", "otherca"} {
		caKey := key()
		caCert, der := mk(&x509.Certificate{Subject: pkix.Name{CommonName: "kvx test " + ca}, IsCA: true,
			BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil, caKey, caKey)
		write(ca+".pem", "CERTIFICATE", der)
		if ca == "ca" {
			leaf("server", caCert, caKey, x509.ExtKeyUsageServerAuth, true)
			leaf("client", caCert, caKey, x509.ExtKeyUsageClientAuth, false)
		} else {
			leaf("stranger", caCert, caKey, x509.ExtKeyUsageClientAuth, false)
		}
	}
}

// TLS: kvxd push with --ca reaches a TLS kvxd; plaintext does not. mTLS
// (--client-ca): a client certificate signed by that CA is required; a
// client without one, or with another CA's, is refused and publishes
// nothing. A non-loopback listener is allowed with TLS.
// PROMISE: XFER-25
func TestKvxdTLSAndMTLS(t *testing.T) {
	cd := t.TempDir()
	certs(t, cd)
	f := func(n string) string { return filepath.Join(cd, n) }
	a, adir := createStore(t, testGeom, 0)
	tokens := tokensOf(13, 3*B)
	putPrompt(t, a, tokens)
	a.Close()
	push := func(addr string, args ...string) (string, int) {
		out, errOut, code := runKvxd(t, append(append([]string{"push", "--store", adir, "--to", addr, "--json"}, args...),
			tokenArgs(tokens)...)...)
		return out + errOut, code
	}

	t.Run("TLS", func(t *testing.T) {
		bs, bdir := createStore(t, testGeom, 0)
		bs.Close() // kvxd takes the writer lock
		p := startKvxd(t, bdir, "--listen", "0.0.0.0:0", "--tls-cert", f("server.pem"), "--tls-key", f("server.key"))
		addr := "127.0.0.1:" + p.addr[strings.LastIndex(p.addr, ":")+1:]
		if out, code := push(addr, "--insecure", "--timeout", "5s"); code == 0 {
			t.Fatalf("plaintext to a TLS kvxd: %s", out)
		}
		if out, code := push(addr, "--ca", f("otherca.pem"), "--timeout", "5s"); code == 0 {
			t.Fatalf("a server certificate of an untrusted CA was accepted: %s", out)
		}
		if out, code := push(addr, "--ca", f("ca.pem")); code != 0 || !strings.Contains(out, `"blocks_sent":3`) {
			t.Fatalf("TLS push: %d %s", code, out)
		}
	})
	t.Run("mTLS", func(t *testing.T) {
		bs, bdir := createStore(t, testGeom, 0)
		bs.Close() // kvxd takes the writer lock
		p := startKvxd(t, bdir, "--tls-cert", f("server.pem"), "--tls-key", f("server.key"), "--client-ca", f("ca.pem"))
		if out, code := push(p.addr, "--ca", f("ca.pem"), "--timeout", "5s"); code == 0 {
			t.Fatalf("a client without a certificate was accepted: %s", out)
		}
		if out, code := push(p.addr, "--ca", f("ca.pem"), "--cert", f("stranger.pem"), "--key", f("stranger.key"), "--timeout", "5s"); code == 0 {
			t.Fatalf("a client certificate of another CA was accepted: %s", out)
		}
		r, err := kvx.Open(bdir, &kvx.OpenOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if n := served(t, r, tokens); n != 0 {
			t.Fatalf("refused clients published %d blocks", n)
		}
		r.Close()
		if out, code := push(p.addr, "--ca", f("ca.pem"), "--cert", f("client.pem"), "--key", f("client.key")); code != 0 ||
			!strings.Contains(out, `"blocks_sent":3`) {
			t.Fatalf("mTLS push: %d %s", code, out)
		}
	})
}

// The checked-in kv.pb.go and kv_grpc.pb.go are what protoc makes of
// proto/tl/kv/v1/kv.proto now (scripts/gen-proto.sh).
// PROMISE: XFER-1
func TestGeneratedCodeFresh(t *testing.T) {
	for _, tool := range []string{"protoc", "protoc-gen-go", "protoc-gen-go-grpc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (scripts/install-deps.sh)", tool)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("bash", "../../../scripts/gen-proto.sh", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen-proto.sh: %v %s", err, b)
	}
	for _, f := range []string{"kv.pb.go", "kv_grpc.pb.go"} {
		got, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		have, err := os.ReadFile(filepath.Join("tlkvpb", f))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(have) {
			t.Fatalf("tlkvpb/%s is stale: run scripts/gen-proto.sh", f)
		}
	}
}

// SIGTERM while a stream is in flight and its sender stalls: kvxd waits
// --drain, aborts the stream (nothing of it published), flushes and exits
// 0; a push acknowledged before is intact.
// PROMISE: XFER-16, XFER-26
func TestKvxdSigtermAbortsStalledStream(t *testing.T) {
	a, _ := createStore(t, testGeom, 0)
	b, bdir := createStore(t, testGeom, 0)
	acked, stalled := tokensOf(14, 4*B), tokensOf(15, 4*B)
	putPrompt(t, a, acked)
	putPrompt(t, a, stalled)
	b.Close()
	p := startKvxd(t, bdir, "--drain", "300ms")
	conn := dial(t, p.addr)
	if _, err := NewClient(conn).Push(context.Background(), a, acked, nil); err != nil {
		t.Fatal(err)
	}
	st, err := tlkvpb.NewKvTransferClient(conn).PushKv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := st.Send(chunkOf(t, a, stalled, i, false)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
	if code := p.wait(t); code != 0 {
		t.Fatalf("kvxd exited %d after SIGTERM: %s", code, p.out.String())
	}
	if _, err := st.CloseAndRecv(); err == nil {
		t.Fatal("the stalled stream was acknowledged")
	}
	r, err := kvx.Open(bdir, &kvx.OpenOptions{NoWait: true})
	if err != nil {
		t.Fatalf("the store after SIGTERM: %v", err)
	}
	defer r.Close()
	if served(t, r, acked) != 4 || served(t, r, stalled) != 0 {
		t.Fatal("after SIGTERM: the acknowledged prompt lost, or the aborted one published")
	}
}

// kvxd cuts an idle stream too (--stream-idle), so one silent client on
// --max-streams 1 holds it only that long; a non-positive --stream-idle or
// --max-leases is a usage error.
// PROMISE: XFER-15, XFER-29
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

// SIGTERM while 6 pushers, a HasBlocks flooder, two idle streams and a
// metrics scraper hammer a kvxd process: it exits 0 within its drain, the
// metrics endpoint answered throughout, every acknowledged push is served
// whole with its own bytes after a reopen, and no other push is served in
// part.
// PROMISE: XFER-26
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
