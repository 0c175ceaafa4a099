"""Keyed pages through the binding: a keyed store (Store.create(dir,
page_bytes=N)), keyed_put / keyed_get / keyed_get_into / keyed_exists /
keyed_delete, durability at flush, zero-copy views, errors."""
import array
import ctypes
import gc
import os
import threading

import pytest

import kvx
from conftest import GEOM, damage_page, needs_numpy, np, rand_bytes, seq_tokens

PB = 8192


@pytest.fixture
def ks(tmp_path):
    with kvx.Store.create(str(tmp_path / "keyed"), page_bytes=PB, capacity=64 << 20, nosync=True) as st:
        yield st


def pages(n, seed=0, size=PB):
    return [rand_bytes(seed + i, size) for i in range(n)]


def test_create_keyed_store(ks, tmp_path):
    assert ks.keyed and ks.page_bytes == PB
    assert ks.stat()["page_bytes"] == PB
    with pytest.raises(TypeError):
        kvx.Store.create(str(tmp_path / "both"), page_bytes=PB, **GEOM)
    with kvx.Store.create(str(tmp_path / "blocks"), **GEOM, nosync=True) as bs:
        assert not bs.keyed and bs.stat()["page_bytes"] == 0


def test_put_get_round_trip(ks):
    """str and bytes keys; bytearray, memoryview and bytes pages, a short last page; invisible until flush;
    views are the stored bytes (a zero-copy buffer), None for a miss."""
    p = pages(3)
    keys = ["model@1@0@abc", b"\x00binary\xffkey", "short"]
    data = [p[0], memoryview(p[1]), bytes(p[2][:100])]
    assert ks.keyed_put(keys, data) == 3
    assert ks.keyed_get(keys) == [None, None, None]  # not visible before the flush
    assert ks.stat()["pending_blocks"] == 3
    ks.flush()
    views = ks.keyed_get(keys + ["absent"])
    assert views[3] is None
    assert bytes(views[0]) == p[0] and bytes(views[1]) == p[1]
    assert bytes(views[2]) == p[2][:100] and views[2].page_bytes == 100 and len(views[2]) == 100
    m = memoryview(views[0])  # the buffer protocol: read-only, the page's bytes
    assert m.readonly and m.nbytes == PB and m == memoryview(p[0])
    assert ks.keyed_put(keys[:1], [p[1]]) == 0  # a key already held is skipped, its page kept
    ks.flush()
    assert bytes(ks.keyed_get(keys[:1])[0]) == p[0]


@needs_numpy
def test_numpy_pages_and_views(ks):
    """numpy arrays as pages (read in place) and as zero-copy arrays over the views."""
    a = np.frombuffer(bytes(rand_bytes(3, PB)), dtype=np.uint8)
    assert ks.keyed_put(["np"], [a]) == 1
    ks.flush()
    (v,) = ks.keyed_get(["np"])
    got = np.frombuffer(v, dtype=np.uint8)
    assert np.array_equal(got, a) and not got.flags.writeable and not got.flags.owndata
    out = np.zeros(PB, np.uint8)
    assert ks.keyed_get_into(["np"], [out]) == [True] and np.array_equal(out, a)


# PROMISE: PY-8
def test_get_into(ks):
    p = pages(2, seed=5)
    ks.keyed_put(["a", "b"], p)
    ks.flush()
    out = [(ctypes.c_ubyte * PB)(), bytearray(b"\xee" * PB), bytearray(b"\xee" * (PB - 1))]
    assert ks.keyed_get_into(["a", "missing", "b"], out) == [True, False, False]
    assert bytes(out[0]) == p[0]  # a ctypes array: written in place
    assert out[1] == bytearray(b"\xee" * PB)  # a miss: untouched
    assert out[2] == bytearray(b"\xee" * (PB - 1))  # a length that differs: untouched
    with pytest.raises(TypeError):
        ks.keyed_get_into(["a"], [bytes(PB)])  # read-only
    with pytest.raises(ValueError):
        ks.keyed_get_into(["a", "b"], [bytearray(PB)])


