// kvxd_options_test.go - kvxd's option values are checked when parsed,
// against the range of the type they are sent or stored in, and both of
// its listeners (gRPC and metrics) follow one loopback / TLS / --insecure
// rule.
package transfer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvx.dev/transfer/tlkvpb"
)

// Before: --lease-ttl 1200h was answered as 25,032,704 ms (the uint32 of
// 4,320,000,000 wrapped), 4294967296ms and 500us as 0 ("already expired"),
// while the lease lasted what was configured.
// PROMISE: XFER-29
func TestKvxdOptionRanges(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--lease-ttl", "1200h"}, "--lease-ttl must be 1ms .. 4294967295ms"},
		{[]string{"--lease-ttl", "4294967296ms"}, "--lease-ttl must be 1ms .. 4294967295ms"},
		{[]string{"--lease-ttl", "500us"}, "--lease-ttl must be 1ms .. 4294967295ms"},
		{[]string{"--lease-ttl", "0s"}, "--lease-ttl must be 1ms .. 4294967295ms"},
		{[]string{"--lease-ttl", "1500us"}, "--lease-ttl must be a whole number of milliseconds"},
		{[]string{"--max-streams", "2000000"}, "--max-streams must be 1 .. 1048576"},
		{[]string{"--max-streams", "-1"}, "--max-streams must be 1 .. 1048576"},
		{[]string{"--max-has-blocks", "4294967296"}, "--max-has-blocks must be 1 .. 1048576"},
		{[]string{"--max-leases", "0"}, "--max-leases must be at least 1"},
		{[]string{"--max-header-list-bytes", "100"}, "--max-header-list-bytes must be 1024 .. 16777216"},
		{[]string{"--max-conn-streams", "1048577"}, "--max-conn-streams must be 0 .. 1048576"},
		{[]string{"--max-conns", "0"}, "--max-conns must be 1 .. 1048576"},
		{[]string{"--stream-idle", "-1s"}, "--stream-idle must be at least 1ms"},
		{[]string{"--conn-idle", "0s"}, "--conn-idle must be at least 1ms"},
		{[]string{"--handshake-timeout", "0s"}, "--handshake-timeout must be at least 1ms"},
		{[]string{"--drain", "-1s"}, "--drain must be at least 0ms"},
	} {
		_, errOut, code := runKvxd(t, append([]string{"serve", "--store", dir}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, "kvxd serve: "+tc.want) {
			t.Errorf("%v: exit %d, %q; want exit 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	if _, errOut, code := runKvxd(t, "push", "--store", dir, "--to", "127.0.0.1:1", "--timeout", "-1s", "1"); code != 2 ||
		!strings.Contains(errOut, "--timeout must be 0 (none) or more") {
		t.Errorf("push --timeout -1s: exit %d, %q", code, errOut)
	}

	// The edges are taken, and HasBlocks answers what the lease lasts.
	bs, bdir := createStore(t, testGeom, 0)
	bs.Close() // kvxd takes the writer lock
	p := startKvxd(t, bdir, "--lease-ttl", "4294967295ms")
	resp, err := tlkvpb.NewKvTransferClient(dial(t, p.addr)).HasBlocks(context.Background(),
		&tlkvpb.HasBlocksRequest{BlockHashes: nil, Tokens: nil})
	if err != nil || resp.LeaseTtlMs != math.MaxUint32 {
		t.Fatalf("--lease-ttl 4294967295ms: HasBlocks answered %v %v", resp, err)
	}
}

// A library user's ServerOptions.LeaseTTL outside what HasBlocks can say
// is clamped, so the lease lasts exactly the TTL it answers.
// PROMISE: XFER-29
func TestServerLeaseTTLClamped(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want uint32
	}{
		{1200 * time.Hour, math.MaxUint32},
		{500 * time.Microsecond, 1},
		{1500 * time.Microsecond, 1},
		{0, 30000},
		{2 * time.Second, 2000},
	} {
		s, _ := createStore(t, testGeom, 0)
		ts := startServer(t, s, ServerOptions{LeaseTTL: tc.ttl})
		resp, err := tlkvpb.NewKvTransferClient(dial(t, ts.addr)).HasBlocks(context.Background(), &tlkvpb.HasBlocksRequest{})
		if err != nil || resp.LeaseTtlMs != tc.want {
			t.Errorf("LeaseTTL %v: answered %v (%v), want %d", tc.ttl, resp.GetLeaseTtlMs(), err, tc.want)
		}
		if ts.opts.LeaseTTL != time.Duration(tc.want)*time.Millisecond {
			t.Errorf("LeaseTTL %v: the lease lasts %v, not the %d ms answered", tc.ttl, ts.opts.LeaseTTL, tc.want)
		}
	}
}

// --metrics on a non-loopback address was plain HTTP on every interface
// with no flag; now it needs TLS (served as https with the gRPC listener's
// certificate and client CA) or --insecure, as --listen does.
// PROMISE: XFER-28
func TestKvxdMetricsListenerPolicy(t *testing.T) {
	dir := t.TempDir()
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", "192.0.2.1:9100"} {
		_, errOut, code := runKvxd(t, "serve", "--store", dir, "--metrics", addr)
		if code != 2 || !strings.Contains(errOut, "--metrics "+addr+" is not a loopback address: give --tls-cert") {
			t.Errorf("--metrics %s without TLS or --insecure: exit %d, %q", addr, code, errOut)
		}
	}

	// --insecure: plain HTTP, on purpose
	bs, bdir := createStore(t, testGeom, 0)
	bs.Close() // kvxd takes the writer lock
	p := startKvxd(t, bdir, "--metrics", "0.0.0.0:0", "--insecure")
	port := p.metrics[strings.LastIndex(p.metrics, ":")+1:]
	resp, err := http.Get("http://127.0.0.1:" + port + "/metrics")
	if err != nil {
		t.Fatalf("--insecure metrics: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("--insecure metrics: %s", resp.Status)
	}

	// TLS: https with the same certificate and client CA
	cd := t.TempDir()
	certs(t, cd)
	f := func(n string) string { return filepath.Join(cd, n) }
	cs, cdir := createStore(t, testGeom, 0)
	cs.Close()
	p = startKvxd(t, cdir, "--metrics", "0.0.0.0:0", "--tls-cert", f("server.pem"), "--tls-key", f("server.key"),
		"--client-ca", f("ca.pem"))
	out := p.out.String()
	i := strings.Index(out, "kvxd: metrics on https://")
	if i < 0 {
		t.Fatalf("no https metrics line: %s", out)
	}
	hostport := strings.TrimSuffix(strings.Fields(out[i+len("kvxd: metrics on https://"):])[0], "/metrics")
	url := "https://127.0.0.1:" + hostport[strings.LastIndex(hostport, ":")+1:] + "/metrics"
	if r, err := http.Get(strings.Replace(url, "https://", "http://", 1)); err == nil {
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if strings.Contains(string(body), "kvx_transfer") {
			t.Fatal("the TLS kvxd served its metrics over plain HTTP")
		}
	}
	pem, err := os.ReadFile(f("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	get := func(certFile, keyFile string) (int, error) {
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if certFile != "" {
			pair, err := tls.LoadX509KeyPair(f(certFile), f(keyFile))
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
		r, err := c.Get(url)
		if err != nil {
			return 0, err
		}
		defer r.Body.Close()
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), "kvx_transfer") {
			t.Errorf("https metrics lack kvx_transfer: %.200s", body)
		}
		return r.StatusCode, nil
	}
	if _, err := get("", ""); err == nil {
		t.Fatal("metrics answered a client without a certificate (--client-ca asks for one)")
	}
	if code, err := get("client.pem", "client.key"); err != nil || code != 200 {
		t.Fatalf("mTLS metrics: %d %v", code, err)
	}
}
