#!/usr/bin/python3
"""bench_keyed.py - keyed pages (issue 14): keyed put/get against block
put/get of the same bytes, and the LMCache driver's batch get of 64 pages
against the binding's own batch get, per page.

    /usr/bin/python3 bench/bench_keyed.py [BUILD_DIR [WORK_DIR]] [--page-bytes N] [--pages N] [--rounds N]

BUILD_DIR (default build) holds python/kvx; WORK_DIR (default
/tmp/kvxbench-keyed) is emptied of the stores this script makes and used for
them. Both stores are opened with nosync (LMDB commits without fsync; shard
files are still fsynced at every flush), the same for both.

1. Same bytes, both ways: N pages (default 1024) of page_bytes (default
   64 KiB) written as a keyed store (keys "bench/<i>", keyed_put of 64 then
   flush) and as a block store whose full block is the same size (1 layer,
   8 KV heads, B 16, fp16, head_dim page_bytes/512; put of a 64-block
   sequence then flush). Then gets of 64 pages at a time, warm: keyed_get
   (64 keys, zero-copy views) against get_hashes (64 hashes, zero-copy
   views) and prefix (a 64-block prompt, digest-checked views).
2. The LMCache path: lmcache_driver's NativeConnectorL2Adapter over
   KvxConnector (exactly LMCache's native_plugin bridge: submit_load_task,
   the connector's worker copies into the 64 caller buffers, eventfd, demux
   thread, load eventfd, query_load_result) and the raw connector protocol
   (submit_batch_get, poll the eventfd, drain_completions; a second
   connector, rank 1, since the adapter's demux owns the first), per page, against
   the reference measured in the same run: the binding's plain keyed_get of
   the same 64 keys (one C call, zero-copy views; the brief's reference) and
   keyed_get_into (one C call that also copies into the same 64 buffers: the
   like-for-like reference, since the connector must copy). Target: driver /
   C batch get <= 1.2x. The pages stored and the buffers loaded into are what
   LMCache hands over: MemoryObj.byte_array, a memoryview of a ctypes c_ubyte
   array (format "<B"), never numpy "B" views.

Each figure is the best of ROUNDS alternated rounds (each round: 20 batches
of 64 pages per variant), with the median of the per-round ratios.
"""
import argparse
import ctypes
import os
import select
import shutil
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("build", nargs="?", default="build")
ap.add_argument("work", nargs="?", default="/tmp/kvxbench-keyed")
ap.add_argument("--page-bytes", type=int, default=65536)
ap.add_argument("--pages", type=int, default=1024)
ap.add_argument("--rounds", type=int, default=int(os.environ.get("KVX_BENCH_ROUNDS", "7")))
args = ap.parse_args()
sys.path.insert(0, os.path.join(args.build, "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python", "tests"))

import numpy as np  # noqa: E402

import kvx  # noqa: E402
from kvx.integrations.lmcache import KvxConnector  # noqa: E402
from lmcache_driver import ObjectKey, load_native_plugin, object_key_to_string  # noqa: E402

