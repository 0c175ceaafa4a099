// digest_test.go - the prefix digest and what it decides (DESIGN.md trust
// rule 1): only verified blocks are served, a get by hash alone answers
// only when one verified block holds the hash, tokens pick a block by
// digest, exports re-check every page, and damage that ends a prefix is
// reported beside the good blocks served.
package kvx

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"sync"
	"testing"
)

// goDigests is the SHA-256 chain computed in Go, independently of the
// library: d0 = sha256(le tokens of block 0), di = sha256(d(i-1) || le
// tokens of block i).
func goDigests(tokens []uint32, b int) [][32]byte {
	var out [][32]byte
	for i := 0; (i+1)*b <= len(tokens); i++ {
		h := sha256.New()
		if i > 0 {
			h.Write(out[i-1][:])
		}
		var le [4]byte
		for _, t := range tokens[i*b : (i+1)*b] {
			binary.LittleEndian.PutUint32(le[:], t)
			h.Write(le[:])
		}
		var d [32]byte
		copy(d[:], h.Sum(nil))
		out = append(out, d)
	}
	return out
}

// PROMISE: TRUST-2
func TestPrefixDigestsGolden(t *testing.T) {
	for _, c := range []struct{ n, b int }{{5, 2}, {64 + 5, 16}, {16, 16}, {3 * 7, 7}, {1000, 1}} {
		toks := seqTokens(c.n, c.n)
		want := goDigests(toks, c.b)
		got := PrefixDigests(toks, uint32(c.b))
		if len(got) != len(want) || len(got) != c.n/c.b {
			t.Fatalf("n %d B %d: %d digests, want %d", c.n, c.b, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("n %d B %d: digest %d = %x, want %x", c.n, c.b, i, got[i], want[i])
			}
			var prev *[32]byte
			if i > 0 {
				prev = &want[i-1]
			}
			if d := PrefixDigestNext(prev, toks[i*c.b:(i+1)*c.b]); d != want[i] {
				t.Fatalf("n %d B %d: PrefixDigestNext %d = %x", c.n, c.b, i, d)
			}
		}
	}
	// A known value: SHA-256 of the 8 bytes 01 00 00 00 02 00 00 00.
	d := PrefixDigests([]uint32{1, 2, 3}, 2)
	if len(d) != 1 || fmt.Sprintf("%x", d[0]) != fmt.Sprintf("%x", sha256.Sum256([]byte{1, 0, 0, 0, 2, 0, 0, 0})) {
		t.Fatalf("digest of [1 2]: %x", d)
	}
	if PrefixDigests(seqTokens(0, 15), 16) != nil || PrefixDigests(seqTokens(0, 32), 0) != nil || PrefixDigests(nil, 4) != nil {
		t.Fatal("no full block must give nil")
	}
}

// PROMISE: TRUST-1
func TestVerifiedPutPrefixAndGetBlock(t *testing.T) {
	s, _ := newTestStore(t, 2, 4)
	toks := seqTokens(1, 4*16+5)
	hs := BlockHashes(toks, 16)
	ds := goDigests(toks, 16)
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 4 || v.StoppedAt() != nil {
		t.Fatalf("Prefix: %d blocks, %v, stopped %v", v.Len(), err, v.StoppedAt())
	}
	v.Release()
	for k := 1; k <= 4; k++ {
		b, err := s.GetBlock(toks[:k*16+3]) // the partial tail is ignored
		if err != nil || b.Len() != 1 || b.At(0).Hash() != hs[k-1] ||
			!bytes.Equal(b.At(0).Page(), pageOf(testGeom, toks, k-1)[:1024]) {
			t.Fatalf("GetBlock %d blocks: %v", k, err)
		}
		b.Release()
	}
	// Same last block, another block before it: no block matches.
	other := append(append([]uint32(nil), seqTokens(50, 16)...), toks[16:32]...)
	if _, err := s.GetBlock(other); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetBlock with another first block: %v", err)
	}
	if _, err := s.GetBlock(toks[:15]); !errors.Is(err, ErrTokens) {
		t.Fatalf("GetBlock without a full block: %v", err)
	}
	// The shard records each block's digest.
	sh, err := s.Shards()
	if err != nil || len(sh) == 0 {
		t.Fatal(err)
	}
	found := 0
	for _, x := range sh {
		if x.Info().Flags&FlagDigest == 0 {
			t.Fatalf("shard %s lacks the digest table", x.Path())
		}
		es, err := x.Entries()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			for i := range hs {
				if e.Hash == hs[i] {
					if !bytes.Equal(e.Digest, ds[i][:]) {
						t.Fatalf("entry of block %d: digest %x, want %x", i, e.Digest, ds[i])
					}
					found++
				}
			}
		}
		x.Close()
	}
	if found != 4 {
		t.Fatalf("%d entries of the sequence found", found)
	}
}

