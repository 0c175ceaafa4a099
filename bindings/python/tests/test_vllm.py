"""kvx.integrations.vllm.KvxSecondaryTier driven as vLLM's tiering manager
drives a secondary tier (vllm_driver.py: the factory's out-of-tree loading,
store and promotion jobs, per-key lookups with RETRY, get_finished_jobs,
take_events), over a bytearray primary view. docs/ENGINES.md, "vLLM"."""
import ctypes
import errno
import os
import threading
import time

import pytest

import kvx
from conftest import damage_page, run_child
from kvx.integrations import _common
from kvx.integrations import vllm as kv
from vllm_driver import LookupResult, Manager, Primary, S, create_secondary_tier, key, make_spec, tier_config

SLOT = 8192
HIT, MISS = LookupResult.HIT, LookupResult.MISS


def tier(path, primary=None, spec=None, **kw):
    kw.setdefault("nosync", True)
    kw.setdefault("revision", "r1")
    p = primary or Primary(64, SLOT)
    t = create_secondary_tier(tier_config(path, **kw), p.view, spec or make_spec())
    return t, p, Manager(t)


def fill(p, slots, seed0=0):
    for s in slots:
        p.fill(s, seed0 + s)


# PROMISE: PY-13
def test_factory_builds_the_tier_from_the_config_block(tmp_path):
    """The documented config block loads through the factory: a SecondaryTierManager subclass of medium STORAGE,
    its page the primary slot, its store under path named by the namespace, opened as the writer."""
    t, p, m = tier(tmp_path, capacity="64MiB", enable_kv_events=False, locality="LOCAL")
    try:
        assert isinstance(t, kv._Base) and t.medium == kv.Medium.STORAGE and t.tier_type == "KvxSecondaryTier"
        assert t.block_size_bytes == SLOT and t.locality == kv.Locality.LOCAL
        assert t.role == "writer" and os.path.dirname(t.dir) == str(tmp_path)
        assert os.path.basename(t.dir) == f"Qwen-Qwen3-8B_dp0_{t.namespace[0]}"
        assert t.on_new_request(S.ReqContext("r")).policy.value == "chunk_level"
        assert not t.supports_lazy_promotion_allocation() and not t.has_pending_work()
        assert t.get_stats() is None and type(t).build_metric_definitions({}) == {}
    finally:
        t.shutdown()
    with pytest.raises(TypeError):  # a misspelt option fails the launch, naming it
        tier(tmp_path, capacty="1GiB")
    with pytest.raises(ValueError, match="capacity"):
        tier(tmp_path / "x", capacity="lots")


# PROMISE: PY-13
def test_store_lookup_load_round_trip(tmp_path):
    """Store jobs read the primary slots; a key's first lookup is RETRY, then HIT (stored) or MISS; a load job
    writes each stored chunk into another slot byte for byte."""
    t, p, m = tier(tmp_path)
    try:
        fill(p, range(16))
        keys = [key(i) for i in range(16)]
        r = m.store(keys, range(16))
        assert r.success and r.transfer_bytes == 16 * SLOT and r.transfer_time >= 0
        ctx = S.ReqContext("first")
        assert t.lookup(keys[0], ctx) is LookupResult.RETRY  # in flight until the step ends
        assert m.lookup(keys + [key(99)]) == [HIT] * 16 + [MISS]
        r = m.load(keys, range(32, 48))
        assert r.success and r.transfer_bytes == 16 * SLOT
        assert all(p.get(32 + i) == p.get(i) for i in range(16))
        st = t.kvx_stats()
        assert st["chunks_stored"] == 16 and st["chunks_loaded"] == 16 and st["lookup_batches"] >= 1
        t.on_request_finished(ctx)
    finally:
        t.shutdown()


