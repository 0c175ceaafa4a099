// views_test.go - Views and View under misuse: indexes past the end,
// concurrent double Release, export of released, missing and foreign views.
package kvx

import (
	"errors"
	"sync"
	"testing"
)

// PROMISE: TRUST-12, GO-2, GO-9
func TestAttackViewsMisuse(t *testing.T) {
	s, _ := newTestStore(t, 1, 3)
	toks := seqTokens(0, 3*16+5)
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 3 {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("At(Len()) did not panic")
			}
		}()
		v.At(3)
	}()
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ { // a concurrent double Release frees once
		wg.Add(1)
		go func() { defer wg.Done(); v.Release() }()
	}
	wg.Wait()
	if _, err := s.Export(v, EnvelopeV1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Export of released views: %v", err)
	}
	if env, err := s.Export(nil, EnvelopeV1); err != nil || len(env) != EnvelopeHeaderBytes+4 {
		t.Fatalf("Export(nil): %d bytes, %v", len(env), err)
	}
	if _, err := s.Export(nil, 77); !errors.Is(err, ErrVersion) {
		t.Fatalf("Export version 77: %v", err)
	}
	// GetHashes misses: a Views with holes, exported (refused) and released
	hs := BlockHashes(toks, 16)
	g, errs, err := s.GetHashes([]uint64{hs[0], 12345, hs[2]})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], ErrNotFound) || errs[2] != nil {
		t.Fatalf("GetHashes: %v %v", errs, err)
	}
	if g.At(1).Found() || g.At(1).Page() != nil {
		t.Fatal("a miss has a page")
	}
	if _, err := s.Export(g, EnvelopeV1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Export with a miss: %v", err)
	}
	g.Release()
	// views of another store's geometry: ErrShape, never read at this size
	other, err := Create(t.TempDir()+"/o", StoreOptions{Geometry: Geometry{Layers: 2, KVHeads: 2, HeadDim: 8,
		BlockTokens: 16, Quant: QuantFP16, ModelSignature: 0x1234}, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ot := seqTokens(5, 16)
	if _, err := other.Put(ot, make([]byte, other.Geometry().PageBytes(16)), nil); err != nil {
		t.Fatal(err)
	}
	other.Flush()
	ov, err := other.Prefix(ot)
	if err != nil || ov.Len() != 1 {
		t.Fatal(err)
	}
	if _, err := s.Export(ov, EnvelopeV1); !errors.Is(err, ErrShape) || errors.Is(err, ErrModel) {
		t.Fatalf("Export of a foreign view: %v", err)
	}
	ov.Release()
	// the same shape, another model: ErrModel (was the shim's ErrShape)
	mg := testGeom
	mg.ModelSignature = 0x9999
	other2, err := Create(t.TempDir()+"/m", StoreOptions{Geometry: mg, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other2.Close()
	if _, err := other2.Put(ot, pagesFor(mg, ot), nil); err != nil {
		t.Fatal(err)
	}
	other2.Flush()
	mv, err := other2.Prefix(ot)
	if err != nil || mv.Len() != 1 {
		t.Fatal(err)
	}
	if _, err := s.Export(mv, EnvelopeV1); !errors.Is(err, ErrModel) {
		t.Fatalf("Export of another model's view: %v, want ErrModel", err)
	}
	mv.Release()
}