// checkEmptyEnvelope checks a 0-block envelope byte by byte against the
// spec, independently of the library (hash/crc32 Castagnoli).
func checkEmptyEnvelope(t *testing.T, env []byte, version, dtype uint16, g Geometry) {
	t.Helper()
	le := binary.LittleEndian
	if len(env) != 32 || string(env[:4]) != "TLKV" || le.Uint16(env[4:]) != version || le.Uint16(env[6:]) != dtype ||
		le.Uint32(env[8:]) != 0 || le.Uint32(env[12:]) != g.BlockTokens || le.Uint32(env[16:]) != g.Layers ||
		le.Uint32(env[20:]) != g.KVHeads || le.Uint32(env[24:]) != g.HeadDim {
		t.Fatalf("empty envelope v%d: % x", version, env)
	}
	if crc := crc32.Checksum(env[:28], crc32.MakeTable(crc32.Castagnoli)); le.Uint32(env[28:]) != crc {
		t.Fatalf("empty envelope CRC %#x, want %#x", le.Uint32(env[28:]), crc)
	}
}

func TestExport(t *testing.T) {
	s, _ := newTestStore(t, 2, 3)
	for _, ver := range []uint16{EnvelopeV1, EnvelopeV2} {
		dtype := uint16(1)
		if ver == EnvelopeV2 {
			dtype = 3
		}
		env, err := s.Export(nil, ver)
		if err != nil {
			t.Fatalf("Export of no views v%d: %v", ver, err)
		}
		checkEmptyEnvelope(t, env, ver, dtype, testGeom)
		empty := newViews(0)
		if env2, err := s.Export(empty, ver); err != nil || !bytes.Equal(env, env2) {
			t.Fatalf("Export of an empty Views: %v", err)
		}
		e, err := ParseEnvelope(env, &testGeom)
		if err != nil || e.Version != ver || len(e.Blocks) != 0 || e.Geometry.BlockTokens != 16 {
			t.Fatalf("ParseEnvelope of the empty envelope: %+v %v", e, err)
		}
	}

	toks := seqTokens(1, 3*16+5)
	hs := BlockHashes(toks, 16)
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 3 {
		t.Fatal(err)
	}
	defer v.Release()
	env, err := s.Export(v, EnvelopeV1)
	p := 1 * 2 * 2 * 16 * 8 * 2
	if err != nil || len(env) != 28+3*(12+p)+4 {
		t.Fatalf("Export v1: %d bytes, %v", len(env), err)
	}
	e, err := ParseEnvelope(env, &testGeom)
	if err != nil || e.Version != 1 || e.DType != 1 || e.PayloadBytes != p || len(e.Blocks) != 3 {
		t.Fatalf("ParseEnvelope: %+v %v", e, err)
	}
	for i, b := range e.Blocks {
		// With L = 1 the page [K|V][L][Hkv][B][D] and the payload
		// [L][K|V][Hkv][B][D] have the same order: f16 is copied as is.
		if b.Hash != hs[i] || b.Tokens != 16 || !bytes.Equal(b.Payload, pageOf(testGeom, toks, i)[:1024]) {
			t.Fatalf("envelope block %d: hash %#x tokens %d", i, b.Hash, b.Tokens)
		}
	}
	// Into another store: unverified without tokens, verified with them,
	// byte for byte.
	dir := t.TempDir() + "/b"
	s2, err := Create(dir, StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if n, err := s2.PutEnvelope(env, toks); err != nil || n != 3 {
		t.Fatalf("PutEnvelope with tokens: %d %v", n, err)
	}
	if err := s2.Flush(); err != nil {
		t.Fatal(err)
	}
	v2, err := s2.Prefix(toks)
	if err != nil || v2.Len() != 3 {
		t.Fatalf("prefix of the imported envelope: %d %v", v2.Len(), err)
	}
	for i := 0; i < 3; i++ {
		if !bytes.Equal(v2.At(i).Page(), v.At(i).Page()) {
			t.Fatalf("imported block %d differs", i)
		}
	}
	if env2, err := s2.Export(v2, EnvelopeV1); err != nil || !bytes.Equal(env2, env) {
		t.Fatalf("re-export differs: %v", err)
	}
	v2.Release()

	// v2: e4m3 with scales, of finite f16 values (the quantizer refuses
	// NaN and inf, which random page bytes hold).
	sf, err := Create(t.TempDir()+"/f", StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	fin := pagesFor(testGeom, toks)
	for i := 0; i+1 < len(fin); i += 2 {
		fin[i+1] &^= 0x40 // exponent below 31: finite
	}
	if _, err := sf.Put(toks, fin, nil); err != nil || sf.Flush() != nil {
		t.Fatal(err)
	}
	vf, err := sf.Prefix(toks)
	if err != nil || vf.Len() != 3 {
		t.Fatal(err)
	}
	defer vf.Release()
	env, err = sf.Export(vf, EnvelopeV2)
	p2 := 1 * 2 * 2 * (16*8 + 4)
	if err != nil || len(env) != 28+3*(12+p2)+4 {
		t.Fatalf("Export v2: %d bytes, %v", len(env), err)
	}
	if e, err = ParseEnvelope(env, nil); err != nil || e.Version != 2 || e.DType != 3 || e.PayloadBytes != p2 ||
		len(e.Blocks) != 3 || e.Blocks[2].Hash != hs[2] {
		t.Fatalf("ParseEnvelope v2: %+v %v", e, err)
	}
	// An E4M3 store holds a v2 envelope exactly: import, export, same bytes.
	ge := testGeom
	ge.Quant = QuantE4M3
	se, err := Create(t.TempDir()+"/e", StoreOptions{Geometry: ge, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer se.Close()
	if n, err := se.PutEnvelope(env, toks); err != nil || n != 3 || se.Flush() != nil {
		t.Fatalf("PutEnvelope v2 into an E4M3 store: %d %v", n, err)
	}
	ve, err := se.Prefix(toks)
	if err != nil || ve.Len() != 3 || ve.At(0).Scales() == nil {
		t.Fatalf("prefix of the v2 import: %d %v", ve.Len(), err)
	}
	if env2, err := se.Export(ve, EnvelopeV2); err != nil || !bytes.Equal(env2, env) {
		t.Fatalf("v2 round trip through an E4M3 store differs: %v", err)
	}
	ve.Release()
	// Reader rules: a flipped byte fails the CRC, a wrong B is ErrShape.
	bad := append([]byte(nil), env...)
	bad[40] ^= 1
	if _, err := ParseEnvelope(bad, nil); !errors.Is(err, ErrFormat) {
		t.Fatalf("damaged envelope: %v", err)
	}
	g := testGeom
	g.BlockTokens = 8
	if _, err := ParseEnvelope(env, &g); !errors.Is(err, ErrShape) {
		t.Fatalf("envelope of another B: %v", err)
	}
	if _, err := ParseEnvelope(nil, nil); !errors.Is(err, ErrFormat) {
		t.Fatalf("empty buffer: %v", err)
	}

	// Refusals: a version kvx does not write, a GetHashes miss, views of
	// another geometry, released views.
	if _, err := s.Export(v, 9); !errors.Is(err, ErrVersion) {
		t.Fatalf("Export v9: %v", err)
	}
	vs, _, err := s.GetHashes([]uint64{hs[0], 777})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Export(vs, EnvelopeV1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Export of a miss: %v", err)
	}
	vs.Release()
	g = testGeom
	g.HeadDim = 16
	s3, err := Create(t.TempDir()+"/c", StoreOptions{Geometry: g, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if _, err := s3.Export(v, EnvelopeV1); !errors.Is(err, ErrShape) {
		t.Fatalf("Export through a store of another geometry: %v", err)
	}
	v.Release()
	if _, err := s.Export(v, EnvelopeV1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Export of released views: %v", err)
	}
}

// PROMISE: TRUST-4
func TestUnverifiedEnvelope(t *testing.T) {
	s, _ := newTestStore(t, 1, 3)
	toks := seqTokens(0, 3*16+5)
	hs := BlockHashes(toks, 16)
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 3 {
		t.Fatal(err)
	}
	env, err := s.Export(v, EnvelopeV1)
	v.Release()
	if err != nil {
		t.Fatal(err)
	}

	s2, err := Create(t.TempDir()+"/b", StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if n, err := s2.PutEnvelope(env, nil); err != nil || n != 3 {
		t.Fatalf("PutEnvelope without tokens: %d %v", n, err)
	}
	if err := s2.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		_, err := s2.GetHash(h)
		var ke *Error
		if !errors.Is(err, ErrUnverified) || !errors.Is(err, ErrNotFound) || errors.Is(err, ErrAmbiguous) ||
			!errors.As(err, &ke) || ke.Name != "KVX_EUNVERIFIED" || !strings.Contains(ke.Message, "unverified") {
			t.Fatalf("GetHash of unverified block %d: %v", i, err)
		}
	}
	p, err := s2.Prefix(toks)
	if err != nil || p.Len() != 0 || p.StoppedAt() != nil {
		t.Fatalf("Prefix over unverified blocks: %d %v %v", p.Len(), err, p.StoppedAt())
	}
	p.Release()
	if _, err := s2.GetBlock(toks); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetBlock of an unverified block: %v", err)
	}
	vs, errs, err := s2.GetHashes(hs)
	if err != nil || vs.Len() != 3 {
		t.Fatal(err)
	}
	for i := range hs {
		if vs.At(i).Found() || !errors.Is(errs[i], ErrUnverified) {
			t.Fatalf("GetHashes %d: %v", i, errs[i])
		}
	}
	vs.Release()
	// Unverified blocks are reachable by coordinate, and their entries
	// carry neither tokens nor a digest.
	sh, err := s2.Shards()
	if err != nil || len(sh) != 1 {
		t.Fatal(len(sh), err)
	}
	es, err := sh[0].Entries()
	sh[0].Close()
	if err != nil || len(es) != 3 {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Digest != nil || e.Tokens != nil {
			t.Fatalf("unverified entry %+v", e)
		}
	}
	c, err := s2.Get(es[1].Coordinate)
	if err != nil || c.At(0).Hash() != es[1].Hash {
		t.Fatalf("Get of an unverified block by coordinate: %v", err)
	}
	c.Release()

	// Tokens whose hashes are not the envelope's are refused; the right
	// tokens make a verified copy that supersedes the unverified one.
	wrong := append([]uint32(nil), toks...)
	wrong[0]++
	if _, err := s2.PutEnvelope(env, wrong); !errors.Is(err, ErrHash) {
		t.Fatalf("PutEnvelope with other tokens: %v", err)
	}
	if n, err := s2.PutEnvelope(env, toks); err != nil || n != 3 {
		t.Fatalf("verified PutEnvelope over unverified blocks: %d %v", n, err)
	}
	if err := s2.Flush(); err != nil {
		t.Fatal(err)
	}
	p, err = s2.Prefix(toks)
	if err != nil || p.Len() != 3 || !bytes.Equal(p.At(2).Page(), pageOf(testGeom, toks, 2)[:1024]) {
		t.Fatalf("Prefix after the verified put: %d %v", p.Len(), err)
	}
	p.Release()
	g, err := s2.GetHash(hs[0])
	if err != nil {
		t.Fatalf("GetHash after the verified put: %v", err)
	}
	g.Release()
	if _, err := s2.PutEnvelope(env[:10], nil); !errors.Is(err, ErrFormat) {
		t.Fatalf("PutEnvelope of a short buffer: %v", err)
	}
}

// collideA and collideB are two different 16-token blocks with the same
// chained hash (an FNV-1a 64 collision found offline with tests/collide.h's
// distinguished-point search): the test checks they collide.
var (
	collideA = []uint32{0xd9ec677c, 0xd31adb08, 0xbad88f3c, 0x0470a2cb, 0x97db48c8, 0x4ff523ab, 0xab60082f, 0xaae4e19b,
		0x9c9a98a3, 0x8ff39c6e, 0x669cb178, 0x010c89ce, 0xf4d364ea, 0x50e045cc, 0x15a21650, 0x1f48a922}
	collideB = []uint32{0xd9ec677c, 0xd31adb08, 0xbad88f3c, 0x0470a2cb, 0x97db48c8, 0x4ff523ab, 0xab60082f, 0xaae4e19b,
		0x9c9a98a3, 0x8ff39c6e, 0x669cb178, 0x010c89ce, 0xf4d364ea, 0x50e045cc, 0x1134bdad, 0x73ed62dc}
)

// PROMISE: TRUST-1, TRUST-3
func TestCollisionAmbiguousAndDigestPicks(t *testing.T) {
	if BlockHash(0, collideA) != BlockHash(0, collideB) || equalU32(collideA, collideB) {
		t.Fatal("the golden pair does not collide")
	}
	// Two prompts: the colliding first block, then the same second block,
	// so both blocks of each prompt have the other prompt's hashes.
	tail := seqTokens(3, 16)
	ta := append(append([]uint32(nil), collideA...), tail...)
	tb := append(append([]uint32(nil), collideB...), tail...)
	hs := BlockHashes(ta, 16)
	if hb := BlockHashes(tb, 16); hb[0] != hs[0] || hb[1] != hs[1] {
		t.Fatal("chained hashes of the two prompts differ")
	}
	pa := pagesFor(testGeom, ta)
	pb := append([]byte(nil), pa...)
	for i := range pb {
		pb[i] ^= 0x5A // other KV under the same hashes
	}
	s, err := Create(t.TempDir()+"/s", StoreOptions{Geometry: testGeom, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, err := s.Put(ta, pa, nil); err != nil || n != 2 {
		t.Fatalf("Put A: %d %v", n, err)
	}
	if n, err := s.Put(tb, pb, nil); err != nil || n != 2 {
		t.Fatalf("Put B (same hashes, other digests) must not be deduplicated: %d %v", n, err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if _, err := s.GetHash(h); !errors.Is(err, ErrAmbiguous) || !errors.Is(err, ErrNotFound) ||
			errors.Is(err, ErrUnverified) || !strings.Contains(err.Error(), fmt.Sprintf("%016x", h)) {
			t.Fatalf("GetHash of a collided hash: %v", err)
		}
	}
	_, errs, err := s.GetHashes(hs)
	if err != nil || !errors.Is(errs[0], ErrAmbiguous) || !errors.Is(errs[1], ErrAmbiguous) {
		t.Fatalf("GetHashes of collided hashes: %v %v", errs, err)
	}
	for _, c := range []struct {
		name  string
		toks  []uint32
		pages []byte
	}{{"A", ta, pa}, {"B", tb, pb}} {
		v, err := s.Prefix(c.toks)
		if err != nil || v.Len() != 2 {
			t.Fatalf("Prefix %s: %d %v", c.name, v.Len(), err)
		}
		env, err := s.Export(v, EnvelopeV1)
		if err != nil {
			t.Fatal(err)
		}
		e, err := ParseEnvelope(env, &testGeom)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			want := c.pages[i*1024 : (i+1)*1024]
			if !bytes.Equal(v.At(i).Page(), want) || !bytes.Equal(e.Blocks[i].Payload, want) {
				t.Fatalf("Prefix %s block %d served another prompt's KV", c.name, i)
			}
			b, err := s.GetBlock(c.toks[:(i+1)*16])
			if err != nil || !bytes.Equal(b.At(0).Page(), want) {
				t.Fatalf("GetBlock %s block %d: %v", c.name, i, err)
			}
			b.Release()
		}
		v.Release()
	}
}

// damagePage flips one byte of block blk's page (entry of hash h) in the
// store's shard file.
func damagePage(t *testing.T, s *Store, h uint64, truncate bool) {
	t.Helper()
	// the active shard sealed first (docs/STORE.md "Appends"), so the
	// damage is to a sealed file, as a disk would do it after a close
	if err := s.GC(); err != nil {
		t.Fatal(err)
	}
	sh, err := s.Shards()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, x := range sh {
			x.Close()
		}
	}()
	for _, x := range sh {
		es, err := x.Entries()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if e.Hash != h {
				continue
			}
			f, err := os.OpenFile(x.Path(), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if truncate {
				err = f.Truncate(int64(e.Offset) + 100)
			} else {
				var b [1]byte
				if _, err = f.ReadAt(b[:], int64(e.Offset)+5); err == nil {
					b[0] ^= 0x10
					_, err = f.WriteAt(b[:], int64(e.Offset)+5)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no entry with hash %#x", h)
}

// PROMISE: TRUST-6
func TestPrefixStoppedAtDamage(t *testing.T) {
	for _, truncate := range []bool{false, true} {
		t.Run(fmt.Sprintf("truncate=%v", truncate), func(t *testing.T) {
			s, dir := newTestStore(t, 1, 4)
			toks := seqTokens(0, 4*16)
			hs := BlockHashes(toks, 16)
			// The last block of the file: truncation leaves the others whole.
			damagePage(t, s, hs[3], truncate)
			s.Close()
			r, err := Open(dir, &OpenOptions{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			v, err := r.Prefix(toks)
			if err != nil || v.Len() != 3 {
				t.Fatalf("Prefix over a damaged 4th block: %d %v", v.Len(), err)
			}
			for i := 0; i < 3; i++ {
				if !bytes.Equal(v.At(i).Page(), pageOf(testGeom, toks, i)[:1024]) {
					t.Fatalf("good block %d differs", i)
				}
			}
			want := ErrPageCRC
			if truncate {
				want = ErrTruncated
			}
			st := v.StoppedAt()
			if !errors.Is(st, want) || !errors.Is(st, ErrCorrupt) || !strings.Contains(st.Error(), fmt.Sprintf("%016x", hs[3])) {
				t.Fatalf("StoppedAt: %v, want %v naming %016x", st, want, hs[3])
			}
			v.Release()
			if v.StoppedAt() == nil {
				t.Fatal("StoppedAt must stay after Release")
			}
			if _, err := r.GetBlock(toks); !errors.Is(err, want) {
				t.Fatalf("GetBlock of the damaged block: %v", err)
			}
			// A prompt that ends before the damage: no note.
			v, err = r.Prefix(toks[:3*16])
			if err != nil || v.Len() != 3 || v.StoppedAt() != nil {
				t.Fatalf("Prefix before the damage: %d %v %v", v.Len(), err, v.StoppedAt())
			}
			v.Release()
		})
	}
}

// Views handed out before their page was damaged: Export checks every
// page again and refuses.
// PROMISE: TRUST-5
func TestExportRechecksPages(t *testing.T) {
	s, _ := newTestStore(t, 1, 3)
	toks := seqTokens(0, 3*16)
	hs := BlockHashes(toks, 16)
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 3 {
		t.Fatal(err)
	}
	defer v.Release()
	if _, err := s.Export(v, EnvelopeV1); err != nil {
		t.Fatal(err)
	}
	damagePage(t, s, hs[1], false) // the mapping is shared: the view sees it
	_, err = s.Export(v, EnvelopeV1)
	if !errors.Is(err, ErrPageCRC) || !strings.Contains(err.Error(), fmt.Sprintf("%016x", hs[1])) {
		t.Fatalf("Export of a page damaged after the lookup: %v", err)
	}
}

// Prefix, GetBlock and Export from many goroutines (run with -race).
// PROMISE: GO-5
func TestConcurrentGetBlockExport(t *testing.T) {
	s, _ := newTestStore(t, 4, 3)
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for it := 0; it < 50; it++ {
				toks := seqTokens((g+it)%4, 3*16)
				v, err := s.Prefix(toks)
				if err != nil || v.Len() != 3 {
					errc <- fmt.Errorf("prefix: %v", err)
					return
				}
				env, err := s.Export(v, EnvelopeV1)
				v.Release()
				if err != nil {
					errc <- err
					return
				}
				e, err := ParseEnvelope(env, &testGeom)
				if err != nil || !bytes.Equal(e.Blocks[2].Payload, pageOf(testGeom, toks, 2)[:1024]) {
					errc <- fmt.Errorf("envelope: %v", err)
					return
				}
				b, err := s.GetBlock(toks[:2*16])
				if err != nil || !bytes.Equal(b.At(0).Page(), pageOf(testGeom, toks, 1)[:1024]) {
					errc <- fmt.Errorf("GetBlock: %v", err)
					return
				}
				b.Release()
			}
		}(g)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}