# PROMISE: PY-13
def test_partial_load_names_its_successful_keys(tmp_path):
    """A load of stored and missing keys fails with successful_keys = the loaded ones (a subset of the job's),
    a missing key's slot untouched; a later lookup of the missing key is a MISS."""
    t, p, m = tier(tmp_path)
    try:
        fill(p, range(4))
        m.store([key(i) for i in range(4)], range(4))
        p.buf[40 * SLOT:41 * SLOT] = b"\xee" * SLOT
        keys = [key(0), key(1), key(77), key(3)]
        r = m.load(keys, [10, 11, 40, 13])
        assert not r.success and set(r.successful_keys) == {key(0), key(1), key(3)}
        assert p.get(40) == b"\xee" * SLOT and p.get(10) == p.get(0) and p.get(13) == p.get(3)
        r = m.load([key(78)], [41])
        assert not r.success and r.successful_keys is None  # none loaded
        assert t.kvx_stats()["loads_partial"] == 1
    finally:
        t.shutdown()


# PROMISE: PY-14
def test_restart_every_stored_key_hits_byte_identical(tmp_path):
    """Close, re-create on the same path: every stored key HITs and loads byte-identical."""
    t, p, m = tier(tmp_path)
    fill(p, range(48))
    keys = [key(i, group=i % 2) for i in range(48)]
    for j in range(0, 48, 8):
        assert m.store(keys[j:j + 8], range(j, j + 8)).success
    want = [p.get(i) for i in range(48)]
    d = t.dir
    t.shutdown()
    t, p, m = tier(tmp_path, primary=Primary(64, SLOT))
    try:
        assert t.dir == d
        assert m.lookup(keys) == [HIT] * 48
        assert m.load(keys, range(48)).success
        assert [p.get(i) for i in range(48)] == want
    finally:
        t.shutdown()


# PROMISE: PY-14
def test_acknowledged_store_survives_the_process_killed(tmp_path):
    """Another process stores through the tier; once get_finished_jobs says success it dies (os._exit, no
    shutdown); this process re-creates the tier and loads every acknowledged chunk byte-identical."""
    rc, out = run_child(f"""
        import os
        from vllm_driver import Manager, Primary, create_secondary_tier, key, make_spec, tier_config
        p = Primary(64, {SLOT})
        t = create_secondary_tier(tier_config({str(tmp_path)!r}, revision="r1"), p.view, make_spec())
        m = Manager(t)
        for i in range(32):
            p.fill(i, i)
        ids = [m.submit_store([key(i) for i in range(j, j + 4)], range(j, j + 4)) for j in range(0, 32, 4)]
        assert all(r.success for r in m.wait(ids))
        print("acknowledged", flush=True)
        os._exit(0)
    """)
    assert rc == 0 and "acknowledged" in out, out
    t, p, m = tier(tmp_path, nosync=False)
    try:
        keys = [key(i) for i in range(32)]
        assert m.lookup(keys) == [HIT] * 32
        assert m.load(keys, range(32, 64)).success
        ref = Primary(32, SLOT)
        fill(ref, range(32))
        assert all(p.get(32 + i) == ref.get(i) for i in range(32))
    finally:
        t.shutdown()


# PROMISE: PY-15
def test_eviction_reports_removed_events_and_only_those(tmp_path):
    """A full store evicts; with enable_kv_events (and vLLM's KV events on) the keys kvx's eviction removed come
    back as removed=True events with Medium.STORAGE, each key once, and only those: every reported key then
    MISSes, every stored key is held or reported; stored keys are removed=False events."""
    spec = make_spec(events=True)
    t, p, m = tier(tmp_path, spec=spec, capacity=512 << 10, shard_bytes=64 << 10, enable_kv_events=True,
                   locality="LOCAL")
    try:
        keys = [key(i) for i in range(160)]
        for j in range(0, 160, 4):
            fill(p, range(4), seed0=j)
            assert m.store(keys[j:j + 4], range(4)).success
        events = list(t.take_events())
        removed = [k for e in events if e.removed for k in e.keys]
        stored = [k for e in events if not e.removed for k in e.keys]
        assert all(e.medium == kv.Medium.STORAGE and e.locality == kv.Locality.LOCAL for e in events)
        assert stored == keys and removed and len(set(removed)) == len(removed)
        res = m.lookup(keys)
        assert {k for k, r in zip(keys, res) if r is MISS} == set(removed)
        assert t.kvx_stats()["evicted_keys"] == len(removed)
        assert list(t.take_events()) == []  # taken
    finally:
        t.shutdown()
    # events off in vLLM: none, said once in the log
    t, p, m = tier(tmp_path / "off", capacity=512 << 10, shard_bytes=64 << 10, enable_kv_events=True)
    try:
        fill(p, range(4))
        assert m.store([key(i) for i in range(4)], range(4)).success
        assert list(t.take_events()) == []
    finally:
        t.shutdown()


