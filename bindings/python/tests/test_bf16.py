"""bf16 through the binding, which passes quants by name: a bf16 store's
pages round-trip bit-exact, and its envelopes are v3 (v1 refuses values f16
cannot hold). Skipped when this libkvx has no bf16."""
import numpy as np
import pytest

import kvx
from conftest import GEOM, seq_tokens

pytestmark = pytest.mark.skipif("bf16" not in kvx.quant_names(), reason="this libkvx has no bf16")


def to_bf16_bits(f32):
    """Round to nearest even, as numpy has no bfloat16 (no NaN here)."""
    u = f32.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def test_bf16_round_trip_and_v3(tmp_path):
    with kvx.Store.create(str(tmp_path / "a"), **GEOM, quant="bf16") as st:
        assert st.geometry["quant"] == "bf16"
        n = 3
        vals = np.random.default_rng(7).standard_normal(n * st.page_bytes // 2).astype(np.float32) * 1e6
        bits = to_bf16_bits(vals)
        toks = seq_tokens(11, n)
        assert st.put(toks, bits) == n
        st.flush()
        views = st.prefix(toks)
        got = np.concatenate([np.frombuffer(v, dtype=np.uint16) for v in views])
        assert np.array_equal(got, bits)
        assert np.allclose(from_bf16_bits(got), vals, rtol=2 ** -8)
        env = st.export(views, version=3)
        with pytest.raises(kvx.Error):  # 1e6-scale values do not fit f16: v1 refuses
            st.export(views, version=1)
    with kvx.Store.create(str(tmp_path / "b"), **GEOM, quant="bf16") as other:
        assert other.put_envelope(env, toks) == n
        other.flush()
        assert b"".join(bytes(v) for v in other.prefix(toks)) == bits.tobytes()


def test_float16_kv_refused_by_a_bf16_store(tmp_path):
    """float16 KV (format 'e') given to a bf16 store has the right element size but other bits (fp16 1.0,
    0x3C00, reads back as bf16 0.0078125): refused, naming the field and both formats, in Store.put and
    Batch.put. The bits as integers (uint16, int16, uint8) or raw bytes still go in."""
    with kvx.Store.create(str(tmp_path / "c"), **GEOM, quant="bf16", nosync=True) as st:
        n = 2
        toks = seq_tokens(12, n)
        f16 = np.ones(n * st.page_bytes // 2, np.float16)
        msg = r"pages has format '.?e' \(float16\), the store's quant is bf16"
        with pytest.raises(ValueError, match=msg):
            st.put(toks, f16)
        with pytest.raises(ValueError, match=msg):
            st.put(toks, f16.astype("<f2"))
        with st.batch() as b:
            with pytest.raises(ValueError, match=msg):
                b.put(toks, f16)
        st.flush()
        assert st.prefix(toks) == []
        bits = to_bf16_bits(f16.astype(np.float32))  # 0x3F80 each
        for k, ok in enumerate((bits, bits.view(np.int16), bits.view(np.uint8), bits.tobytes())):
            t = seq_tokens(20 + k, n)
            assert st.put(t, ok) == n
            st.flush()
            got = np.concatenate([np.frombuffer(v, dtype=np.uint16) for v in st.prefix(t)])
            assert (from_bf16_bits(got) == 1.0).all()