# PROMISE: PY-20
def test_read_into(ks):
    """keyed_read_into: each held page read into its buffer (an mmap: 4096-aligned, as a pinned host slot is) and
    checked there; a miss leaves its buffer untouched; a shorter page is False and its buffer zeroed; a buffer
    under page_bytes, or a read-only one, is refused before anything is read."""
    import mmap
    p = pages(2, seed=7)
    ks.keyed_put(["a", "b", "short"], [p[0], p[1], p[0][:100]])
    ks.flush()
    slab = mmap.mmap(-1, 4 * PB)
    view = memoryview(slab)
    out = [view[0:PB], bytearray(b"\xee" * PB), view[PB:2 * PB], view[2 * PB:3 * PB]]
    out[3][:] = b"\x55" * PB
    assert ks.keyed_read_into(["a", "missing", "b", "short"], out) == [True, False, True, False]
    assert bytes(out[0]) == p[0] and bytes(out[2]) == p[1]
    assert out[1] == bytearray(b"\xee" * PB)  # a miss: untouched
    assert bytes(out[3]) == bytes(PB)  # read, but not a whole buffer: zeroed
    with pytest.raises(kvx.InvalidError, match=r"dst_cap\[0\]"):
        ks.keyed_read_into(["a"], [bytearray(PB - 1)])
    with pytest.raises(TypeError):
        ks.keyed_read_into(["a"], [bytes(PB)])  # read-only
    with pytest.raises(ValueError):
        ks.keyed_read_into(["a", "b"], [bytearray(PB)])
    for o in (out[0], out[2], out[3], view):
        o.release()
    slab.close()


# PROMISE: PY-20
def test_read_into_refuses_shared_and_odd_buffers(ks, tmp_path):
    """keyed_read_into: one buffer given for two keys, or two views that overlap, is refused before anything is
    read (else a later key's read, a damaged page zeroed, overwrote a page reported read); a non-contiguous view is
    refused; a bytearray another thread tries to resize during the read cannot be (BufferError), and every page
    reported read is whole."""
    p = pages(2, seed=11)
    ks.keyed_put(["good", "bad"], p)
    ks.flush()
    ks.close()
    d = str(tmp_path / "keyed")
    damage_page(os.path.join(d, "shards"), p[1])
    st = kvx.Store.open(d)
    try:
        b = bytearray(PB)
        with pytest.raises(kvx.InvalidError, match="overlap"):
            st.keyed_read_into(["good", "bad"], [b, b])
        slab = bytearray(2 * PB)
        v = memoryview(slab)
        with pytest.raises(kvx.InvalidError, match="overlap"):
            st.keyed_read_into(["good", "bad"], [v[0:PB], v[PB - 8:2 * PB - 8]])
        assert st.keyed_read_into(["good", "bad"], [v[0:PB], v[PB:2 * PB]]) == [True, False]
        assert bytes(v[0:PB]) == p[0] and bytes(v[PB:2 * PB]) == bytes(PB)
        with pytest.raises(TypeError):
            st.keyed_read_into(["good"], [memoryview(bytearray(2 * PB))[::2]])
        stop, resized, refused = threading.Event(), [0], [0]
        bufs = [bytearray(PB) for _ in range(64)]

        def resize():
            while not stop.is_set():
                for x in bufs:
                    try:
                        x.extend(b"\0")
                        del x[PB:]
                        resized[0] += 1
                    except BufferError:
                        refused[0] += 1

        th = threading.Thread(target=resize)
        th.start()
        try:
            for _ in range(200):
                got = st.keyed_read_into(["good"] * 64, bufs)
                for ok, x in zip(got, bufs):
                    assert not ok or bytes(x[:PB]) == p[0]
        finally:
            stop.set()
            th.join()
        v.release()
    finally:
        st.close()