# PROMISE: PY-16
def test_damaged_page_is_a_failed_load_never_wrong_bytes(tmp_path):
    """A page damaged on disk: its load fails (its slot zeroed: the read lands in the slot, and the damaged bytes
    never stay there), the others load; never wrong bytes."""
    t, p, m = tier(tmp_path)
    fill(p, range(4))
    m.store([key(i) for i in range(4)], range(4))
    page2 = p.get(2)
    d = t.dir
    t.shutdown()
    damage_page(d, page2)
    t, p, m = tier(tmp_path, primary=Primary(64, SLOT))
    try:
        p.buf[12 * SLOT:13 * SLOT] = b"\x11" * SLOT
        r = m.load([key(i) for i in range(4)], range(10, 14))
        assert not r.success and key(2) not in r.successful_keys and len(r.successful_keys) == 3
        assert p.get(12) == bytes(SLOT)  # zeroed, not the damaged page
        assert m.lookup([key(2)]) == [MISS]  # a damaged page is not held
    finally:
        t.shutdown()


# PROMISE: PY-22
def test_touch_and_lookups_read_no_page_and_count_as_uses(tmp_path):
    """touch() returns at once and counts each key as a use in kvx's eviction order (a hit in the store's stat) on
    the lookup thread; a lookup reads no page (a damaged page answers HIT until its load fails, then MISS until
    the key is stored again)."""
    t, p, m = tier(tmp_path)
    try:
        fill(p, range(4))
        assert m.store([key(i) for i in range(4)], range(4)).success
        hits0 = t.kvx_stats()["store"]["hits"]
        t.touch([key(0), key(1), key(9)], None)
        t.drain_jobs()
        deadline = time.monotonic() + 10
        while t.kvx_stats()["store"]["hits"] < hits0 + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        st = t.kvx_stats()["store"]
        assert st["hits"] == hits0 + 2  # key(9) was never stored: a miss, not a hit
        page2 = p.get(2)
        d = t.dir
    finally:
        t.shutdown()
    damage_page(d, page2)
    t, p, m = tier(tmp_path, primary=Primary(64, SLOT))
    try:
        assert m.lookup([key(2)]) == [HIT]  # held: no page was read to answer
        r = m.load([key(2)], [20])
        assert not r.success and p.get(20) == bytes(SLOT)
        assert m.lookup([key(2)]) == [MISS]  # its load failed: a MISS from now on
        fill(p, [2])
        assert m.store([key(2)], [2]).success is True
    finally:
        t.shutdown()


# PROMISE: PY-22
def test_damaged_page_stored_again_loads_again(tmp_path):
    """A page damaged on disk after the store had checked it (a second store of the key: held, its CRC checked once
    for the open shard): its load fails, and storing the key again makes it load again, byte-identical; never a
    HIT whose every load fails."""
    t, p, m = tier(tmp_path)
    try:
        fill(p, range(4))
        assert m.store([key(2)], [2]).success
        assert m.store([key(2)], [2]).success  # held: the shard's handle checked the page
        page2 = p.get(2)
        fn = None
        for root, _, files in os.walk(t.dir):
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    if page2 in fh.read():
                        fn = os.path.join(root, f)
        st0 = os.stat(fn)
        damage_page(t.dir, page2)
        os.utime(fn, ns=(st0.st_atime_ns, st0.st_mtime_ns))  # as a bad sector leaves it
        assert m.lookup([key(2)]) == [HIT]
        assert not m.load([key(2)], [20]).success
        assert m.lookup([key(2)]) == [MISS]
        assert m.store([key(2)], [2]).success
        for _ in range(2):
            r = m.load([key(2)], [21])
            assert r.success, "stored again, yet its load fails"
            assert p.get(21) == page2
    finally:
        t.shutdown()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs (mount(2)); skipped, naming why, where mounting is refused (CI runs as root)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"kvx-test", os.fsencode(mnt), b"tmpfs", ctypes.c_ulong(0), b"size=4m,mode=0700") != 0:
        pytest.skip(f"cannot mount a tmpfs here: mount(2): {os.strerror(ctypes.get_errno())} (needs root or "
                    "CAP_SYS_ADMIN, as CI has)")
    try:
        yield mnt, libc
    finally:
        libc.umount2(os.fsencode(mnt), 2)


