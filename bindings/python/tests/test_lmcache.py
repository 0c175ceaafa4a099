"""Contract tests of kvx.integrations.lmcache.KvxConnector, LMCache's L2
"native_plugin" connector, driven by lmcache_driver (a reproduction of
LMCache's native_plugin loader and NativeConnectorL2Adapter at the commits
docs/ENGINES.md names) and by the raw protocol: submit, wait on the eventfd,
drain, per-key masks."""
import os
import pathlib
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import kvx
from conftest import needs_numpy, np, rand_bytes
from kvx.integrations.lmcache import KvxConnector
from lmcache_driver import ObjectKey, load_native_plugin, object_key_to_string, wait_fd, wait_result, wait_store

PB = 16384  # page_bytes of the tests' stores


def chunk_keys(n, model="meta-llama/Llama-3.1-8B", rank=0, salt=""):
    return [ObjectKey(model, rank, 0, (i * 2654435761 % 2 ** 64).to_bytes(8, "little") * 4, salt) for i in range(n)]


def chunks(n, seed=0, size=PB):
    return [rand_bytes(seed + i, size) for i in range(n)]


def config(path, **params):
    p = {"path": str(path), "page_bytes": PB, "capacity": "64MiB", "nosync": True}
    p.update(params)
    return {"type": "native_plugin", "module_path": "kvx.integrations.lmcache", "class_name": "KvxConnector",
            "adapter_params": p}


def drain_until(conn, fids, timeout=10.0):
    """The raw protocol: poll the connector's eventfd, drain, until every future id in fids completed."""
    got = {}
    end = time.monotonic() + timeout
    p = select.poll()
    p.register(conn.event_fd(), select.POLLIN)
    while set(fids) - set(got):
        left = end - time.monotonic()
        assert left > 0, f"futures {set(fids) - set(got)} never completed"
        if p.poll(int(min(left, 0.5) * 1000)):
            for c in conn.drain_completions():
                assert isinstance(c, tuple) and len(c) == 4
                assert c[0] not in got, "a future completed twice"
                got[c[0]] = c
    return got


def run_py(code, env_extra=None, timeout=60):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture
def adapter(tmp_path):
    a = load_native_plugin(config(tmp_path / "l2"))
    yield a
    a.close()


# PROMISE: ENGINE-1
def test_native_plugin_config_loads(tmp_path):
    """The issue's config line loads through the native_plugin factory; the store is created on first use in
    path/rank0 and reopened after a restart."""
    cfg = config(tmp_path / "l2")
    a = load_native_plugin(cfg)
    assert isinstance(a.client, KvxConnector)
    assert a.client.dir == str(tmp_path / "l2" / "rank0")
    assert os.path.isdir(a.client.dir) and a.client.page_bytes == PB
    a.close()
    b = load_native_plugin(cfg)  # reopened, not created again
    b.close()
    for m in ("event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists", "submit_batch_delete",
              "drain_completions", "close"):
        assert callable(getattr(KvxConnector, m))


# PROMISE: ENGINE-5
def test_store_lookup_load_through_adapter(adapter):
    keys, data = chunk_keys(64), chunks(64)
    t = adapter.submit_store_task(keys, data)
    ok, nbytes, err = wait_store(adapter, t)
    assert ok and nbytes == 64 * PB and err == ""
    t = adapter.submit_lookup_and_lock_task(keys)
    assert wait_result(adapter.lookup_efd, adapter.query_lookup_and_lock_result, t) == [True] * 64
    out = [bytearray(PB) for _ in range(64)]
    t = adapter.submit_load_task(keys, out)
    assert wait_result(adapter.load_efd, adapter.query_load_result, t) == [True] * 64
    for a, b in zip(out, data):
        assert a == b
    assert adapter.unknown == []


