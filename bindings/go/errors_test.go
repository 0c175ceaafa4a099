package kvx

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// PROMISE: GO-7
func TestErrorClasses(t *testing.T) {
	cases := []struct {
		code int
		is   []error
		not  []error
		name string
	}{
		{CodePageCRC, []error{ErrPageCRC, ErrCorrupt}, []error{ErrFormat, ErrMetaCRC, ErrNotFound}, "KVX_EPAGECRC"},
		{CodeMetaCRC, []error{ErrMetaCRC, ErrCorrupt}, []error{ErrPageCRC, ErrFormat}, "KVX_EMETACRC"},
		{CodeAlign, []error{ErrAlign, ErrFormat}, []error{ErrCorrupt}, "KVX_EALIGN"},
		{CodeTrunc, []error{ErrTruncated, ErrFormat, ErrCorrupt}, []error{ErrShape}, "KVX_ETRUNC"},
		{CodeModel, []error{ErrModel, ErrShape}, []error{ErrFormat}, "KVX_EMODEL"},
		{CodeFull, []error{ErrFull, ErrCapacity}, []error{ErrBusy}, "KVX_EFULL"},
		{CodeNoCUDA, []error{ErrNoCUDA, ErrNoGPU}, []error{ErrInvalid}, "KVX_ENOCUDA"},
		{CodeNotFound, []error{ErrNotFound}, []error{ErrCorrupt, ErrInvalid, ErrAmbiguous, ErrUnverified}, "KVX_ENOTFOUND"},
		{CodeAmbiguous, []error{ErrAmbiguous, ErrNotFound}, []error{ErrUnverified, ErrCorrupt, ErrInvalid}, "KVX_EAMBIGUOUS"},
		{CodeUnverified, []error{ErrUnverified, ErrNotFound}, []error{ErrAmbiguous, ErrCorrupt, ErrInvalid}, "KVX_EUNVERIFIED"},
		{CodeDropped, []error{ErrDropped}, []error{ErrNotFound, ErrCorrupt, ErrLossy}, "KVX_EDROPPED"},
		{CodeNotHeld, []error{ErrNotHeld}, []error{ErrNotFound, ErrDropped}, "KVX_ENOTHELD"},
		{CodeUnavailable, []error{ErrUnavailable}, []error{ErrNotFound, ErrNotHeld}, "KVX_EUNAVAILABLE"},
		{-int(syscall.ENOSPC), []error{syscall.ENOSPC}, []error{ErrCapacity, ErrNotFound}, "ENOSPC"},
		{-int(syscall.ENOENT), []error{fs.ErrNotExist}, []error{ErrNotFound}, "ENOENT"},
	}
	for _, c := range cases {
		e := newError(c.code, "")
		if e.Name != c.name {
			t.Errorf("code %d: name %q, want %q", c.code, e.Name, c.name)
		}
		if e.Message == "" || !strings.Contains(e.Error(), c.name) {
			t.Errorf("code %d: Error() %q lacks a message or the name", c.code, e.Error())
		}
		for _, s := range c.is {
			if !errors.Is(e, s) {
				t.Errorf("%s should match %v", c.name, s)
			}
		}
		for _, s := range c.not {
			if errors.Is(e, s) {
				t.Errorf("%s should not match %v", c.name, s)
			}
		}
	}
	if !errors.Is(ErrClosed, ErrInvalid) || errors.Is(newError(CodeInvalid, "x"), ErrClosed) {
		t.Error("ErrClosed must be ErrInvalid, and a plain EINVALID must not be ErrClosed")
	}
	c := canceled(context.Canceled, "Fetch")
	if !errors.Is(c, ErrCanceled) || !errors.Is(c, context.Canceled) {
		t.Errorf("cancel error %v must match ErrCanceled and context.Canceled", c)
	}
}

// PROMISE: GO-7
func TestErrorsFromCalls(t *testing.T) {
	dir := t.TempDir()
	// Geometry without block_tokens: the store names blocks by hash.
	_, err := Create(filepath.Join(dir, "a"), StoreOptions{Geometry: Geometry{Layers: 1, KVHeads: 1, HeadDim: 8}})
	var ke *Error
	if !errors.As(err, &ke) || !errors.Is(err, ErrInvalid) || !strings.Contains(ke.Message, "block_tokens") {
		t.Fatalf("Create without block_tokens: %v", err)
	}
	// Not a store.
	if _, err := Open(filepath.Join(dir, "missing"), nil); err == nil || !errors.As(err, &ke) {
		t.Fatalf("Open missing dir: %v", err)
	}
	// Not a shard.
	junk := filepath.Join(dir, "junk.kvx")
	if err := os.WriteFile(junk, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenShard(junk, false); !errors.Is(err, ErrMagic) || !errors.Is(err, ErrFormat) {
		t.Fatalf("OpenShard of zeros: %v, want ErrMagic", err)
	}
	if _, err := OpenShard(filepath.Join(dir, "nope.kvx"), false); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("OpenShard of a missing file: %v, want fs.ErrNotExist", err)
	}
}

// PROMISE: FORMAT-1
func TestHashGolden(t *testing.T) {
	// spec/kv-block-hash-and-envelope.txt, worked example (B = 2).
	if h := FNV1a64([]byte("a")); h != 0xAF63DC4C8601EC8C {
		t.Fatalf("fnv1a64(a) = %#x", h)
	}
	hs := BlockHashes([]uint32{1, 2, 3, 4, 5}, 2)
	if len(hs) != 2 || hs[0] != 0xA91AB0C1027B9366 || hs[1] != 0x03DF829571605C60 {
		t.Fatalf("block hashes %#x", hs)
	}
	if BlockHash(0xA91AB0C1027B9366, []uint32{3, 4}) != 0x03DF829571605C60 {
		t.Fatal("BlockHash chain")
	}
	// CRC-32C("123456789") = 0xE3069283, CRC-32 = 0xCBF43926 (check values).
	if c := CRC32C(0, []byte("123456789")); c != 0xE3069283 {
		t.Fatalf("crc32c %#x", c)
	}
	if c := CRC32(0, []byte("123456789")); c != 0xCBF43926 {
		t.Fatalf("crc32 %#x", c)
	}
	if MakeCoord(1, 10, 26) != 0x01000A1A || Coord(0x01000A1A).Block() != 10 || Coord(0x01000A1A).Spectral() != 26 {
		t.Fatal("coordinate fields")
	}
}