# PROMISE: PY-16
def test_full_file_system_is_a_failed_store_and_the_tier_lives_on(small_tmpfs):
    """The store's file system fills (ENOSPC) during stores: failed JobResults, counted, no exception; what was
    acknowledged before still loads."""
    mnt, _ = small_tmpfs
    t, p, m = tier(mnt, primary=Primary(64, 65536), capacity="64MiB", shard_bytes=1 << 20)
    try:
        fill(p, range(64))
        results = [m.store([key(j * 4 + i) for i in range(4)], range(j * 4 % 64, j * 4 % 64 + 4))
                   for j in range(32)]  # 8 MiB into 4 MiB
        ok = [r.success for r in results]
        assert ok[0] and not all(ok)
        st = t.kvx_stats()
        assert st["stores_failed"] == ok.count(False) and st["last_failure"]
        first = [key(i) for i in range(4)]
        assert m.load(first, range(60, 64)).success and p.get(60) == p.get(0)
    finally:
        t.shutdown()


# PROMISE: PY-17
def test_read_only_directory_reads_and_fails_stores(small_tmpfs):
    """A store on a file system mounted read-only: the tier opens it read-only (role auto), serves its pages and
    answers its store jobs with failures, never an exception."""
    mnt, libc = small_tmpfs
    t, p, m = tier(mnt)
    fill(p, range(4))
    assert m.store([key(i) for i in range(4)], range(4)).success
    t.shutdown()
    MS_REMOUNT, MS_RDONLY = 32, 1
    if libc.mount(b"kvx-test", os.fsencode(mnt), b"tmpfs", ctypes.c_ulong(MS_REMOUNT | MS_RDONLY), None) != 0:
        pytest.skip(f"cannot remount read-only: {os.strerror(ctypes.get_errno())}")
    t, p, m = tier(mnt, primary=Primary(64, SLOT))
    try:
        assert t.role == "reader"
        assert m.lookup([key(i) for i in range(5)]) == [HIT] * 4 + [MISS]
        assert m.load([key(i) for i in range(4)], range(8, 12)).success
        assert not m.store([key(9)], [0]).success
    finally:
        t.shutdown()
    with pytest.raises(kvx.Error):  # role writer: a clear start-up failure
        tier(mnt, role="writer")


# PROMISE: PY-17
def test_two_engines_on_one_path(tmp_path):
    """Data-parallel engines each get their own store (dp<i> in the name); a second server on the same path and
    rank opens the first one's store read-only (role auto: it reads the first's pages, its stores fail), or,
    with role writer, fails at once with a message naming the cause; never a hang."""
    a, pa, ma = tier(tmp_path)
    try:
        fill(pa, range(4))
        assert ma.store([key(i) for i in range(4)], range(4)).success
        d1, pd1, md1 = tier(tmp_path, spec=make_spec(dp=1))
        assert d1.role == "writer" and d1.dir != a.dir and "_dp1_" in d1.dir
        d1.shutdown()
        b, pb, mb = tier(tmp_path)
        try:
            assert b.role == "reader" and b.dir == a.dir
            assert mb.lookup([key(i) for i in range(4)]) == [HIT] * 4
            assert mb.load([key(i) for i in range(4)], range(4)).success and pb.get(3) == pa.get(3)
            assert not mb.store([key(50)], [0]).success
            fill(pa, [5])
            assert ma.store([key(5)], [5]).success  # the writer's later pages reach the reader too
            assert mb.lookup([key(5)]) == [HIT]
        finally:
            b.shutdown()
        with pytest.raises(kvx.BusyError, match="another process's writer"):
            tier(tmp_path, role="writer")
    finally:
        a.shutdown()