# PROMISE: PY-21
def test_contains_reads_no_page(ks, tmp_path):
    """keyed_contains: which keys are held, and the leading count, without reading a page: a damaged page is held
    there, not for keyed_exists, and refused by a read; each key found is a hit in stat()."""
    p = pages(2, seed=8)
    ks.keyed_put(["a", "b"], p)
    ks.flush()
    h0 = ks.stat()["hits"]
    assert ks.keyed_contains(["a", "missing", "b"]) == ([True, False, True], 1)
    assert ks.stat()["hits"] == h0 + 2
    ks.close()
    d = str(tmp_path / "keyed")
    damage_page(os.path.join(d, "shards"), p[1])
    st = kvx.Store.open(d)
    try:
        assert st.keyed_contains(["b"]) == ([True], 1)
        assert st.keyed_exists(["b"]) == ([False], 0)
        assert st.keyed_read_into(["b"], [bytearray(PB)]) == [False]
    finally:
        st.close()


# PROMISE: PY-8
def test_get_into_groups(ks):
    """group=2: each pair of keys is copied whole or not at all; a pair with one key missing leaves both
    buffers untouched; keys that are not whole groups, or a group below 1, are refused."""
    p = pages(3, seed=6)
    ks.keyed_put(["a", "a/1", "b"], p)
    ks.flush()
    out = [bytearray(b"\xee" * PB) for _ in range(4)]
    assert ks.keyed_get_into(["a", "a/1", "b", "b/1"], out, group=2) == [True, True, False, False]
    assert bytes(out[0]) == bytes(p[0]) and bytes(out[1]) == bytes(p[1])
    assert out[2] == bytearray(b"\xee" * PB) and out[3] == bytearray(b"\xee" * PB)  # b held, b/1 not: untouched
    with pytest.raises(ValueError):
        ks.keyed_get_into(["a", "a/1", "b"], out[:3], group=2)
    with pytest.raises(ValueError):
        ks.keyed_get_into(["a"], out[:1], group=0)


def test_exists_leading_and_delete(ks, tmp_path):
    p = pages(4, seed=9)
    ks.keyed_put(["k0", "k1", "k3"], [p[0], p[1], p[3]])
    ks.flush()
    assert ks.keyed_exists(["k0", "k1", "k2", "k3"]) == ([True, True, False, True], 2)
    assert ks.keyed_exists([]) == ([], 0)
    assert ks.keyed_delete(["k1", "k2"]) == 1
    assert ks.keyed_get(["k1"]) == [None]
    assert ks.keyed_exists(["k0", "k1", "k3"]) == ([True, False, True], 1)
    assert ks.keyed_delete(["k1"]) == 0
    ks.close()
    with kvx.Store.open(str(tmp_path / "keyed")) as again:  # the delete was durable
        assert again.keyed and again.page_bytes == PB
        assert again.keyed_exists(["k0", "k1", "k3"])[0] == [True, False, True]


# PROMISE: PY-8, ENGINE-9
def test_delete_each_says_which_keys_were_deleted(ks):
    """keyed_delete(keys, each=True): [bool] per key, True where a copy was there and is deleted (a key named
    twice: True both times); the count form is unchanged."""
    p = pages(3, seed=11)
    ks.keyed_put(["a", "b", "c"], p)
    ks.flush()
    assert ks.keyed_delete(["a", "x", "a", "b"], each=True) == [True, False, True, True]
    assert ks.keyed_delete(["a", "b"], each=True) == [False, False]
    assert ks.keyed_delete([], each=True) == []
    assert ks.keyed_exists(["a", "b", "c"])[0] == [False, False, True]
    assert ks.keyed_delete(keys=["c"], each=False) == 1
    with pytest.raises(kvx.InvalidError):
        ks.keyed_delete(["c", ""], each=True)


