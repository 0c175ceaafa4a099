"""Hostile use of the Python binding: what a careless or malicious embedder
does with handles, views, buffers, tokens, paths, threads and fork. Every
check asserts the binding's answer (an exception naming the problem, or
the right data); checks that could kill the interpreter run in a child
process so the suite survives and reports them."""
import array
import copy
import ctypes
import gc
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import kvx
from conftest import GEOM, B, seq_tokens, kv_pages

HERE = os.path.dirname(os.path.abspath(__file__))


def run_child(code, timeout=60):
    """Runs code in a fresh interpreter (same PYTHONPATH): (returncode, output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


# ---- views, memoryviews and numpy arrays outliving what made them --------------


def test_view_buffers_outlive_store_and_release(tmp_path):
    d = str(tmp_path / "s")
    st = kvx.Store.create(d, **GEOM, nosync=True)
    toks, pages = seq_tokens(0, 4), None
    pages = kv_pages(st, 4)
    st.put(toks, pages)
    st.flush()
    vs = st.prefix(toks)
    assert len(vs) == 4
    mv = vs[0].page
    arr = np.frombuffer(vs[1], dtype=np.float16)
    st.close()
    st.close()  # idempotent
    for v in vs:
        v.release()
        v.release()  # idempotent
        assert v.released
        with pytest.raises(ValueError, match="released"):
            memoryview(v)
        with pytest.raises(ValueError, match="released"):
            v.coordinate
        with pytest.raises(ValueError, match="released"):
            len(v)
        with pytest.raises(ValueError, match="released"):
            v.__enter__()
    del vs
    gc.collect()
    # the buffers taken before the release still hold the shard mapping
    assert bytes(mv) == pages[0].tobytes()
    assert np.array_equal(arr.view(np.uint16), pages[1].reshape(-1).view(np.uint16))
    with pytest.raises(TypeError):
        mv[0] = 1  # read-only
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr.setflags(write=True)


def test_view_buffers_survive_truncated_shard(tmp_path):
    # someone truncates the shard file under a live buffer: kvx's SIGBUS
    # guard must turn the lost pages into zeros, never kill the process
    rc, out = run_child(f"""
        import glob, os, kvx, numpy as np
        from conftest import GEOM, seq_tokens, kv_pages
        d = {str(tmp_path / "s")!r}
        st = kvx.Store.create(d, **GEOM, nosync=True)
        toks = seq_tokens(0, 4); st.put(toks, kv_pages(st, 4)); st.flush()
        vs = st.prefix(toks); mv = memoryview(vs[3]); st.close()
        for f in glob.glob(d + "/shards/*"):
            os.truncate(f, 0)
        assert bytes(mv) == bytes(len(mv)), "expected zero pages"
        print("OK")
    """)
    assert rc == 0 and "OK" in out, out


def test_handles_refuse_pickle_copy_and_construction(filled):
    st, toks, _ = filled
    v = st.prefix(toks)[0]
    b = st.batch()
    for obj in (st, v, b):
        with pytest.raises(TypeError):
            pickle.dumps(obj)
        with pytest.raises(TypeError):
            copy.copy(obj)
        with pytest.raises(TypeError):
            copy.deepcopy(obj)
    for cls in (kvx.Store, kvx.View, kvx.Batch):
        with pytest.raises(TypeError):
            cls()
    b.close()
    v.release()


# ---- closed handles -------------------------------------------------------------


def test_closed_store_and_batch(tmp_path):
    st = kvx.Store.create(str(tmp_path / "s"), **GEOM, nosync=True)
    toks, pages = seq_tokens(0, 2), kv_pages(st, 2)
    b = st.batch()
    b.put(toks, pages)
    st.close()
    assert st.closed
    for call in (lambda: st.prefix(toks), lambda: st.get(0), lambda: st.get_hash(1), lambda: st.flush(),
                 lambda: st.put(toks, pages), lambda: st.stat(), lambda: st.verify(), lambda: st.batch(),
                 lambda: st.export([]), lambda: st.get_hashes([1]), lambda: st.__enter__()):
        with pytest.raises(ValueError, match="closed"):
            call()
    # a batch whose store was closed is detached: a distinct library error,
    # its blocks were never acknowledged
    with pytest.raises(kvx.InvalidError, match="closed"):
        b.put(toks, pages)
    with pytest.raises(kvx.InvalidError):
        b.flush()
    b.close()
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.flush()
    st = kvx.Store.open(str(tmp_path / "s"))
    assert st.prefix(toks) == []  # nothing of the detached batch was published
    st.close()


def test_close_while_threads_look_up(filled):
    st, toks, pages = filled
    errors, served, start = [], [], threading.Barrier(5)

    def reader():
        start.wait()
        while True:
            try:
                vs = st.prefix(toks)
            except ValueError as e:
                errors.append(str(e))
                return
            served.append(vs)

    ts = [threading.Thread(target=reader) for _ in range(4)]
    for t in ts:
        t.start()
    start.wait()
    while not served:
        pass
    st.close()
    for t in ts:
        t.join()
    assert len(errors) == 4 and all("closed" in e for e in errors)
    for vs in served[-4:]:  # views served before the close stay readable
        assert [bytes(v.page) for v in vs] == [p.tobytes() for p in pages]


def test_close_is_not_starved_by_overlapping_lookups(tmp_path):
    # threads whose lookups overlap without a gap kept glibc's
    # reader-preferring rwlock read-held forever: close() waited for minutes
    # (or for ever) while thousands of calls went on. The lock prefers the
    # writer now: once close() waits, only the calls already in flight end.
    rc, out = run_child(f"""
        import threading, numpy as np, kvx
        from conftest import GEOM, seq_tokens, kv_pages
        st = kvx.Store.create({str(tmp_path / "s")!r}, **GEOM, nosync=True)
        toks = seq_tokens(0, 8); st.put(toks, kv_pages(st, 8)); st.flush()
        rows = np.tile(toks, 50)
        state = {{"closing": False, "during": 0, "calls": 0}}
        started = threading.Barrier(4)
        def reader():
            started.wait()
            while True:
                try:
                    st._c_prefix_loop(rows, len(toks), 10)  # a long call, the GIL released
                    st.verify()
                except ValueError:
                    return
                state["calls"] += 1
                if state["closing"]:
                    state["during"] += 1
        ts = [threading.Thread(target=reader) for _ in range(3)]
        for t in ts: t.start()
        started.wait()
        while state["calls"] < 6:
            pass
        state["closing"] = True
        st.close()
        for t in ts: t.join()
        print("DURING", state["during"])
    """, timeout=600)
    assert rc == 0 and "DURING" in out, out
    assert int(out.split("DURING")[1].split()[0]) <= 6, out


def test_close_while_threads_flush(tmp_path):
    # writers put and flush (the store's own batch, and a Batch each) while
    # the store is closed under them: every flush that returned is durable,
    # every call after the close raises, nothing else is seen
    d = str(tmp_path / "s")
    st = kvx.Store.create(d, **GEOM, nosync=True)
    acked, failed, lock = [], [], threading.Lock()
    go = threading.Barrier(4)

    def writer(base, own_batch):
        go.wait()
        b = st.batch() if own_batch else None
        try:
            for q in range(base, base + 10_000):
                t = seq_tokens(q, 2)
                try:
                    if b:
                        b.put(t, kv_pages(st, 2, seed=q))
                        b.flush()
                    else:
                        st.put(t, kv_pages(st, 2, seed=q))
                        st.flush()
                except (ValueError, kvx.Error) as e:
                    with lock:
                        failed.append(e)
                    return
                with lock:
                    acked.append(q)
        finally:
            if b:
                b.close()

    ts = [threading.Thread(target=writer, args=(1000 * (i + 1), i % 2 == 1)) for i in range(3)]
    for t in ts:
        t.start()
    go.wait()
    while len(acked) < 6:
        pass
    st.close()
    for t in ts:
        t.join()
    assert len(failed) == 3
    for e in failed:  # a closed store, a detached batch or the shared batch's dropped blocks: each named
        assert ("closed" in str(e)) or (isinstance(e, kvx.Error) and e.message), e
    st = kvx.Store.open(d)
    for q in acked:
        vs = st.prefix(seq_tokens(q, 2))
        assert [bytes(v) for v in vs] == [p.tobytes() for p in kv_pages(st, 2, seed=q)], q
    assert st.verify() == []
    st.close()


def test_close_from_two_threads(filled):
    st, _, _ = filled
    ts = [threading.Thread(target=st.close) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert st.closed


# ---- tokens ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [
    [-1] * 16, [2**32] * 16, [1.5] * 16, ["a"] * 16, [None] * 16, [2**70] * 16,
    np.full(16, -1, dtype=np.int64), np.full(16, 2**32, dtype=np.uint64),
    np.full(16, -1, dtype=np.int32), np.full(16, -7, dtype=np.int16),
])
def test_tokens_out_of_range_rejected(filled, bad):
    st, _, _ = filled
    with pytest.raises(ValueError, match="not a token id"):
        st.prefix(bad)
    with pytest.raises(ValueError, match="not a token id"):
        kvx.block_hashes(bad, B)


def test_int32_padding_token_is_not_2_32_minus_1(filled):
    # an int32 token array padded with -1 must not be read as id 2^32-1 (it
    # was, in place, while a list or an int64 array with -1 was refused)
    st, _, _ = filled
    t = np.full(B, 0xFFFFFFFF, dtype=np.uint32)
    st.put(t, kv_pages(st, 1, seed=9))
    st.flush()
    assert len(st.prefix(t)) == 1
    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        st.prefix(t.view(np.int32))
    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        st.get_block(t.view(np.int32))


@pytest.mark.parametrize("bad", [np.zeros(16, dtype=np.float32), np.zeros(16, dtype=">u4"), b"\x00" * 64,
                                 bytearray(64), 12345, None, object()])
def test_tokens_wrong_type_rejected(filled, bad):
    st, _, _ = filled
    with pytest.raises(TypeError, match="tokens"):
        st.prefix(bad)


def _lying_memoryview(data, itemsize):
    """(memoryview of bytearray data, format 'b', whose own Py_buffer says itemsize bytes an item, the address
    of that itemsize field), or None where this interpreter's layout is not found. A C exporter may report an
    integer format with itemsize 3, 5, 6 or 7; pure Python cannot make one (memoryview.cast, numpy, array and
    ctypes keep format and itemsize consistent), so the view's Py_buffer is patched through ctypes: its
    fields buf, obj, len, itemsize follow each other (Include/pybuffer.h)."""
    m = memoryview(data).cast("b")
    pin = (ctypes.c_char * len(data)).from_buffer(data)
    buf = ctypes.addressof(pin)
    del pin
    w = ctypes.sizeof(ctypes.c_size_t)
    for off in range(0, min(m.__sizeof__(), 512) - 4 * w + 1, w):
        f = (ctypes.c_size_t * 4).from_address(id(m) + off)
        if f[0] == buf and f[2] == len(data) and f[3] == 1:
            ctypes.c_ssize_t.from_address(id(m) + off + 3 * w).value = itemsize
            return m, id(m) + off + 3 * w
    m.release()
    return None


@pytest.mark.parametrize("itemsize", [3, 5, 6, 7])
def test_tokens_odd_integer_item_size_refused(filled, itemsize):
    # an integer buffer of itemsize 3/5/6/7 was read 8 bytes an item: n = len/itemsize items, 8*n bytes, past
    # the buffer's end (an ASan heap-buffer-overflow). Only sizes 1, 2, 4 and 8 are read.
    st, _, _ = filled
    got = _lying_memoryview(bytearray(24), itemsize)
    if got is None:
        pytest.skip("this interpreter's memoryview layout was not found")
    m, field = got
    try:
        assert m.itemsize == itemsize and m.format == "b"
        with pytest.raises(TypeError, match="tokens"):
            st.prefix(m)
        with pytest.raises(TypeError, match="tokens"):
            kvx.block_hashes(m, B)
    finally:
        ctypes.c_ssize_t.from_address(field).value = 1
        m.release()


@pytest.mark.parametrize("form", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
                                  "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q"])
def test_tokens_every_integer_item_size(form):
    # item sizes 1, 2, 4 and 8 (numpy dtypes, array module codes) all read as the same token ids
    want = kvx.block_hashes(np.arange(2 * B, dtype=np.uint32), B)
    toks = array.array(form, range(2 * B)) if isinstance(form, str) else np.arange(2 * B, dtype=form)
    assert kvx.block_hashes(toks, B) == want
    assert kvx.block_hashes(memoryview(toks), B) == want


def test_tokens_non_contiguous_and_odd_forms(filled):
    st, toks, pages = filled
    wide = np.repeat(toks, 2)
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        st.prefix(wide[::2])  # refused, never read with the wrong stride
    assert len(st.prefix(np.ascontiguousarray(wide[::2]))) == 4
    assert len(st.prefix(list(toks))) == 4  # numpy integer scalars
    assert len(st.prefix(toks.tolist())) == 4
    assert len(st.prefix(toks.astype(np.int64))) == 4
    assert len(st.prefix(tuple(int(x) for x in toks))) == 4
    assert st.prefix([]) == [] and st.prefix(np.zeros(0, np.uint32)) == []
    assert st.prefix(toks[: B - 1]) == []
    assert len(st.prefix(toks, max_views=2**62)) == 4
    assert st.prefix(toks, max_views=0) == []
    assert len(st.prefix(toks, max_views=None)) == 4  # the documented default (was a TypeError)
    with pytest.raises(ValueError, match="negative"):
        st.prefix(toks, max_views=-5)  # was: no limit
    with pytest.raises(OverflowError):
        st.prefix(toks, max_views=2**64)
    with pytest.raises(TypeError):
        st.prefix(toks, max_views=1.5)


def test_exception_inside_token_iterable_propagates(filled):
    st, _, _ = filled

    def gen():
        yield 1
        raise KeyError("from the caller's generator")

    with pytest.raises(KeyError, match="caller"):
        st.prefix(gen())
    with pytest.raises(KeyError, match="caller"):
        st.put(gen(), b"")


# ---- numbers that used to wrap ----------------------------------------------------


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


# ---- pages, scales, envelopes -------------------------------------------------------


def test_page_buffers_misuse(store):
    toks, pages = seq_tokens(1, 4), kv_pages(store, 4)
    raw = pages.tobytes()
    with pytest.raises(ValueError, match="whole number"):
        store.put(toks, raw[:-1])
    with pytest.raises(ValueError, match="whole number"):
        store.put(toks, raw + b"\x00")
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        store.put(toks, np.repeat(pages, 2, axis=0)[::2])  # non-contiguous: never read with the wrong stride
    with pytest.raises(TypeError):
        store.put(toks, 1234)
    with pytest.raises(TypeError):
        store.put(toks, "a str is no buffer")
    with pytest.raises(kvx.Error) as e:
        store.put(toks[: B + 1], raw)  # more pages than full blocks of tokens
    assert e.value.name == "KVX_ETOKENS" and "n_pages" in e.value.message
    with pytest.raises(ValueError, match="scales"):
        store.put(toks, raw, scales=b"\x00" * 3)
    # fp32 KV given to an fp16 store, with tokens for twice the blocks: was
    # cut into 8 "pages" of garbage stored under blocks 0..7's hashes
    long_toks = seq_tokens(1, 8)
    with pytest.raises(ValueError, match="4-byte elements"):
        store.put(long_toks, pages.astype(np.float32))
    assert store.prefix(long_toks) == []
    assert store.put(toks, b"") == 0
    # a float format must be the store's quant ('e' for fp16, little-endian): big-endian float16 has other
    # bytes (bf16 and the reverse: test_bf16.py test_float16_kv_refused_by_a_bf16_store)
    with pytest.raises(ValueError, match=r"format '>e' \(big-endian float16\), the store's quant is fp16"):
        store.put(toks, pages.astype(">f2"))
    assert store.prefix(toks) == []
    assert store.put(toks, pages.view(np.uint16)) == 4  # the store's element size as integer bits: passes
    store.flush()
    assert store.put(toks, memoryview(raw)) == 0  # raw bytes, read-only: fine (held already)
    store.flush()
    assert [bytes(v) for v in store.prefix(toks)] == [p.tobytes() for p in pages]


def test_scales_of_the_wrong_dtype(tmp_path):
    st = kvx.Store.create(str(tmp_path / "f8"), **dict(GEOM, quant="e4m3"), nosync=True)
    toks = seq_tokens(2, 2)
    pages = np.random.default_rng(1).integers(0, 0x7E, (2, st.page_bytes), dtype=np.uint8)
    ns = 2 * GEOM["num_layers"] * GEOM["kv_heads"]
    with pytest.raises(ValueError, match="not float32"):  # the right byte count, read as float32: garbage
        st.put(toks, pages, scales=np.full(2 * ns // 2, 0.5, dtype=np.float64))
    with pytest.raises(ValueError, match="not float32"):
        st.put(toks, pages, scales=np.full(2 * ns, 0.5, dtype=np.float64))
    with pytest.raises(ValueError, match="scales holds"):
        st.put(toks, pages, scales=np.full(2 * ns - 1, 0.5, dtype=np.float32))
    assert st.put(toks, pages, scales=np.full(2 * ns, 0.5, dtype=np.float32)) == 2
    st.flush()
    vs = st.prefix(toks)
    assert [list(v.scales) for v in vs] == [[0.5] * ns] * 2
    st.close()


def test_garbage_envelopes(filled):
    st, toks, _ = filled
    env = st.export(st.prefix(toks))
    rng = np.random.default_rng(5)
    bad = [b"", b"\x00", env[:-1], env[:40], env + b"\x00", bytes(len(env)),
           rng.integers(0, 256, len(env), dtype=np.uint8).tobytes()]
    hdr = bytearray(env)
    hdr[8:12] = b"\xff\xff\xff\xff"  # somewhere in the header: a huge count or dimension
    bad.append(bytes(hdr))
    for b in bad:
        with pytest.raises(kvx.Error) as e:
            st.put_envelope(b)
        assert e.value.code < 0 and e.value.message
    with pytest.raises(TypeError):
        st.put_envelope("str")
    assert st.put_envelope(env, toks) == 0  # the real one: held already


def test_export_refuses_foreign_and_released_views(tmp_path, filled):
    st, toks, _ = filled
    other = kvx.Store.create(str(tmp_path / "other"), num_layers=2, kv_heads=2, head_dim=8, block_tokens=16,
                             nosync=True)
    t2 = seq_tokens(3, 1)
    other.put(t2, kv_pages(other, 1))
    other.flush()
    ov = other.prefix(t2)
    with pytest.raises(kvx.ShapeError):
        st.export(ov)  # pages of another size: refused, never read at this store's size
    vs = st.prefix(toks)
    vs[1].release()
    with pytest.raises(ValueError, match="released"):
        st.export(vs)
    with pytest.raises(TypeError, match="not a kvx.View"):
        st.export([vs[0], b"x"])
    with pytest.raises(TypeError):
        st.export(5)
    good = st.prefix(toks)
    assert st.export(good, version=1) == st.export(good)
    for bad in (65537, -1, 2**32 + 1):  # 65537 was exported as version 1
        with pytest.raises(OverflowError):
            st.export(good, version=bad)
    with pytest.raises(kvx.Error) as e:
        st.export(good, version=9)
    assert e.value.name == "KVX_EVERSION"
    other.close()


def test_export_while_other_threads_release_and_mutate(filled):
    # export reads its views in C with the GIL released: a release() or a
    # change of the caller's list from another thread meanwhile must neither
    # free a view under it nor drop a View object it reads
    st, toks, pages = filled
    env = st.export(st.prefix(toks))
    stop = threading.Event()
    shared = st.prefix(toks)
    failures = []

    def churn():
        while not stop.is_set():
            vs = st.prefix(toks)
            shared[:] = vs
            for v in vs:
                v.release()

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(300):
            try:
                out = st.export(shared)
            except ValueError as e:  # a view released before the call took it
                assert "released" in str(e)
                continue
            if out != env:
                failures.append(len(out))
    finally:
        stop.set()
        t.join()
    assert not failures


# ---- keyed stores --------------------------------------------------------------------


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


# ---- batches ------------------------------------------------------------------------


def test_batch_with_block_raising_drops_its_blocks(store):
    toks, pages = seq_tokens(4, 2), kv_pages(store, 2)
    with pytest.raises(RuntimeError):
        with store.batch() as b:
            assert b.put(toks, pages) == 2
            raise RuntimeError("mid-batch")
    assert b.closed
    assert store.prefix(toks) == []
    with pytest.raises(ValueError, match="closed"):
        b.put(toks, pages)
    with pytest.raises(ValueError, match="closed"):
        b.__enter__()


def test_one_batch_shared_by_threads(store):
    # a kvx_store_batch belongs to one thread at a time: the binding's lock
    # serializes the threads, every block put is flushed exactly once
    b = store.batch()
    seqs = list(range(10, 18))

    def writer(q):
        t = seq_tokens(q, 3)
        assert b.put(t, kv_pages(store, 3, seed=q)) == 3
        b.flush()

    ts = [threading.Thread(target=writer, args=(q,)) for q in seqs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    b.close()
    for q in seqs:
        vs = store.prefix(seq_tokens(q, 3))
        assert [bytes(v) for v in vs] == [p.tobytes() for p in kv_pages(store, 3, seed=q)]


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


# ---- paths ----------------------------------------------------------------------------


def test_paths(tmp_path):
    with pytest.raises(ValueError, match="null"):
        kvx.Store.create(str(tmp_path / "a\x00b"), **GEOM)
    with pytest.raises(ValueError, match="null"):
        kvx.Store.open(b"/tmp/a\x00b")
    with pytest.raises(TypeError):
        kvx.Store.open(123)
    st = kvx.Store.create(os.fsencode(str(tmp_path / "bytes")), **GEOM, nosync=True)
    st.close()
    kvx.Store.open(tmp_path / "bytes").close()  # os.PathLike
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(kvx.Error) as e:
        kvx.Store.open(str(tmp_path / "file"))
    assert e.value.name == "ENOTDIR"
    with pytest.raises(kvx.Error) as e:
        kvx.Store.create(str(tmp_path / "file"), **GEOM)
    assert e.value.name == "EEXIST"
    os.mkfifo(str(tmp_path / "fifo"))
    with pytest.raises(kvx.Error) as e:
        kvx.Store.open(str(tmp_path / "fifo"))
    assert e.value.name == "ENOTDIR"
    with pytest.raises(kvx.Error):
        kvx.Store.open(str(tmp_path / "missing"))
    with pytest.raises(kvx.Error):
        kvx.Store.create(str(tmp_path / "bytes"), **GEOM)  # exists already


@pytest.mark.parametrize("name", ["STORE", "TIER"])
def test_fifo_in_store_dir_does_not_hang(tmp_path, name):
    # A FIFO planted as DIR/STORE hung Store.open for good (a blocking
    # open, GIL released, not interruptible). Now: STORE refuses with
    # EPATH; a TIER that is not a regular file is no tier for the handle,
    # never a failed open (docs/TIER.md). C: tests/test_recovery.c
    # test_fifo_where_store_files_belong.
    d = str(tmp_path / "s")
    kvx.Store.create(d, **GEOM, nosync=True).close()
    if os.path.exists(os.path.join(d, name)):
        os.rename(os.path.join(d, name), os.path.join(d, name + ".old"))
    os.mkfifo(os.path.join(d, name))
    try:
        rc, out = run_child(f"import kvx\ntry:\n    kvx.Store.open({d!r}, readonly=True).close()\n    print('OPEN')\n"
                            f"except kvx.Error as e:\n    print('ERR', e.name)\n", timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"Store.open hangs on a FIFO named {name}")
    assert rc == 0, out
    assert ("ERR KVX_EPATH" if name == "STORE" else "OPEN") in out, out


# ---- fork ------------------------------------------------------------------------------


def test_fork_child_cannot_use_or_close_the_parents_store(tmp_path):
    # kvx.h: a handle must not be used in a child. The child's calls raise,
    # and its close (or the garbage collection at its exit) forgets the
    # handles: closing them unlinked the parent's unflushed staging files,
    # persisted the parent's usage counters a second time and broke the
    # parent's LMDB reader slot (MDB_BAD_RSLOT).
    d = str(tmp_path / "s")
    st = kvx.Store.create(d, **GEOM, nosync=True)
    t0, p0 = seq_tokens(0, 4), kv_pages(st, 4)
    t1, p1 = seq_tokens(1, 4), kv_pages(st, 4, seed=1)
    st.put(t0, p0)
    st.flush()
    for _ in range(5):
        st.prefix(t0)
    hits = st.stat()["hits"]
    b = st.batch()
    b.put(t1, p1)  # unflushed, in staging/
    st.put(t0[: 2 * B], p0[:2])  # held already: nothing new
    held = st.prefix(t0)[0]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            msgs = []
            for call in (lambda: st.prefix(t0), lambda: st.flush(), lambda: b.flush(), lambda: st.stat()):
                try:
                    call()
                    msgs.append("no error")
                except ValueError as e:
                    msgs.append(str(e))
            assert bytes(held) == p0[0].tobytes()  # a view's mapping is the child's too
            b.close()
            st.close()
            os.write(w, "|".join(msgs).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    msgs = os.read(r, 4096).decode().split("|")
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert len(msgs) == 4 and all("fork" in m for m in msgs), msgs
    b.flush()
    assert len(st.prefix(t1)) == 4
    st.close()
    st = kvx.Store.open(d)
    assert [bytes(v) for v in st.prefix(t1)] == [p.tobytes() for p in p1]
    assert st.stat()["hits"] == hits + 12  # the parent's counts (3 more prefixes of 4), persisted once
    assert st.verify() == []
    st.close()


def test_fork_child_exiting_normally_leaves_parent_intact(tmp_path):
    # the child does nothing: its interpreter's exit collects the handles
    rc, out = run_child(f"""
        import os, sys, kvx
        from conftest import GEOM, seq_tokens, kv_pages
        st = kvx.Store.create({str(tmp_path / "s")!r}, **GEOM, nosync=True)
        t = seq_tokens(1, 3); b = st.batch(); b.put(t, kv_pages(st, 3))
        st.put(seq_tokens(2, 2), kv_pages(st, 2, seed=2))
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        b.flush(); st.flush()
        assert len(st.prefix(t)) == 3 and len(st.prefix(seq_tokens(2, 2))) == 2
        print("OK")
    """)
    assert rc == 0 and "OK" in out, out


# ---- engine adapters -------------------------------------------------------------------


class _StridedHostTensor:
    """What the SGLang adapter gets for a non-contiguous CPU tensor whose .numpy() fails (bf16, the usual KV
    dtype, or one that requires grad): data_ptr/numel/element_size of an expanded view, 64 bytes of storage
    that claim 4096 elements of 2 bytes."""

    class device:
        type = "cpu"

    def __init__(self, backing):
        import ctypes
        self._backing = backing
        self._addr = ctypes.addressof(backing)

    def numpy(self):
        raise TypeError("Got unsupported ScalarType BFloat16")

    def data_ptr(self):
        return self._addr

    def numel(self):
        return 4096

    def element_size(self):
        return 2

    def is_contiguous(self):
        return False

    def stride(self):
        return (0,)


def test_sglang_refuses_a_non_contiguous_pointer_tensor(tmp_path):
    # kvx/integrations/sglang.py _as_buffer's data_ptr() path (a CPU tensor whose .numpy() fails: bf16,
    # requires_grad) took numel * element_size bytes from data_ptr without is_contiguous(): an expanded or
    # strided tensor was stored as wrong KV, and get wrote past its storage.
    import ctypes
    from kvx.integrations.sglang import KvxHiCacheStorage
    from sglang_driver import storage_config
    e = {"path": str(tmp_path / "sg"), "page_bytes": 8192, "capacity": "64MiB", "nosync": True}
    s = KvxHiCacheStorage(storage_config(e), {})
    try:
        assert s.set("k", bytes(range(256)) * 32)
        backing = (ctypes.c_ubyte * 8192)()
        ctypes.memset(backing, 0xAB, 8192)
        with pytest.raises(kvx.InvalidError, match="contiguous"):
            s.get("k", target_location=_StridedHostTensor(backing))
        assert bytes(backing[64:]) == b"\xab" * (8192 - 64), "get wrote past the tensor's storage"
        with pytest.raises(kvx.InvalidError, match="contiguous"):
            s.set("k2", _StridedHostTensor(backing))
    finally:
        s.close()
