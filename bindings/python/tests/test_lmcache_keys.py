"""LMCache as deployed (issue 37): keys over 255 bytes (a local snapshot path as the model name plus a salt) and
the buffers LMCache really hands over (MemoryObj.byte_array: a ctypes-backed memoryview of format "<B")."""
import ctypes

import pytest

import kvx
from conftest import rand_bytes
from kvx.integrations import lmcache
from kvx.integrations.lmcache import KvxConnector
from lmcache_driver import ObjectKey, load_native_plugin, object_key_to_string, wait_result, wait_store
from test_lmcache import PB, config, drain_until

SNAPSHOT = ("/home/inference/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/"
            "0e9e39f249a16976918f6564b8830bc894c89659")  # a local snapshot path as the model name: 120 bytes


def byte_array(data):
    """A buffer as LMCache hands it: MemoryObj.byte_array, a memoryview of a ctypes c_ubyte array ("<B")."""
    arr = (ctypes.c_ubyte * len(data)).from_buffer_copy(data) if len(data) else (ctypes.c_ubyte * 0)()
    m = memoryview(arr)
    assert m.format == "<B" and m.itemsize == 1 and m.ndim == 1
    return m


def empty_array(n, fill=0):
    return byte_array(bytes([fill]) * n)


def run(c, call, *args):
    f = call(*args)
    return drain_until(c, [f])[f]


@pytest.fixture
def conn(tmp_path):
    c = KvxConnector(path=str(tmp_path / "l2"), page_bytes=PB, capacity="64MiB", nosync=True)
    yield c
    c.close()


# PROMISE: ENGINE-26
def test_long_keys_300_and_4000_bytes_through_the_bridge(tmp_path):
    """LMCache's own keys over 255 bytes (a 120-byte snapshot path as the model name plus a salt: 300 bytes; a
    4,000-byte key), mixed with short ones in one batch, are stored, looked up, loaded byte-equal, found again
    after a restart and deleted; before, the submission raised inside LMCache's store path."""
    short = ObjectKey("m", 0, 0, b"\x01" * 32, "")
    k300 = ObjectKey(SNAPSHOT, 0, 0, b"\x02" * 32, "s" * (300 - len(object_key_to_string(
        ObjectKey(SNAPSHOT, 0, 0, b"\x02" * 32, "")).encode()) - 1))
    k4000 = ObjectKey(SNAPSHOT, 0, 0, b"\x03" * 32, "t" * 3800)
    keys = [short, k300, k4000]
    assert [len(object_key_to_string(k).encode()) for k in keys][1] == 300
    assert len(object_key_to_string(k4000).encode()) > 3900
    data = [rand_bytes(70 + i, PB) for i in range(3)]
    cfg = config(tmp_path / "l2")
    a = load_native_plugin(cfg)
    try:
        ok, nbytes, err = wait_store(a, a.submit_store_task(keys, [byte_array(d) for d in data]))
        assert ok and nbytes == 3 * PB and err == ""
    finally:
        a.close()
    a = load_native_plugin(cfg)  # a restart: the long keys' pages and key pages both survive
    try:
        t = a.submit_lookup_and_lock_task(keys)
        assert wait_result(a.lookup_efd, a.query_lookup_and_lock_result, t) == [True] * 3
        out = [empty_array(PB) for _ in range(3)]
        t = a.submit_load_task(keys, out)
        assert wait_result(a.load_efd, a.query_load_result, t) == [True] * 3
        assert [bytes(o) for o in out] == data
        a.delete(keys[1:])
        t = a.submit_lookup_and_lock_task(keys)
        assert wait_result(a.lookup_efd, a.query_lookup_and_lock_result, t) == [True, False, False]
        assert a.unknown == []
    finally:
        a.close()


# PROMISE: ENGINE-26
def test_long_keys_sharing_their_first_bytes_stay_apart(conn):
    """Keys that agree in their first 255 (and 3,999) bytes and differ after: each serves its own page, never the
    other's (a digest of the truncated key would make them one)."""
    base3 = b"k" * 299
    base4 = b"q" * 3999
    keys = [base3 + b"A", base3 + b"B", base4 + b"A", base4 + b"B", b"k" * 255]
    data = [rand_bytes(90 + i, PB) for i in range(len(keys))]
    assert run(conn, conn.submit_batch_set, keys, [byte_array(d) for d in data])[1]
    out = [empty_array(PB) for _ in keys]
    assert run(conn, conn.submit_batch_get, keys, out) == (2, True, "", [True] * 5)
    assert [bytes(o) for o in out] == data
    assert run(conn, conn.submit_batch_delete, [keys[0], keys[2]])[3] == [True, True]
    assert run(conn, conn.submit_batch_exists, keys)[3] == [False, True, False, True, True]
    out = [empty_array(PB, 0x5A) for _ in keys]
    assert run(conn, conn.submit_batch_get, keys, out)[3] == [False, True, False, True, True]
    assert bytes(out[0]) == b"\x5a" * PB and bytes(out[1]) == data[1] and bytes(out[3]) == data[3]


# PROMISE: ENGINE-26
def test_colliding_digests_never_serve_another_keys_page(conn, monkeypatch):
    """With the digest forced to collide (every long key one digest), the full key kept beside the page is
    compared on every read: the second key's get is a miss (its buffer untouched), exists is False, its delete
    deletes nothing, and the first key still reads its own page."""
    monkeypatch.setattr(lmcache, "_long_digest", lambda key: b"\x00" * 32)
    k1, k2 = b"a" * 300, b"b" * 4000
    d1, d2 = rand_bytes(111, PB), rand_bytes(112, PB)
    assert run(conn, conn.submit_batch_set, [k1], [byte_array(d1)])[1]
    assert run(conn, conn.submit_batch_set, [k2], [byte_array(d2)])[1]  # ok, but the digest's page is k1's
    out = empty_array(PB, 0x5A)
    assert run(conn, conn.submit_batch_get, [k2, k1], [out, empty_array(PB)])[3] == [False, True]
    assert bytes(out) == b"\x5a" * PB
    assert run(conn, conn.submit_batch_exists, [k2, k1])[3] == [False, True]
    assert run(conn, conn.submit_batch_delete, [k2])[3] == [False]
    out = empty_array(PB)
    assert run(conn, conn.submit_batch_get, [k1], [out])[3] == [True] and bytes(out) == d1


# PROMISE: ENGINE-27
def test_ctypes_byte_arrays_take_the_fast_path(conn, monkeypatch):
    """LMCache's MemoryObj.byte_array ("<B", ctypes-backed) takes the same path as "B": accepted as given, never
    re-checked one by one and cast; set and get through it are byte-equal, the last chunk short too."""
    mv = [byte_array(rand_bytes(120 + i, PB)) for i in range(4)] + [byte_array(rand_bytes(130, 1000))]
    bufs = conn._buffers(mv, len(mv), writable=True, what="t")
    assert [b.format for b in bufs] == ["<B"] * 5  # the fast path: the caller's views, not cast copies
    m = memoryview(bytearray(8)).cast("@B")
    assert conn._buffers([m], 1, writable=True, what="t")[0].format == "@B"
    keys = [f"chunk{i}" for i in range(5)]
    assert run(conn, conn.submit_batch_set, keys, mv)[1]
    out = [empty_array(PB) for _ in range(4)] + [empty_array(1000)]
    assert run(conn, conn.submit_batch_get, keys, out)[3] == [True] * 5
    assert [bytes(o) for o in out] == [bytes(m) for m in mv]