def test_keyed_keys_names_every_key_of_the_live_shards(ks, tmp_path):
    """keyed_keys(): every key the live shards name, flushed by any batch, deleted ones too (keyed_exists and
    keyed_delete judge them); not an unflushed one; a read-only handle sees the same; a block store has none."""
    assert ks.keyed_keys() == set()
    with ks.batch() as b:
        b.keyed_put(["a", b"\x00bin", "c" * 255], pages(3))
    ks.keyed_put(["pending"], pages(1))
    assert ks.keyed_keys() == {b"a", b"\x00bin", b"c" * 255}
    ks.flush()
    assert ks.keyed_delete(["a"]) == 1
    got = ks.keyed_keys()
    assert got == {b"a", b"\x00bin", b"c" * 255, b"pending"}
    assert ks.keyed_exists(sorted(got))[0] == [True, False, True, True]  # \x00bin, a (deleted), c..., pending
    with kvx.Store.open(str(tmp_path / "keyed"), readonly=True) as ro:
        assert ro.keyed_keys() == got
    with kvx.Store.create(str(tmp_path / "blocks"), **GEOM, nosync=True) as bs:
        assert bs.keyed_keys() == set()
    ks.close()
    with pytest.raises(ValueError):
        ks.keyed_keys()


# PROMISE: KEYED-4
def test_restart_keeps_flushed_drops_unflushed(tmp_path):
    d = str(tmp_path / "r")
    p = pages(2, seed=11)
    st = kvx.Store.create(d, page_bytes=PB, capacity=64 << 20)
    st.keyed_put(["flushed"], [p[0]])
    st.flush()
    st.keyed_put(["unflushed"], [p[1]])
    st.close()
    with kvx.Store.open(d) as st:
        v = st.keyed_get(["flushed", "unflushed"])
        assert bytes(v[0]) == p[0] and v[1] is None


# PROMISE: KEYED-2, PY-8
def test_bad_keys_and_sizes(ks):
    page = bytearray(PB)
    for keys, data in (([""], [page]), (["x" * 256], [page]), (["big"], [bytearray(PB + 1)]),
                       (["empty"], [bytearray(0)])):
        with pytest.raises(kvx.InvalidError) as e:
            ks.keyed_put(keys, data)
        assert e.value.code == kvx.EINVALID and e.value.name == "KVX_EINVALID" and e.value.message
    assert ks.stat()["pending_blocks"] == 0  # nothing written
    for call in (ks.keyed_get, ks.keyed_exists, ks.keyed_delete):
        with pytest.raises(kvx.InvalidError):
            call([""])
    assert ks.keyed_put(["x" * 255], [page]) == 1  # 255 bytes is a key
    with pytest.raises(TypeError):
        ks.keyed_put([42], [page])
    with pytest.raises(TypeError):
        ks.keyed_get("one-key")
    with pytest.raises(ValueError):
        ks.keyed_put(["a", "b"], [page])
    with pytest.raises(TypeError):
        ks.keyed_put(["a"], [memoryview(bytearray(16))[::2]])  # not contiguous


# PROMISE: KEYED-1
def test_keyed_and_block_calls_do_not_mix(ks, store):
    with pytest.raises(kvx.InvalidError):
        store.keyed_put(["a"], [bytearray(16)])
    with pytest.raises(kvx.InvalidError):
        store.keyed_get(["a"])
    with pytest.raises(kvx.InvalidError):
        ks.prefix(array.array("I", range(64)))


def test_views_outlive_close_and_release(ks):
    p = pages(1, seed=13)
    ks.keyed_put(["v"], p)
    ks.flush()
    (v,) = ks.keyed_get(["v"])
    a = memoryview(v)
    ks.close()
    gc.collect()
    assert bytes(v) == p[0]
    v.release()
    with pytest.raises(ValueError):
        memoryview(v)
    assert a.tobytes() == p[0]  # the export keeps the page mapped
    with pytest.raises(ValueError):
        ks.keyed_get(["v"])


def test_batch_keyed_put(ks):
    p = pages(2, seed=17)
    with ks.batch() as b:
        assert b.keyed_put(["b0", "b1"], p) == 2
        assert ks.keyed_exists(["b0"])[0] == [False]  # pending in the batch
    assert ks.keyed_exists(["b0", "b1"]) == ([True, True], 2)


def test_busy_second_writer(ks, tmp_path):
    with pytest.raises(kvx.BusyError) as e:
        kvx.Store.open(str(tmp_path / "keyed"), nowait=True)
    assert e.value.code == kvx.EBUSY


