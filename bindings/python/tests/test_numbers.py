"""Integer arguments out of their C type's range raise OverflowError instead
of wrapping (coordinates, hashes, block_tokens, sizes, TTLs); quant names
are matched whole; NUL bytes in strings are refused."""
import pytest

import kvx
from conftest import B, GEOM, needs_numpy, np


class Index:
    """An integer through __index__ only (as numpy's integer scalars are)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


# PROMISE: PY-5
@needs_numpy
def test_coordinates_and_hashes_do_not_wrap(filled):
    st, toks, _ = filled
    v = st.prefix(toks)[0]
    c, h = v.coordinate, v.hash
    assert st.get(c).hash == h and st.get_hash(h).coordinate == c
    for bad in (c + 2**32, c - 2**32, -1):
        with pytest.raises(OverflowError):
            st.get(bad)  # was: get(c + 2^32) served block c
    for bad in (h + 2**64, -1, h - 2**64):
        with pytest.raises(OverflowError):
            st.get_hash(bad)
    with pytest.raises(OverflowError):
        st.get_hashes([-1])
    with pytest.raises(TypeError):
        st.get(1.0)
    assert st.get(np.uint32(c)).coordinate == c  # __index__ types are fine
    with pytest.raises(OverflowError):
        kvx.block_hashes(toks, 2**32 + B)  # was: block_tokens B
    with pytest.raises(kvx.InvalidError):
        kvx.block_hashes(toks, 0)


# PROMISE: PY-5
def test_create_numbers_do_not_wrap(tmp_path):
    g = dict(GEOM)
    for k, bad in (("num_layers", 2**32 + 1), ("head_dim", -8), ("block_tokens", 2**32 + 16),
                   ("capacity", -1), ("model_signature", -1), ("shard_bytes", 2**64)):
        with pytest.raises(OverflowError):
            kvx.Store.create(str(tmp_path / k), **dict(g, **{k: bad}))
        assert not (tmp_path / k).exists()
    with pytest.raises(OverflowError):
        kvx.Store.open(str(tmp_path / "x"), tier_ttl_ms=-1)
    for q in ("fp16\x00x", "bf16\x00", "", "FP16"):  # a name cut at its NUL was accepted
        with pytest.raises(kvx.QuantError):
            kvx.Store.create(str(tmp_path / "q"), **dict(g, quant=q))
    with pytest.raises(ValueError, match="null"):
        kvx.Store.create(str(tmp_path / "t"), **g, tier_url="redis://a\x00b")
    with pytest.raises(ValueError, match="null"):
        kvx.Store.open(str(tmp_path / "t"), tier_tenant="t1\x00t2")
    assert not (tmp_path / "q").exists() and not (tmp_path / "t").exists()



def test_coordinates_and_hashes_do_not_wrap_without_numpy(filled):
    """test_coordinates_and_hashes_do_not_wrap with an __index__ class where it takes numpy's uint32."""
    st, toks, _ = filled
    v = st.prefix(toks)[0]
    c, h = v.coordinate, v.hash
    assert st.get(c).hash == h and st.get_hash(h).coordinate == c
    for bad in (c + 2**32, c - 2**32, -1):
        with pytest.raises(OverflowError):
            st.get(bad)
    for bad in (h + 2**64, -1, h - 2**64):
        with pytest.raises(OverflowError):
            st.get_hash(bad)
    with pytest.raises(OverflowError):
        st.get_hashes([-1])
    with pytest.raises(TypeError):
        st.get(1.0)
    assert st.get(Index(c)).coordinate == c and st.get_hash(Index(h)).hash == h  # __index__ types are fine
    with pytest.raises(OverflowError):
        st.get(Index(c + 2**32))
    with pytest.raises(OverflowError):
        kvx.block_hashes(toks, 2**32 + B)
    with pytest.raises(kvx.InvalidError):
        kvx.block_hashes(toks, 0)