PB, N, BATCH = args.page_bytes, args.pages - args.pages % 64, 64
assert PB % 512 == 0 and N >= 64, "page_bytes a multiple of 512, at least 64 pages"
B = 16
GEOM = dict(num_layers=1, kv_heads=8, head_dim=PB // 512, block_tokens=B, quant="fp16")
CAP = max(4 * N * PB, 256 << 20)

for sub in ("keyed", "block", "l2"):
    shutil.rmtree(os.path.join(args.work, sub), ignore_errors=True)
os.makedirs(args.work, exist_ok=True)

rng = np.random.default_rng(1)
data = rng.integers(0, 256, (N, PB), dtype=np.uint8)
keys = [f"bench/{i}" for i in range(N)]
NSEQ = N // BATCH
toks = [((np.arange(BATCH * B, dtype=np.int64) * 7919 + s * 1000003 + 1) & 0xFFFFFF).astype(np.uint32) + 1
        for s in range(NSEQ)]


def best_med(xs):
    return min(xs), statistics.median(xs)


def load():
    return os.getloadavg()[0]


print(f"kvx {kvx.version()}; {N} pages of {PB} bytes; rounds {args.rounds}; load {load():.2f}")

# ---- 1. put ------------------------------------------------------------------
ks = kvx.Store.create(os.path.join(args.work, "keyed"), page_bytes=PB, capacity=CAP, nosync=True)
bs = kvx.Store.create(os.path.join(args.work, "block"), **GEOM, capacity=CAP, nosync=True)
assert bs.page_bytes == PB
t0 = time.perf_counter()
for s in range(NSEQ):
    sl = slice(s * BATCH, (s + 1) * BATCH)
    assert ks.keyed_put(keys[sl], list(data[sl])) == BATCH
    ks.flush()
t_kput = time.perf_counter() - t0
t0 = time.perf_counter()
for s in range(NSEQ):
    assert bs.put(toks[s], data[s * BATCH:(s + 1) * BATCH]) == BATCH
    bs.flush()
t_bput = time.perf_counter() - t0
mb = N * PB / 1e6
print(f"put+flush per 64 pages: keyed {mb / t_kput:.0f} MB/s, block {mb / t_bput:.0f} MB/s, "
      f"keyed/block time {t_kput / t_bput:.2f}x")

# ---- 1. get ------------------------------------------------------------------
hashes = [kvx.block_hashes(toks[s], B) for s in range(NSEQ)]
kbatches = [keys[s * BATCH:(s + 1) * BATCH] for s in range(NSEQ)]
for s in range(NSEQ):  # warm, and check the bytes once
    kv, hv = ks.keyed_get(kbatches[s]), bs.get_hashes(hashes[s])
    for i in (0, BATCH - 1):
        assert bytes(kv[i]) == bytes(hv[i]) == data[s * BATCH + i].tobytes()
    del kv, hv
REPS = 20


def timed(fn):
    t0 = time.perf_counter()
    for r in range(REPS):
        fn(r % NSEQ)
    return (time.perf_counter() - t0) / (REPS * BATCH) * 1e9  # ns per page


g_k, g_h, g_p, rk, rp = [], [], [], [], []
for _ in range(args.rounds):
    a = timed(lambda s: ks.keyed_get(kbatches[s]))
    b = timed(lambda s: bs.get_hashes(hashes[s]))
    c = timed(lambda s: bs.prefix(toks[s]))
    g_k.append(a), g_h.append(b), g_p.append(c), rk.append(a / b), rp.append(a / c)
print(f"get of 64, zero-copy views, ns/page best (median): keyed_get {best_med(g_k)[0]:.0f} "
      f"({best_med(g_k)[1]:.0f}), get_hashes {best_med(g_h)[0]:.0f} ({best_med(g_h)[1]:.0f}), "
      f"prefix {best_med(g_p)[0]:.0f} ({best_med(g_p)[1]:.0f}); keyed/get_hashes "
      f"{min(g_k) / min(g_h):.2f}x (median of rounds {statistics.median(rk):.2f}x), keyed/prefix "
      f"{min(g_k) / min(g_p):.2f}x ({statistics.median(rp):.2f}x); load {load():.2f}")
bs.close()
ks.close()

# ---- 2. the LMCache driver's batch get of 64 pages -------------------------------
l2 = os.path.join(args.work, "l2")
okeys = [ObjectKey("bench/model", 0, 0, i.to_bytes(32, "little")) for i in range(N)]
params = {"path": l2, "page_bytes": PB, "capacity": CAP, "nosync": True, "num_workers": 2}
adapter = load_native_plugin({"type": "native_plugin", "module_path": "kvx.integrations.lmcache",
                              "class_name": "KvxConnector", "adapter_params": params})
conn = adapter.client


def byte_array(n, src=None):
    """A buffer as LMCache hands it (MemoryObj.byte_array): a memoryview of a ctypes c_ubyte array, format "<B"."""
    a = (ctypes.c_ubyte * n).from_buffer_copy(src) if src is not None else (ctypes.c_ubyte * n)()
    m = memoryview(a)
    assert m.format == "<B"
    return m


cdata = [byte_array(PB, d) for d in data]  # the pages to store, as LMCache's objects hold them
for s in range(NSEQ):  # fill through the adapter itself
    t = adapter.submit_store_task(okeys[s * BATCH:(s + 1) * BATCH], cdata[s * BATCH:(s + 1) * BATCH])
    while True:
        done = adapter.pop_completed_store_tasks()
        if t in done:
            assert done[t][0], done[t]
            break
        select.select([adapter.store_efd.fd], [], [], 1.0)
        try:
            os.eventfd_read(adapter.store_efd.fd)
        except BlockingIOError:
            pass
st = conn._store  # the connector's own handle: the reference runs on the same store, same process
okb = [okeys[s * BATCH:(s + 1) * BATCH] for s in range(NSEQ)]
skb = [[object_key_to_string(k) for k in ks_] for ks_ in okb]
bufs = [byte_array(PB) for _ in range(BATCH)]  # the buffers loaded into: "<B" as LMCache's
mvs = bufs


def driver_get(s):
    t = adapter.submit_load_task(okb[s], bufs)
    while True:
        r = adapter.query_load_result(t)
        if r is not None:
            assert all(r)
            return
        select.select([adapter.load_efd.fd], [], [], 1.0)
        try:
            os.eventfd_read(adapter.load_efd.fd)
        except BlockingIOError:
            pass


# The raw protocol needs a connector of its own (the adapter's demux thread drains the first one): rank 1,
# another directory, filled through its own submit_batch_set.
raw = KvxConnector(**dict(params, rank=1))
poller = select.poll()
poller.register(raw.event_fd(), select.POLLIN)


def raw_wait(f):
    while True:
        poller.poll(1000)
        for c in raw.drain_completions():
            if c[0] == f:
                assert c[1] and (c[3] is None or all(c[3])), c
                return


for s in range(NSEQ):
    raw_wait(raw.submit_batch_set(skb[s], cdata[s * BATCH:(s + 1) * BATCH]))


def raw_get(s):
    raw_wait(raw.submit_batch_get(skb[s], mvs))


def ref_views(s):
    st.keyed_get(skb[s])


def ref_into(s):
    assert all(st.keyed_get_into(skb[s], mvs))


for s in range(NSEQ):
    driver_get(s)
    assert bytes(bufs[5]) == data[s * BATCH + 5].tobytes()
d_t, w_t, v_t, i_t, r_dv, r_di, r_wi = [], [], [], [], [], [], []
for _ in range(args.rounds):
    v = timed(ref_views)
    i = timed(ref_into)
    d = timed(driver_get)
    w = timed(raw_get)
    v_t.append(v), i_t.append(i), d_t.append(d), w_t.append(w)
    r_dv.append(d / v), r_di.append(d / i), r_wi.append(w / i)
print(f"LMCache batch get of 64 pages, ns/page best (median): driver (NativeConnectorL2Adapter) "
      f"{min(d_t):.0f} ({statistics.median(d_t):.0f}), raw connector {min(w_t):.0f} ({statistics.median(w_t):.0f}), "
      f"C keyed_get views {min(v_t):.0f} ({statistics.median(v_t):.0f}), C keyed_get_into copy {min(i_t):.0f} "
      f"({statistics.median(i_t):.0f})")
print(f"  driver / C keyed_get_into {min(d_t) / min(i_t):.2f}x (median of rounds {statistics.median(r_di):.2f}x); "
      f"raw / C keyed_get_into {min(w_t) / min(i_t):.2f}x ({statistics.median(r_wi):.2f}x); "
      f"driver / C keyed_get (no copy) {min(d_t) / min(v_t):.2f}x ({statistics.median(r_dv):.2f}x); "
      f"target <= 1.2x; load {load():.2f}")
adapter.close()
raw.close()
for sub in ("keyed", "block", "l2"):
    shutil.rmtree(os.path.join(args.work, sub), ignore_errors=True)
