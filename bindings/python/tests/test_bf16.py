"""bf16 through the binding, which passes quants by name: a bf16 store's
pages round-trip bit-exact, and its envelopes are v3 (v1 refuses values f16
cannot hold). Skipped when this libkvx has no bf16."""
import array
import random
import struct

import pytest

import kvx
from conftest import GEOM, needs_numpy, np, seq_tokens

pytestmark = pytest.mark.skipif("bf16" not in kvx.quant_names(), reason="this libkvx has no bf16")


def to_bf16_bits(f32):
    """Floats rounded to bf16 (nearest even; no NaN here), as array('H') of its bits."""
    u = struct.unpack("<%dI" % len(f32), struct.pack("<%df" % len(f32), *f32))
    return array.array("H", (((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF for x in u))


def from_bf16_bits(b):
    return list(struct.unpack("<%df" % len(b), struct.pack("<%dI" % len(b), *(x << 16 for x in b))))


def test_bf16_round_trip_and_v3(tmp_path):
    with kvx.Store.create(str(tmp_path / "a"), **GEOM, quant="bf16") as st:
        assert st.geometry["quant"] == "bf16"
        n = 3
        rng = random.Random(7)
        vals = [rng.gauss(0, 1) * 1e6 for _ in range(n * st.page_bytes // 2)]
        vals = list(struct.unpack("<%df" % len(vals), struct.pack("<%df" % len(vals), *vals)))  # float32
        bits = to_bf16_bits(vals)
        toks = seq_tokens(11, n)
        assert st.put(toks, bits) == n
        st.flush()
        views = st.prefix(toks)
        got = array.array("H")
        for v in views:
            got.extend(memoryview(v).cast("H"))
        assert got == bits
        assert all(abs(a - b) <= 1e-8 + 2 ** -8 * abs(b) for a, b in zip(from_bf16_bits(got), vals))
        env = st.export(views, version=3)
        with pytest.raises(kvx.Error):  # 1e6-scale values do not fit f16: v1 refuses
            st.export(views, version=1)
    with kvx.Store.create(str(tmp_path / "b"), **GEOM, quant="bf16") as other:
        assert other.put_envelope(env, toks) == n
        other.flush()
        assert b"".join(bytes(v) for v in other.prefix(toks)) == bits.tobytes()


# PROMISE: PY-6
@needs_numpy
def test_float16_kv_refused_by_a_bf16_store(tmp_path):
    """float16 KV (format 'e') given to a bf16 store has the right element size but other bits (fp16 1.0,
    0x3C00, reads back as bf16 0.0078125): refused, naming the field and both formats, in Store.put and
    Batch.put. The bits as integers (uint16, int16, uint8) or raw bytes still go in. (Only numpy or torch
    make a float16 buffer; the integer and bytes forms: test_bf16_bits_go_in_as_integers_or_bytes.)"""
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
        bits = np.frombuffer(to_bf16_bits([1.0] * f16.size).tobytes(), np.uint16)  # 0x3F80 each
        for k, ok in enumerate((bits, bits.view(np.int16), bits.view(np.uint8), bits.tobytes())):
            t = seq_tokens(20 + k, n)
            assert st.put(t, ok) == n
            st.flush()
            got = np.concatenate([np.frombuffer(v, dtype=np.uint16) for v in st.prefix(t)])
            assert (got == 0x3F80).all()


def test_bf16_bits_go_in_as_integers_or_bytes(tmp_path):
    """A bf16 store takes its bits as 2-byte integers (array 'H', 'h'), bytes or a memoryview; float32 KV
    (array 'f') is refused by its element size."""
    with kvx.Store.create(str(tmp_path / "d"), **GEOM, quant="bf16", nosync=True) as st:
        n = 2
        bits = to_bf16_bits([1.0] * (n * st.page_bytes // 2))  # 0x3F80 each
        assert set(bits) == {0x3F80}
        for k, ok in enumerate((bits, array.array("h", bits.tobytes()), bits.tobytes(), memoryview(bits))):
            t = seq_tokens(20 + k, n)
            assert st.put(t, ok) == n
            st.flush()
            got = [x for v in st.prefix(t) for x in memoryview(v).cast("H")]
            assert len(got) == len(bits) and set(from_bf16_bits(got)) == {1.0}
        with pytest.raises(ValueError, match="4-byte elements"):
            st.put(seq_tokens(30, 2 * n), array.array("f", [1.0] * len(bits)))