# PROMISE: ENGINE-4
def test_partial_misses_leave_buffers_untouched(adapter):
    keys, data = chunk_keys(6), chunks(6, seed=10)
    t = adapter.submit_store_task(keys[0::2], data[0::2])
    assert wait_store(adapter, t)[0]
    t = adapter.submit_lookup_and_lock_task(keys)
    assert wait_result(adapter.lookup_efd, adapter.query_lookup_and_lock_result, t) == [True, False] * 3
    out = [bytearray(b"\xa5" * PB) for _ in range(6)]
    t = adapter.submit_load_task(keys, out)
    assert wait_result(adapter.load_efd, adapter.query_load_result, t) == [True, False] * 3
    for i in range(6):
        if i % 2 == 0:
            assert out[i] == data[i]
        else:
            assert out[i] == bytearray(b"\xa5" * PB)  # a miss: its buffer untouched


# PROMISE: ENGINE-2
def test_raw_protocol_eventfd_drain_masks(tmp_path):
    """submit -> the eventfd becomes readable -> drain_completions gives (future_id, ok, error, bools|None):
    ids from 1, increasing; set: None; get/exists/delete: per-key bools. Drained, the fd is quiet."""
    c = KvxConnector(path=str(tmp_path / "raw"), page_bytes=PB, capacity="64MiB", nosync=True)
    try:
        fd = c.event_fd()
        assert isinstance(fd, int) and fd >= 0
        keys = ["k0", "k1", b"k2"]
        data = chunks(3, seed=20)
        f1 = c.submit_batch_set(keys[:2], [memoryview(d) for d in data[:2]])
        assert f1 == 1
        got = drain_until(c, [f1])
        assert got[f1] == (f1, True, "", None)
        out = [bytearray(PB) for _ in range(3)]
        f2 = c.submit_batch_get(keys, [memoryview(b) for b in out])
        f3 = c.submit_batch_exists(keys)
        assert f3 > f2 > f1
        got = drain_until(c, [f2, f3])
        assert got[f2] == (f2, True, "", [True, True, False])
        assert got[f3] == (f3, True, "", [True, True, False])
        assert bytes(out[1]) == bytes(data[1]) and out[2] == bytearray(PB)
        f4 = c.submit_batch_delete(["k1", "k2"])
        assert drain_until(c, [f4])[f4] == (f4, True, "", [True, False])
        f5 = c.submit_batch_exists(keys)
        assert drain_until(c, [f5])[f5][3] == [True, False, False]
        assert select.select([fd], [], [], 0.05)[0] == [] and c.drain_completions() == []
    finally:
        c.close()


# PROMISE: ENGINE-3
def test_set_ok_is_durable_across_a_crash(tmp_path):
    """A restart between set and get: another process sets, sees ok, and dies without closing (os._exit);
    this process reopens the same directory and gets every page back."""
    path = str(tmp_path / "crash")
    r = run_py(f"""
        import os, random, select
        from kvx.integrations.lmcache import KvxConnector
        c = KvxConnector(path={path!r}, page_bytes={PB}, capacity="64MiB")
        data = [bytearray(random.Random(100 + i).randbytes({PB})) for i in range(8)]
        data.append(bytearray(x % 256 for x in range(1000)))   # a partial last chunk
        f = c.submit_batch_set(["chunk%d" % i for i in range(9)], [memoryview(d) for d in data])
        select.select([c.event_fd()], [], [], 30)
        assert c.drain_completions() == [(f, True, "", None)]
        os._exit(0)  # no close: the completion alone promised durability
    """)
    assert r.returncode == 0, r.stderr
    c = KvxConnector(path=path, page_bytes=PB, capacity="64MiB")
    try:
        out = [bytearray(PB) for _ in range(8)] + [bytearray(1000)]
        f = c.submit_batch_get(["chunk%d" % i for i in range(9)], [memoryview(b) for b in out])
        assert drain_until(c, [f])[f][3] == [True] * 9
        for i in range(8):
            assert bytes(out[i]) == bytes(rand_bytes(100 + i, PB))
        assert bytes(out[8]) == bytes(x % 256 for x in range(1000))
    finally:
        c.close()


