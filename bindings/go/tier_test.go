package kvx

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestTierOptionsDown: the shared tier's options pass through (DIR/TIER
// written with the tenant and TTL), and a tier nobody answers fails
// nothing: put, flush, prefix and close work, Stat says it is down.
// PROMISE: TIER-7, TIER-23
func TestTierOptionsDown(t *testing.T) {
	dir := t.TempDir() + "/a"
	s, err := Create(dir, StoreOptions{Geometry: testGeom, NoSync: true, TierURL: "redis://127.0.0.1:1",
		TierTenant: "go", TierTTL: time.Hour})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	toks := seqTokens(1, 4*16)
	if _, err := s.Put(toks, pagesFor(testGeom, toks), nil); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	v, err := s.Prefix(append(toks, seqTokens(2, 32)...))
	if err != nil || v.Len() != 4 {
		t.Fatalf("Prefix: %v", err)
	}
	v.Release()
	st, err := s.Stat()
	if err != nil || st.TierUp || st.TierMisses == 0 {
		t.Fatalf("Stat: %+v %v", st, err)
	}
	s.Close()
	tier, err := os.ReadFile(dir + "/TIER")
	if err != nil || !strings.Contains(string(tier), "tenant go\n") || !strings.Contains(string(tier), "ttl_ms 3600000\n") {
		t.Fatalf("TIER: %q %v", tier, err)
	}
	s, err = Open(dir, &OpenOptions{ReadOnly: true, TierURL: "off"})
	if err != nil {
		t.Fatalf("Open off: %v", err)
	}
	s.Close()
}

// TestTierCrossStore: with a redis-server (skipped without), a block put
// in one store is served in another whose directory is empty.
// PROMISE: TIER-23
func TestTierCrossStore(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", t.TempDir())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	url := fmt.Sprintf("redis://127.0.0.1:%d", port)
	a, err := Create(t.TempDir()+"/a", StoreOptions{Geometry: testGeom, NoSync: true, TierURL: url})
	if err != nil {
		t.Fatal(err)
	}
	toks := seqTokens(7, 6*16)
	if _, err := a.Put(toks, pagesFor(testGeom, toks), nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	a.Close()
	bdir := t.TempDir() + "/b"
	b, err := Create(bdir, StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	b, err = Open(bdir, &OpenOptions{ReadOnly: true, TierURL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	v, err := b.Prefix(toks)
	if err != nil || v.Len() != 6 {
		t.Fatalf("Prefix from the tier: %v", err)
	}
	for i := 0; i < v.Len(); i++ {
		if string(v.At(i).Page()) != string(pageOf(testGeom, toks, i)[:testGeom.PageBytes(16)]) {
			t.Fatalf("block %d differs", i)
		}
	}
	v.Release()
	st, _ := b.Stat()
	if st.TierHits != 6 || !st.TierUp {
		t.Fatalf("Stat: %+v", st)
	}
}