# PROMISE: PY-18
def test_non_collision_resistant_hash_refused_unless_opted_in(tmp_path, caplog):
    """--prefix-caching-hash-algo xxhash (given, or read from the spec's vLLM config) is refused at start-up with
    an error naming the option and the opt-in; with allow_non_cryptographic_hash it runs. Keys of 16-byte
    hashes without the opt-in turn the tier off (misses, failed jobs), logged naming the option."""
    for algo in ("xxhash", "xxhash_cbor"):
        with pytest.raises(ValueError, match="prefix-caching-hash-algo.*allow_non_cryptographic_hash"):
            tier(tmp_path, prefix_caching_hash_algo=algo)
    spec = make_spec()
    spec.vllm_config = type("V", (), {"cache_config": type("C", (), {"prefix_caching_hash_algo": "xxhash"})})()
    with pytest.raises(ValueError, match="xxhash"):
        tier(tmp_path, spec=spec)
    t, p, m = tier(tmp_path / "ok", prefix_caching_hash_algo="xxhash", allow_non_cryptographic_hash=True)
    try:
        fill(p, range(2))
        k16 = [key(i, hash_bytes=16) for i in range(2)]
        assert m.store(k16, range(2)).success and m.lookup(k16) == [HIT, HIT]
    finally:
        t.shutdown()
    t, p, m = tier(tmp_path / "off")
    try:
        fill(p, range(2))
        k16 = [key(i, hash_bytes=16) for i in range(2)]
        assert not m.store(k16, range(2)).success
        assert m.lookup([key(0)]) == [MISS]
        assert "allow_non_cryptographic_hash" in caplog.text
    finally:
        t.shutdown()


# PROMISE: PY-17
def test_namespace_names_the_store(tmp_path):
    """What FileMapper hashes (model, tokens per hash, blocks per chunk, dtype, parallel sizes, groups), the
    revision and the slot size each name another store; the same config the same one; a hand-named directory
    holding another namespace is refused."""
    def d(spec=None, slot=SLOT, **kw):
        t, _, _ = tier(tmp_path, primary=Primary(4, slot), spec=spec, **kw)
        t.shutdown()
        return t.dir
    base = d()
    assert d() == base
    others = [d(make_spec(dtype="float16")), d(make_spec(tokens_per_hash=32)), d(make_spec(blocks_per_chunk=2)),
              d(make_spec(model="meta-llama/Llama-3.1-8B")), d(make_spec(tp=2)), d(make_spec(layers=5)),
              d(revision="r2"), d(slot=2 * SLOT)]
    assert len(set(others + [base])) == len(others) + 1
    assert d(make_spec(tp=2, agnostic=True)) == d(make_spec(tp=4, agnostic=True))  # parallelism-agnostic bytes
    with pytest.raises(kvx.ShapeError, match="another namespace"):
        tier(base, per_rank_path=True, revision="r9")


# PROMISE: PY-17
def test_namespace_record_outlives_eviction(tmp_path):
    """The record is written once, in the oldest shard, which eviction drops first. Found by an attack: after
    enough stores a hand-named tier held r1's chunks but no record, and reopened under r2 (float16) it took the
    store for one from before namespaces and loaded r1's chunks. Each group's flush now puts the record again
    when its eviction took it: the store still records r1, and r2 is refused."""
    d = str(tmp_path / "by-hand")
    t, p, m = tier(d, primary=Primary(32, SLOT), per_rank_path=True, capacity="256KiB", shard_bytes=65536)
    try:
        fill(p, range(32), 500)
        for i in range(0, 32, 2):
            m.submit_store([key(i), key(i + 1)], [i, i + 1])
            t.drain_jobs()
            assert all(r.success for r in t.get_finished_jobs())
        assert t.kvx_stats()["evicted_keys"] > 0
        record = t._record
    finally:
        t.shutdown()
    with kvx.Store.open(d, readonly=True) as st:
        assert _common.read_namespace(st) == record
    with pytest.raises(kvx.ShapeError, match="another namespace"):
        tier(d, primary=Primary(32, SLOT), spec=make_spec(dtype="float16"), per_rank_path=True, revision="r2",
             capacity="256KiB", shard_bytes=65536)