def test_threads_get_while_putting(ks):
    """Lookups from several threads while another thread puts and flushes (the GIL is released in C)."""
    p = pages(8, seed=19)
    ks.keyed_put([f"base{i}" for i in range(8)], p)
    ks.flush()
    stop, errors = threading.Event(), []

    def reader():
        try:
            while not stop.is_set():
                out = [bytearray(PB) for _ in range(8)]
                assert ks.keyed_get_into([f"base{i}" for i in range(8)], out) == [True] * 8
                assert all(bytes(o) == x for o, x in zip(out, p))
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=reader) for _ in range(3)]
    for t in ts:
        t.start()
    for r in range(20):
        ks.keyed_put([f"w{r}-{i}" for i in range(4)], p[:4])
        ks.flush()
    stop.set()
    for t in ts:
        t.join()
    assert not errors, errors
    assert ks.keyed_exists([f"w19-{i}" for i in range(4)])[1] == 4


# PROMISE: PY-8
@needs_numpy
def test_keyed_misuse(tmp_path):
    st = kvx.Store.create(str(tmp_path / "k"), page_bytes=64, nosync=True)
    assert st.keyed_put([b"a", "b"], [b"x" * 64, bytearray(b"y" * 10)]) == 2
    st.flush()
    with pytest.raises(TypeError, match="not one key"):
        st.keyed_get(b"a")
    with pytest.raises(TypeError, match="not bytes or str"):
        st.keyed_get([1])
    with pytest.raises(ValueError, match="2 keys but 1 buffers"):
        st.keyed_put([b"c", b"d"], [b"z"])
    with pytest.raises(kvx.InvalidError):
        st.keyed_put([b""], [b"z"])
    with pytest.raises(kvx.InvalidError):
        st.keyed_put([b"k" * 256], [b"z"])
    with pytest.raises(kvx.InvalidError):
        st.keyed_put([b"big"], [b"z" * 65])
    with pytest.raises(UnicodeEncodeError):
        st.keyed_get(["\udc80"])
    with pytest.raises(TypeError, match="writable"):
        st.keyed_get_into([b"a"], [b"\x00" * 64])  # read-only target
    with pytest.raises(TypeError, match="contiguous"):
        st.keyed_get_into([b"a"], [np.zeros(128, np.uint8)[::2]])
    dst = bytearray(63)
    assert st.keyed_get_into([b"a"], [dst]) == [False] and dst == bytearray(63)  # wrong size: untouched
    dst = bytearray(64)
    assert st.keyed_get_into([b"a"], [dst]) == [True] and dst == b"x" * 64
    with pytest.raises(kvx.InvalidError):
        st.put(seq_tokens(0, 1), b"\x00" * 64)  # block call on a keyed store
    v = st.keyed_get([b"a\x00", b"a"])
    assert v[0] is None and bytes(v[1]) == b"x" * 64
    st.close()
    assert bytes(v[1]) == b"x" * 64


# PROMISE: PY-8
def test_keyed_keys_list_changed_by_another_thread(tmp_path):
    st = kvx.Store.create(str(tmp_path / "k"), page_bytes=64, nosync=True)
    names = [f"key-{i:04d}".encode() * 8 for i in range(64)]
    st.keyed_put(names, [n[:64] for n in names])
    st.flush()
    keys = list(names)
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            keys[:] = [bytes(bytearray(n)) for n in names]  # new objects, the old ones freed

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(200):
            got = st.keyed_get(keys)
            assert len(got) == 64 and all(g is not None and bytes(g) == n[:64] for g, n in zip(got, names))
    finally:
        stop.set()
        t.join()
    st.close()


