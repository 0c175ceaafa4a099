package kvx

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// copyShard copies the store's first shard file to a scratch path. GC
// seals the active shard first (docs/STORE.md "Appends"): until then the
// store's newest blocks are in a file that is no standard KVX file yet.
func copyShard(t *testing.T, s *Store) (string, []byte) {
	t.Helper()
	if err := s.GC(); err != nil {
		t.Fatal(err)
	}
	sh, err := s.Shards()
	if err != nil || len(sh) == 0 {
		t.Fatalf("Shards: %d %v", len(sh), err)
	}
	defer func() {
		for _, x := range sh {
			x.Close()
		}
	}()
	data, err := os.ReadFile(sh[0].Path())
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "copy.kvx")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, data
}

// PROMISE: GO-10
func TestInspectAndVerifyShard(t *testing.T) {
	s, _ := newTestStore(t, 1, 3)
	path, data := copyShard(t, s)
	info, entries, err := Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Geometry != testGeom || info.NumBlocks != 3 || len(entries) != 3 || info.FileSize != uint64(len(data)) ||
		info.Flags&FlagHashes == 0 || info.Flags&FlagLineage == 0 || info.Flags&FlagDigest == 0 || info.FormatVersion != 0x0100 {
		t.Fatalf("info %+v, %d entries", info, len(entries))
	}
	toks := seqTokens(0, 3*16)
	hs := BlockHashes(toks, 16)
	ds := goDigests(toks, 16)
	for i, e := range entries {
		if e.Hash != hs[i] || e.TokenCount != 16 || e.Bytes != 1024 || e.Offset%4096 != 0 ||
			!equalU32(e.Tokens, toks[i*16:(i+1)*16]) || (i > 0 && e.Parent != hs[i-1]) ||
			!bytes.Equal(e.Digest, ds[i][:]) {
			t.Fatalf("entry %d: %+v", i, e)
		}
		if e.CRC32 != CRC32(0, data[e.Offset:e.Offset+uint64(e.Bytes)]) {
			t.Fatalf("entry %d CRC", i)
		}
	}
	if probs, err := VerifyFile(path); err != nil || len(probs) != 0 {
		t.Fatalf("intact shard: %v %v", probs, err)
	}

	sh, err := OpenShard(path, true)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := sh.Find(entries[1].Coordinate)
	if err != nil || idx != 1 {
		t.Fatalf("Find: %d %v", idx, err)
	}
	if _, err := sh.Find(MakeCoord(info.ShardID, 999, 0)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Find miss: %v", err)
	}
	p, err := sh.Page(2, true)
	if err != nil || !bytes.Equal(p, pageOf(testGeom, toks, 2)[:1024]) {
		t.Fatalf("Page: %v", err)
	}
	if _, err := sh.Entry(3); err == nil {
		t.Fatal("Entry out of range")
	}
	sh.Close()
	sh.Close()
	if _, err := sh.Entries(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Entries after Close: %v", err)
	}

	// One flipped byte in page 1: the structure stays valid, the page
	// fails its CRC, and verify names it.
	bad := append([]byte(nil), data...)
	bad[entries[1].Offset+7] ^= 0x40
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	probs, err := VerifyFile(path)
	if !errors.Is(err, ErrPageCRC) || !errors.Is(err, ErrCorrupt) || len(probs) != 1 || probs[0].Entry != 1 ||
		!errors.Is(probs[0].Err, ErrPageCRC) {
		t.Fatalf("damaged page: %v %+v", err, probs)
	}
	if _, err := OpenShard(path, true); !errors.Is(err, ErrPageCRC) {
		t.Fatalf("open with page verify: %v", err)
	}
	sh, err = OpenShard(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := sh.Page(1, true); !errors.Is(err, ErrPageCRC) || len(p) != 1024 {
		t.Fatalf("Page of a damaged page: %d %v", len(p), err)
	}
	sh.Close()

	// A flipped header byte: the meta CRC catches it.
	bad = append([]byte(nil), data...)
	bad[24] ^= 1 // model_signature
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Inspect(path); !errors.Is(err, ErrMetaCRC) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged header: %v", err)
	}
	// Truncated: the structure is intact, so the shard opens; the last
	// page, now past the end of the file, is missing (ErrTruncated), the
	// others are served.
	if err := os.WriteFile(path, data[:len(data)-4096], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, es, err := Inspect(path); err != nil || len(es) != 3 {
		t.Fatalf("truncated shard: %d entries, %v", len(es), err)
	}
	probs, err = VerifyFile(path)
	if !errors.Is(err, ErrTruncated) || len(probs) != 1 || probs[0].Entry != 2 || !errors.Is(probs[0].Err, ErrTruncated) {
		t.Fatalf("truncated shard verify: %v %+v", err, probs)
	}
	sh, err = OpenShard(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sh.Page(2, true); !errors.Is(err, ErrTruncated) {
		t.Fatalf("Page past the end: %v", err)
	}
	if p, err := sh.Page(1, true); err != nil || !bytes.Equal(p, pageOf(testGeom, toks, 1)[:1024]) {
		t.Fatalf("Page before the end: %v", err)
	}
	sh.Close()
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// PROMISE: GO-1
func TestAttackShardAfterClose(t *testing.T) {
	s, _ := newTestStore(t, 1, 2)
	sh, err := s.Shards()
	if err != nil || len(sh) == 0 {
		t.Fatal(err)
	}
	p, err := sh[0].Page(0, true)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), p...)
	s.Close()
	if q, err := sh[0].Page(0, true); err != nil || !bytes.Equal(q, want) {
		t.Fatalf("shard page after Store.Close: %v", err)
	}
	if _, err := sh[0].Page(1<<30, false); err == nil {
		t.Fatal("Page out of range")
	}
	if _, err := sh[0].Entry(1 << 30); err == nil {
		t.Fatal("Entry out of range")
	}
	for _, x := range sh {
		x.Close()
		x.Close()
	}
	if _, err := sh[0].Page(0, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("Page after Close: %v", err)
	}
	if sh[0].Path() != "" || sh[0].Info().NumBlocks != 0 {
		t.Fatal("a closed shard answers")
	}
}