# PROMISE: ENGINE-3
def test_set_ok_only_after_its_flush(tmp_path, monkeypatch):
    """What the crash test above cannot tell (os._exit keeps the page cache, so written and durable look the
    same): a set's completion is posted only after its batch's flush returned, and the store is opened with
    its syncs (nosync False) unless asked otherwise."""
    from kvx.integrations import _common
    opened = {}
    real_open = _common.open_keyed_store

    def spy_open(*a, **kw):
        opened.update(kw)
        return real_open(*a, **kw)

    monkeypatch.setattr(_common, "open_keyed_store", spy_open)
    c = KvxConnector(path=str(tmp_path / "order"), page_bytes=PB, capacity="64MiB")
    log = []

    class BatchSpy:
        def __init__(self, b):
            self.b = b

        def keyed_put(self, *a):
            log.append("put")
            return self.b.keyed_put(*a)

        def flush(self):
            # nothing of this set may be completed before its flush returns
            log.append("completion before flush" if select.select([c.event_fd()], [], [], 0)[0] else "flush")
            time.sleep(0.2)
            r = self.b.flush()
            log.append("flushed")
            return r

        def __getattr__(self, name):
            return getattr(self.b, name)

    class StoreSpy:
        def __init__(self, st):
            self.st = st

        def batch(self):
            return BatchSpy(self.st.batch())

        def __getattr__(self, name):
            return getattr(self.st, name)

    try:
        assert opened.get("nosync") is False
        c._store = StoreSpy(c._store)
        data = chunks(3, seed=60)
        f = c.submit_batch_set([f"o{i}" for i in range(3)], [memoryview(d) for d in data])
        assert drain_until(c, [f])[f][1] is True
        assert log == ["put", "flush", "flushed"], log
    finally:
        c.close()


# PROMISE: ENGINE-7
def test_close_with_work_in_flight(tmp_path):
    """close() while sets and gets are queued: it returns, no worker is left, nothing completes after it, no
    buffer is touched after it, the directory is free for the next process, and every page that reached the
    store is whole."""
    path = str(tmp_path / "busy")
    c = KvxConnector(path=path, page_bytes=PB, capacity="256MiB", nosync=True, num_workers=2)
    data = chunks(8, seed=30)
    sets, gets, outs = [], [], []
    for b in range(40):
        sets.append(c.submit_batch_set([f"b{b}-{i}" for i in range(8)], [memoryview(d) for d in data]))
        o = [bytearray(PB) for _ in range(8)]
        outs.append(o)
        gets.append(c.submit_batch_get([f"b{max(b - 1, 0)}-{i}" for i in range(8)], [memoryview(x) for x in o]))
    c.close()
    assert not any(t.is_alive() for t in c._workers)
    assert c.event_fd() == -1 and c.drain_completions() == []
    with pytest.raises(ValueError):
        c.submit_batch_exists(["b0-0"])
    snap = [bytes(x) for o in outs for x in o]
    time.sleep(0.2)
    assert snap == [bytes(x) for o in outs for x in o]  # nothing writes after close
    c.close()  # idempotent
    with kvx.Store.open(os.path.join(path, "rank0"), nowait=True) as st:  # lock released
        for b in range(40):
            views = st.keyed_get([f"b{b}-{i}" for i in range(8)])
            held = [v is not None for v in views]
            for i, v in enumerate(views):
                if v is not None:
                    assert bytes(v) == bytes(data[i])
            assert all(held) or not any(held)  # one set is one flush: all of its pages or none


# PROMISE: ENGINE-5
def test_concurrent_submitters(adapter):
    """Four threads store and load their own chunks through one adapter at once; every task completes, with
    the right bytes, and the demux never sees an unknown future id."""
    errors = []

    def worker(w):
        try:
            keys = chunk_keys(16, model=f"m{w}")
            data = chunks(16, seed=1000 * w)
            for rnd in range(3):
                t = adapter.submit_store_task(keys, data)
                assert wait_store(adapter, t)[0]
                out = [bytearray(PB) for _ in keys]
                t = adapter.submit_load_task(keys, out)
                assert wait_result(adapter.load_efd, adapter.query_load_result, t) == [True] * 16
                assert all(a == b for a, b in zip(out, data))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert adapter.unknown == []


