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