def test_keyed_view_outlives_delete_gc_and_close(tmp_path):
    st = kvx.Store.create(str(tmp_path / "k"), page_bytes=64, nosync=True)
    st.keyed_put([b"a", b"b"], [b"1" * 64, b"2" * 64])
    st.flush()
    va, vb = st.keyed_get([b"a", b"b"])
    mv = memoryview(va)
    assert st.keyed_delete([b"a", b"b", b"never"]) == 2
    st.gc()
    assert st.keyed_get([b"a"]) == [None]
    st.close()
    assert bytes(mv) == b"1" * 64 and bytes(vb) == b"2" * 64
    vb.release()
    va.release()
    assert bytes(mv) == b"1" * 64



def test_keyed_misuse_without_numpy(tmp_path):
    """test_keyed_misuse with a strided memoryview where it takes a strided numpy array."""
    st = kvx.Store.create(str(tmp_path / "k"), page_bytes=64, nosync=True)
    assert st.keyed_put([b"a", "b"], [b"x" * 64, bytearray(b"y" * 10)]) == 2
    st.flush()
    with pytest.raises(TypeError, match="not one key"):
        st.keyed_get(b"a")
    with pytest.raises(TypeError, match="not bytes or str"):
        st.keyed_get([1])
    with pytest.raises(ValueError, match="2 keys but 1 buffers"):
        st.keyed_put([b"c", b"d"], [b"z"])
    with pytest.raises(kvx.InvalidError):
        st.keyed_put([b""], [b"z"])
    with pytest.raises(kvx.InvalidError):
        st.keyed_put([b"k" * 256], [b"z"])
    with pytest.raises(kvx.InvalidError):
        st.keyed_put([b"big"], [b"z" * 65])
    with pytest.raises(UnicodeEncodeError):
        st.keyed_get(["\udc80"])
    with pytest.raises(TypeError, match="writable"):
        st.keyed_get_into([b"a"], [b"\x00" * 64])  # read-only target
    with pytest.raises(TypeError, match="contiguous"):
        st.keyed_get_into([b"a"], [memoryview(bytearray(128))[::2]])
    dst = bytearray(63)
    assert st.keyed_get_into([b"a"], [dst]) == [False] and dst == bytearray(63)  # wrong size: untouched
    dst = bytearray(64)
    assert st.keyed_get_into([b"a"], [dst]) == [True] and dst == b"x" * 64
    with pytest.raises(kvx.InvalidError):
        st.put(seq_tokens(0, 1), b"\x00" * 64)  # block call on a keyed store
    v = st.keyed_get([b"a\x00", b"a"])
    assert v[0] is None and bytes(v[1]) == b"x" * 64
    st.close()
    assert bytes(v[1]) == b"x" * 64


# PROMISE: PY-12
def test_evicted_reports_the_keys_eviction_removed(tmp_path):
    """evicted() hands over, oldest first and once, the keys this handle's evictions removed: each is no longer
    held, every key is held or reported (never both), a reader handle reports nothing, misuse raises."""
    d = str(tmp_path / "ev")
    st = kvx.Store.create(d, page_bytes=4096, capacity=512 << 10, shard_bytes=32 << 10, nosync=True)
    assert st.evicted() == ([], 0)
    keys = [b"chunk-%03d" % i for i in range(300)]
    for i, k in enumerate(keys):
        st.keyed_put([k], [rand_bytes(i, 3000)])
        if i % 4 == 3:
            st.flush()
    st.flush()
    ev, dropped = st.evicted(max=40)  # a partial take: the rest stays for the next call
    rest, dropped2 = st.evicted()
    assert dropped == dropped2 == 0
    got = ev + rest
    assert len(ev) == 40 and len(got) > 40 and all(isinstance(k, bytes) for k in got)
    assert len(set(got)) == len(got) and got == sorted(got)  # oldest first: put in this order
    held, _ = st.keyed_exists(keys)
    assert {k for k, h in zip(keys, held) if not h} == set(got)
    assert st.evicted() == ([], 0)  # taken
    with pytest.raises(ValueError):
        st.evicted(max=0)
    with pytest.raises(ValueError):
        st.evicted(max=(1 << 16) + 1)
    st.close()
    with kvx.Store.open(d, readonly=True) as r:
        assert r.evicted() == ([], 0)
    with pytest.raises(ValueError):
        st.evicted()  # closed
