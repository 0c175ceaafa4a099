// bf16_test.go - the package knows bf16 (quant_format 3) and envelope v3:
// names both ways, a bf16 store whose pages come back byte for byte and
// export as v3 losslessly, and an EnvelopeV1 export that refuses values
// f16 cannot hold (ErrLossy).
package kvx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func TestQuantBF16Names(t *testing.T) {
	if QuantBF16 != 3 || QuantBF16.String() != "bf16" || QuantBF16.ElemSize() != 2 {
		t.Fatalf("QuantBF16 = %d %q %d", QuantBF16, QuantBF16.String(), QuantBF16.ElemSize())
	}
	for _, q := range []Quant{QuantFP16, QuantE4M3, QuantE5M2, QuantBF16} {
		if got, err := ParseQuant(q.String()); err != nil || got != q {
			t.Fatalf("ParseQuant(%q) = %v, %v", q.String(), got, err)
		}
	}
	if _, err := ParseQuant("fp8"); !errors.Is(err, ErrQuant) || !errors.Is(err, ErrFormat) {
		t.Fatalf("ParseQuant(fp8): %v", err)
	}
	if Quant(4).String() != "quant(4)" {
		t.Fatalf("Quant(4) = %q", Quant(4).String())
	}
}

// PROMISE: FORMAT-15
func TestBF16StoreEnvelopeV3(t *testing.T) {
	g := testGeom
	g.Quant = QuantBF16
	s, err := Create(t.TempDir()+"/bf16", StoreOptions{Geometry: g, NoSync: true})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer s.Close()
	if s.Geometry().Quant != QuantBF16 {
		t.Fatalf("geometry quant %v", s.Geometry().Quant)
	}
	toks := seqTokens(7, 2*16)
	pages := pagesFor(g, toks) // random bits: some values do not fit f16
	if n, err := s.Put(toks, pages, nil); err != nil || n != 2 {
		t.Fatalf("Put: %d %v", n, err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	v, err := s.Prefix(toks)
	if err != nil || v.Len() != 2 {
		t.Fatalf("Prefix: %v", err)
	}
	defer v.Release()
	env, err := s.Export(v, EnvelopeV3)
	if err != nil {
		t.Fatalf("Export v3: %v", err)
	}
	e, err := ParseEnvelope(env, &g)
	if err != nil || e.Version != EnvelopeV3 || e.DType != 2 || e.Geometry.Quant != QuantBF16 {
		t.Fatalf("ParseEnvelope: %+v %v", e, err)
	}
	// L = 1 and N = B: the payload [L][K|V][Hkv][B][D] is the page's order
	pb := int(g.PageBytes(g.BlockTokens))
	for i, b := range e.Blocks {
		if !bytes.Equal(b.Payload, pages[i*pb:(i+1)*pb]) {
			t.Fatalf("block %d payload differs from the page put", i)
		}
	}
	if _, err := s.Export(v, EnvelopeV1); !errors.Is(err, ErrLossy) ||
		!strings.Contains(err.Error(), "not exactly representable in f16") {
		t.Fatalf("Export v1 of random bf16: %v", err)
	}

	// a v3 envelope of exact small values goes to v1 and back through v3
	small := make([]byte, pb)
	for i := 0; i < pb/2; i++ {
		binary.LittleEndian.PutUint16(small[2*i:], uint16(0x3F80+(i%9))) // 1 + k/128: exact in f16
	}
	toks2 := seqTokens(8, 16)
	if n, err := s.Put(toks2, small, nil); err != nil || n != 1 {
		t.Fatalf("Put small: %d %v", n, err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	v2, err := s.Prefix(toks2)
	if err != nil || v2.Len() != 1 {
		t.Fatalf("Prefix small: %v", err)
	}
	defer v2.Release()
	env1, err := s.Export(v2, EnvelopeV1)
	if err != nil {
		t.Fatalf("Export v1 of exact values: %v", err)
	}
	if _, err := s.Export(v2, EnvelopeV2); err != nil {
		t.Fatalf("Export v2: %v", err)
	}
	e1, err := ParseEnvelope(env1, &g)
	if err != nil || e1.Version != EnvelopeV1 {
		t.Fatalf("ParseEnvelope v1: %v", err)
	}
	if got := binary.LittleEndian.Uint16(e1.Blocks[0].Payload[2:]); got != 0x3C08 { // 1 + 1/128 in f16
		t.Fatalf("f16 of bf16 0x3F81 = %#04x", got)
	}
}
