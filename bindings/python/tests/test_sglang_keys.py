"""Keys and pointers as SGLang (or a hostile caller) hands them over: every
key of 1..255 bytes works with multi-buffer pages, and bad keys and
pointers raise kvx.InvalidError naming them, never an unrelated error."""
import array

import pytest

import kvx
from sglang_driver import MHAHostPool, create_dynamic_backend, storage_config

PAGE = 4


def extra(path, **kw):
    e = {"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
         "interface_v1": 1, "path": str(path), "page_bytes": 65536, "capacity": "64MiB", "nosync": True}
    e.update(kw)
    return e


def indices(pages):
    out = array.array("q")
    for p in pages:
        out.extend(range(p * PAGE, (p + 1) * PAGE))
    return out


def key_of_len(n, salt="k"):
    return (f"{n:03d}{salt}" * 64)[:n]


# PROMISE: ENGINE-21
def test_keys_of_every_length_with_two_buffer_pages(tmp_path):
    """Keys of 1..255 bytes (str and bytes), each page a K and a V buffer: one batch stores them all, every page
    is counted and read back whole; keys of 255 bytes that differ in their last byte are pages of their own.
    Buffer 1's key was key + NUL + "1": for keys of 254 and 255 bytes it passed 255 bytes and the whole batch
    failed, naming a key index and length the caller never passed."""
    n = 255
    pool = MHAHostPool(page_size=PAGE, pages=2 * n + 2, dim=16)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3")), pool)
    try:
        ks = [key_of_len(i) if i % 2 else key_of_len(i).encode() for i in range(1, n + 1)]
        ks.append(key_of_len(254) + "x")  # 255 bytes, differs from ks[254] in its last byte only
        for p in range(len(ks)):
            pool.fill_page(p, seed=p)
        assert b.batch_set_v1(ks, indices(range(len(ks)))) == [True] * len(ks)
        assert b.batch_exists(ks) == len(ks)
        dst = range(len(ks), 2 * len(ks))
        assert b.batch_get_v1(ks, indices(dst)) == [True] * len(ks)
        assert [pool.page_bytes_of(p) for p in dst] == [pool.page_bytes_of(p) for p in range(len(ks))]
    finally:
        b.close()


class _Pool(MHAHostPool):
    """A host pool whose get_page_buffer_meta answers what the test says."""

    def __init__(self, meta):
        super().__init__(page_size=PAGE)
        self.meta = meta

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = super().get_page_buffer_meta(indices)
        return self.meta(ptrs, sizes)


@pytest.mark.parametrize("meta, what", [
    (lambda p, s: ([None] + p[1:], s), "pointer is None"),
    (lambda p, s: ([0] + p[1:], s), "pointer 0x0"),
    (lambda p, s: ([-4096] + p[1:], s), "pointer"),
    (lambda p, s: ([float(p[0])] + p[1:], s), "pointer is"),
    (lambda p, s: (["0x1000"] + p[1:], s), "pointer is"),
    (lambda p, s: ([True] + p[1:], s), "pointer is True"),
    (lambda p, s: (p, [None] + s[1:]), "size is None"),
    (lambda p, s: (p, [0] + s[1:]), "0 bytes"),
    (lambda p, s: (p, [1 << 60] + s[1:]), "bytes"),
], ids=["None", "null", "negative", "float", "str", "bool", "size-None", "size-0", "size-huge"])
# PROMISE: ENGINE-21
def test_hostile_pointers_raise_invalid_error(tmp_path, meta, what):
    """A page buffer pointer or size that is not a positive integer (None, a float, a str, a bool, 0, a
    negative or huge one) is kvx.InvalidError naming the buffer, before any byte is read or written. A None
    pointer raised TypeError from the adapter's own message formatting."""
    pool = _Pool(meta)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3")), pool)
    try:
        for call in (b.batch_set_v1, b.batch_get_v1):
            with pytest.raises(kvx.InvalidError, match="page buffer 0") as e:
                call(["k"], indices([0]))
            assert what in str(e.value)
    finally:
        b.close()


# PROMISE: ENGINE-21
def test_hostile_keys_raise_invalid_error(tmp_path):
    """A str key that is not UTF-8 (a lone surrogate), a key that is None or an int, keys that are None: kvx.
    InvalidError naming the key, in every call. The surrogate raised UnicodeEncodeError."""
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3")), pool)
    try:
        calls = [lambda ks: b.batch_exists(ks), lambda ks: b.batch_set_v1(ks, indices(range(len(ks)))),
                 lambda ks: b.batch_get_v1(ks, indices(range(len(ks)))), lambda ks: b.batch_get(ks),
                 lambda ks: b.batch_set(ks, [b"x"] * len(ks)), lambda ks: b.exists(ks[-1]),
                 lambda ks: b.get(ks[-1]), lambda ks: b.set(ks[-1], b"x")]
        for bad, match in (("a\ud800b", "is not UTF-8 text .*character 1"), (None, "is NoneType"), (7, "is int")):
            for i, call in enumerate(calls):
                one = i >= 5  # exists, get, set: one key
                with pytest.raises(kvx.InvalidError, match=("keys\\[0\\] " if one else "keys\\[1\\] ") + match):
                    call([bad] if one else ["ok", bad])
        with pytest.raises(kvx.InvalidError, match="list of keys"):
            b.batch_exists(None)
    finally:
        b.close()