def queued_together(t, m, jobs):
    """Submits jobs [(keys, chunk ids)] while the tier's writer is held busy, so they wait and go in one group
    (group commit); -> each job's success, in order."""
    gate, store_group = threading.Event(), t._store_group
    t._store_group = lambda group: (gate.wait(5), store_group(group))[1]
    blocker = m.submit_store([key(1000)], [0])
    time.sleep(0.2)  # the writer has taken it and waits at the gate
    ids = [m.submit_store(keys, cids) for keys, cids in jobs]
    gate.set()
    t.drain_jobs()
    done = {r.job_id: r.success for r in t.get_finished_jobs()}
    assert done[blocker]
    return [done[i] for i in ids]


# PROMISE: PY-13
def test_a_job_fails_for_its_own_reasons_only(tmp_path):
    """Store jobs that wait together go in one flush. Found by an attack: one job's chunk id outside the view
    failed its group's valid jobs, and on a store under 256 MiB a group of jobs that each fit failed whole
    (KVX_ECAPACITY). Groups now stop at a quarter of the store, and a group that fails whole is stored job by
    job: only the bad job fails, and every other is stored and loads byte for byte."""
    t, p, m = tier(tmp_path, primary=Primary(8, SLOT))
    try:
        fill(p, range(8))
        ok = queued_together(t, m, [([key(1)], [1]), ([key(2)], [99]), ([key(3)], [3])])
        assert ok == [True, False, True]
    finally:
        t.shutdown()
    big = 1 << 20
    t, p, m = tier(tmp_path / "small", primary=Primary(24, big), capacity="8MiB")
    try:
        fill(p, range(24))
        assert queued_together(t, m, [([key(100 + i)], [4 + i]) for i in range(12)]) == [True] * 12
        assert t.kvx_stats()["stores_failed"] == 0
    finally:
        t.shutdown()


# PROMISE: PY-16
def test_no_exception_escapes(tmp_path):
    """Every failure is an answer: bad chunk ids, keys and ids that differ, the store closed underneath, the
    tier shut down: failed JobResults and MISSes, never an exception into the caller."""
    t, p, m = tier(tmp_path)
    fill(p, range(2))
    assert not m.store([key(0)], [64]).success  # outside the primary view
    assert not m.store([key(0), key(1)], [0]).success
    assert not m.load([key(0)], [-1]).success
    assert m.store([key(0)], [0]).success
    t._store.close()  # the store closed under the tier
    assert not m.store([key(1)], [1]).success
    assert not m.load([key(0)], [5]).success
    assert m.lookup([key(7)]) == [MISS]
    t.shutdown()
    t.shutdown()  # idempotent
    assert not m.store([key(1)], [1]).success and not m.load([key(0)], [1]).success
    assert t.lookup(key(0), S.ReqContext("x")) is MISS
    t.drain_jobs()
    assert t.kvx_stats()["stores_failed"] >= 4


# PROMISE: PY-13
def test_concurrent_jobs(tmp_path):
    """Many store and load jobs in flight at once (one writer, several readers, jobs submitted while others run,
    a submitting thread per job as a stress): all succeed, bytes equal; drain_jobs waits for every one."""
    t, p, m = tier(tmp_path, primary=Primary(256, SLOT), n_read_threads=4)
    try:
        fill(p, range(128))
        ids = [m.submit_store([key(i) for i in range(j, j + 8)], range(j, j + 8)) for j in range(0, 128, 8)]
        t.drain_jobs()
        assert all(r.success for r in m.wait(ids))
        ids = []
        mu = threading.Lock()

        def load(j):
            with mu:  # job ids come from the manager's one counter
                ids.append(m.submit_load([key(i) for i in range(j, j + 8)], range(128 + j, 136 + j)))
        th = [threading.Thread(target=load, args=(j,)) for j in range(0, 128, 8)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        assert all(r.success for r in m.wait(ids))
        assert all(p.get(128 + i) == p.get(i) for i in range(128))
        assert not t.has_pending_work()
    finally:
        t.shutdown()