# PROMISE: ENGINE-2
def test_concurrent_raw_submitters_unique_ids(tmp_path):
    c = KvxConnector(path=str(tmp_path / "ids"), page_bytes=PB, capacity="64MiB", nosync=True, num_workers=3)
    ids, mu = [], threading.Lock()

    def sub(w):
        for i in range(25):
            f = c.submit_batch_exists([f"w{w}-{i}"])
            with mu:
                ids.append(f)

    try:
        ts = [threading.Thread(target=sub, args=(w,)) for w in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(ids) == list(range(1, 101))
        got = drain_until(c, ids)
        assert all(v[1] and v[3] == [False] for v in got.values())
    finally:
        c.close()


# PROMISE: ENGINE-6
def test_forked_child_is_refused_never_hangs(tmp_path):
    """A forked child's copy of a connector raises ValueError on a submission, drains nothing and closes as a
    no-op, without its lock (a parent thread may have held it at the fork: an attack found 17 of 40 children
    hung in _submit); the parent goes on byte for byte."""
    c = KvxConnector(path=str(tmp_path / "fork"), page_bytes=PB, capacity="64MiB", nosync=True)
    page = rand_bytes(3, PB)
    f = c.submit_batch_set(["k"], [memoryview(page)])
    assert drain_until(c, [f])[f][1]
    c._mu.acquire()  # held at the fork, as by a parent thread inside a submission
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(10)
            try:
                c.submit_batch_get(["k"], [memoryview(bytearray(PB))])
            except ValueError as e:
                code = 0 if "fork" in str(e) else 2
            if c.drain_completions() != []:
                code = 3
            c.close()
        finally:
            os._exit(code)
    c._mu.release()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    out = bytearray(PB)
    f = c.submit_batch_get(["k"], [memoryview(out)])
    assert drain_until(c, [f])[f][3] == [True] and bytes(out) == page
    c.close()


# PROMISE: ENGINE-4, ENGINE-6
def test_wrong_sizes_and_bad_keys_refused(tmp_path):
    """Refused at submission with kvx.InvalidError (code KVX_EINVALID), nothing queued: an empty list, an empty
    key or one longer than page_bytes, a key in the store's own b"\\x00kvx-" space, a key neither str nor bytes,
    a page of 0 or more than page_bytes bytes, counts that differ, a read-only buffer to get into. A get whose
    buffer differs in length from the page: False, untouched."""
    c = KvxConnector(path=str(tmp_path / "bad"), page_bytes=PB, capacity="64MiB", nosync=True)
    page = memoryview(bytearray(PB))
    released = memoryview(bytearray(PB))
    released.release()
    bad = [
        lambda: c.submit_batch_set([], []),
        lambda: c.submit_batch_exists([]),
        lambda: c.submit_batch_set([""], [page]),
        lambda: c.submit_batch_set(["x" * (PB + 1)], [page]),  # a key longer than a page (long keys: its own page)
        lambda: c.submit_batch_set([b"\x00kvx-lk\x00" + b"d" * 32], [page]),  # the store's own keys
        lambda: c.submit_batch_get([b""], [page]),
        lambda: c.submit_batch_exists([12]),
        lambda: c.submit_batch_delete(["ok", None]),
        lambda: c.submit_batch_set(["big"], [memoryview(bytearray(PB + 1))]),
        lambda: c.submit_batch_set(["empty"], [memoryview(bytearray(0))]),
        lambda: c.submit_batch_set(["a", "b"], [page]),
        lambda: c.submit_batch_get(["a"], [memoryview(bytes(PB))]),
        lambda: c.submit_batch_exists("one-key-not-a-list"),
        # None for either list, a released buffer (an attack found TypeError and ValueError escaping here)
        lambda: c.submit_batch_exists(None),
        lambda: c.submit_batch_set(["k"], None),
        lambda: c.submit_batch_set(["k"], [released]),
    ]
    small = KvxConnector(path=str(tmp_path / "small"), page_bytes=100, capacity="64MiB", nosync=True)
    # a key over a 100-byte page, in a list (the bulk path; an attack found it took keys up to 255 bytes there)
    bad += [lambda: small.submit_batch_exists(["x" * 200]), lambda: small.submit_batch_exists([b"x" * 101])]
    try:
        for i, call in enumerate(bad):
            with pytest.raises(kvx.InvalidError) as e:
                call()
            assert e.value.code == kvx.EINVALID and e.value.name == "KVX_EINVALID", i
        assert c.drain_completions() == [] and small.drain_completions() == []
        small.close()
        assert select.select([c.event_fd()], [], [], 0.05)[0] == []
        ok = c.submit_batch_set(["x" * 255, "y"], [page, memoryview(bytearray(100))])  # 255 bytes: a key
        assert ok == 1  # the refused submissions took no future id
        assert drain_until(c, [ok])[ok][1]
        short = bytearray(b"\x5a" * (PB - 1))
        f = c.submit_batch_get(["y", "x" * 255], [memoryview(bytearray(100)), memoryview(short)])
        assert drain_until(c, [f])[f] == (f, True, "", [True, False])
        assert short == bytearray(b"\x5a" * (PB - 1))
    finally:
        c.close()


# PROMISE: ENGINE-21
def test_key_not_utf8_refused_naming_it(tmp_path):
    """A str key holding a lone surrogate (not UTF-8 text) is refused at submission with kvx.InvalidError naming
    the key, nothing queued, in every call; it raised UnicodeEncodeError from the key's encoding."""
    c = KvxConnector(path=str(tmp_path / "u"), page_bytes=PB, capacity="64MiB", nosync=True)
    page = memoryview(bytearray(PB))
    try:
        for call in (lambda k: c.submit_batch_set(["ok", k], [page, page]),
                     lambda k: c.submit_batch_get(["ok", k], [page, page]),
                     lambda k: c.submit_batch_exists(["ok", k]), lambda k: c.submit_batch_delete(["ok", k])):
            with pytest.raises(kvx.InvalidError, match=r"keys\[1\] is not UTF-8 text"):
                call("chunk\udc80")
        assert c.drain_completions() == []
    finally:
        c.close()


# PROMISE: ENGINE-8
def test_second_process_same_dir_busy(tmp_path):
    """One store per process: a second process on the same directory gets KVX_EBUSY at once; another rank
    (another directory) opens."""
    path = str(tmp_path / "shared")
    c = KvxConnector(path=path, page_bytes=PB, capacity="64MiB", nosync=True)
    try:
        code = f"""
            import time, kvx
            from kvx.integrations.lmcache import KvxConnector
            t = time.monotonic()
            try:
                KvxConnector(path={path!r}, page_bytes={PB}, capacity="64MiB")
            except kvx.BusyError as e:
                print(e.code == kvx.EBUSY, e.name, round(time.monotonic() - t, 3))
        """
        r = run_py(code)
        assert r.returncode == 0, r.stderr
        ok, name, secs = r.stdout.split()
        assert ok == "True" and name == "KVX_EBUSY" and float(secs) < 5
        r = run_py(code.replace("KvxConnector(path=", "KvxConnector(rank=1, path="))
        assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
        assert os.path.isdir(os.path.join(path, "rank1"))
    finally:
        c.close()


# PROMISE: ENGINE-1
def test_rank_directory_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("KVX_RANK", "3")
    c = KvxConnector(path=str(tmp_path / "a"), page_bytes=PB, capacity="64MiB", nosync=True)
    assert c.dir == str(tmp_path / "a" / "rank3")
    c.close()
    c = KvxConnector(path=str(tmp_path / "b-{rank}"), page_bytes=PB, capacity="64MiB", rank=7, nosync=True)
    assert c.dir == str(tmp_path / "b-rank7")
    c.close()
    c = KvxConnector(path=str(tmp_path / "c"), page_bytes=PB, capacity="64MiB", per_rank_path=True, nosync=True)
    assert c.dir == str(tmp_path / "c")
    c.close()


# PROMISE: ENGINE-8
def test_reopen_with_another_page_size_refused(tmp_path):
    KvxConnector(path=str(tmp_path / "p"), page_bytes=PB, capacity="64MiB", nosync=True).close()
    with pytest.raises(kvx.ShapeError) as e:
        KvxConnector(path=str(tmp_path / "p"), page_bytes=2 * PB, capacity="64MiB", nosync=True)
    assert e.value.code == kvx.ESHAPE
    c = KvxConnector(path=str(tmp_path / "p"), capacity="64MiB", nosync=True)  # page size from the store
    assert c.page_bytes == PB
    c.close()


# PROMISE: ENGINE-5
def test_delete_through_adapter(adapter):
    keys, data = chunk_keys(4, salt="tenant-a"), chunks(4, seed=40)
    assert object_key_to_string(keys[0]).endswith("@tenant-a")
    assert wait_store(adapter, adapter.submit_store_task(keys, data))[0]
    adapter.delete(keys[:2])
    t = adapter.submit_lookup_and_lock_task(keys)
    assert wait_result(adapter.lookup_efd, adapter.query_lookup_and_lock_result, t) == [False, False, True, True]


def damage_page(store_dir, page):
    """Flips one byte of page's copy in the closed store's shard files; the number of copies damaged."""
    n = 0
    for sh in sorted((pathlib.Path(store_dir) / "shards").iterdir()):
        data = sh.read_bytes()
        at = data.find(page)
        if at >= 0:
            with open(sh, "r+b") as f:
                f.seek(at + 100)
                f.write(bytes([data[at + 100] ^ 0xFF]))
            n += 1
    return n


# PROMISE: ENGINE-9
def test_delete_reports_damaged_pages_deleted(tmp_path):
    """submit_batch_delete's bools mean "deleted" (connector_base.h): a key whose only page fails its CRC is
    not held (exists: False) but the owner's delete removes it, so it is reported True (it was False: the
    answer was "held and sound", an exists before the delete). A key never stored is False."""
    keys, data = ["damaged", "sound", "never"], chunks(2, seed=70)
    c = KvxConnector(path=str(tmp_path / "del"), page_bytes=PB, capacity="64MiB", nosync=True)
    f = c.submit_batch_set(keys[:2], [memoryview(d) for d in data])
    assert drain_until(c, [f])[f] == (f, True, "", None)
    d = c.dir
    c.close()
    assert damage_page(d, bytes(data[0])) == 1
    c = KvxConnector(path=str(tmp_path / "del"), page_bytes=PB, capacity="64MiB", nosync=True)
    try:
        f = c.submit_batch_exists(keys)
        assert drain_until(c, [f])[f] == (f, True, "", [False, True, False])  # damaged: not held
        f = c.submit_batch_delete(keys)
        assert drain_until(c, [f])[f] == (f, True, "", [True, True, False])
        f = c.submit_batch_delete(keys)  # nothing left to delete
        assert drain_until(c, [f])[f] == (f, True, "", [False, False, False])
    finally:
        c.close()
    with kvx.Store.open(d) as st:  # the damaged copy is gone from the index too
        assert st.keyed_delete(keys) == 0


# PROMISE: ENGINE-2
def test_eventfd_wakes_a_blocked_poller(tmp_path):
    """A thread blocked in poll() on event_fd wakes when a completion is posted (no polling loop needed)."""
    c = KvxConnector(path=str(tmp_path / "wake"), page_bytes=PB, capacity="64MiB", nosync=True)
    try:
        woke = []
        t = threading.Thread(target=lambda: woke.append(wait_fd(c.event_fd(), 10) or True))
        t.start()
        time.sleep(0.05)
        f = c.submit_batch_exists(["nothing"])
        t.join(10)
        assert woke == [True]
        assert c.drain_completions() == [(f, True, "", [False])]
    finally:
        c.close()



@needs_numpy
def test_numpy_chunks_through_adapter(adapter):
    """numpy uint8 arrays as the chunks stored and the buffers loaded into (LMCache's memory objects reach
    the connector as buffers; numpy is one exporter of them)."""
    keys = chunk_keys(4, model="np")
    data = [np.frombuffer(bytes(rand_bytes(200 + i, PB)), dtype=np.uint8) for i in range(4)]
    assert wait_store(adapter, adapter.submit_store_task(keys, data))[0]
    out = [np.zeros(PB, np.uint8) for _ in keys]
    t = adapter.submit_load_task(keys, out)
    assert wait_result(adapter.load_efd, adapter.query_load_result, t) == [True] * 4
    assert all(np.array_equal(a, b) for a, b in zip(out, data))
