#!/usr/bin/python3
"""bench_python.py - the Python binding against the same C call: prefix
lookups of 64-block prompts, cost per block, in one process on one store
handle (as bindings/go's BenchmarkPrefixVsC does for Go).

    /usr/bin/python3 bench/bench_python.py [BUILD_DIR [STORE_DIR]]

BUILD_DIR (default build) holds python/kvx; STORE_DIR (default
/tmp/kvxbench-py-store) is created when missing with bench_prefix_c.c's
layout: 256 sequences x 64 full blocks (B = 16, 1 KiB fp16 pages, model
signature 0x1234), token i of sequence s = ((s*1000003 + i*7919 + 1) &
0xFFFFFF) + 1, so `bench_prefix_c STORE_DIR` times the very same store.

Each round runs one pass over the 256 prompts entirely in C
(Store._c_prefix_loop: kvx_store_prefix + kvx_views_release per prompt,
GIL released for the pass) and one through the Python API (st.prefix(row),
the list of Views dropped at once, which releases them), alternated; the
figure is the best pass of each and their ratio, plus the median of the
rounds' ratios. A third pass releases each View explicitly (v.release()).
"""
import os
import statistics
import sys
import time

build = sys.argv[1] if len(sys.argv) > 1 else "build"
store_dir = sys.argv[2] if len(sys.argv) > 2 else "/tmp/kvxbench-py-store"
sys.path.insert(0, os.path.join(build, "python"))

import numpy as np  # noqa: E402

import kvx  # noqa: E402

NSEQ, NBLK, B = 256, 64, 16
NTOK = NBLK * B + 5
GEOM = dict(num_layers=1, kv_heads=2, head_dim=8, block_tokens=B, quant="fp16", model_signature=0x1234)
ROUNDS = int(os.environ.get("KVX_BENCH_ROUNDS", "9"))

i = np.arange(NTOK, dtype=np.int64)
toks = np.stack([(((q * 1000003 + i * 7919 + 1) & 0xFFFFFF) + 1) for q in range(NSEQ)]).astype(np.uint32)
rows = [toks[q] for q in range(NSEQ)]

if not os.path.exists(store_dir):
    with kvx.Store.create(store_dir, **GEOM, nosync=True) as st:
        pb = st.page_bytes
        j = np.arange(NBLK * pb, dtype=np.int64)
        for q in range(NSEQ):
            st.put(toks[q], ((q * 31 + j) & 0xFF).astype(np.uint8))
        st.flush()

st = kvx.Store.open(store_dir, readonly=True)
for q in range(NSEQ):  # warm: map every shard, fault the index in
    assert len(st.prefix(rows[q])) == NBLK


def py_pass():
    t0 = time.perf_counter()
    for r in rows:
        st.prefix(r)
    return time.perf_counter() - t0


def py_release_pass():
    t0 = time.perf_counter()
    for r in rows:
        for v in st.prefix(r):
            v.release()
    return time.perf_counter() - t0


flat = toks.ravel()
c, py, pyr, ratios = [], [], [], []
for _ in range(ROUNDS):
    ct = st._c_prefix_loop(flat, NTOK, 1)[0]
    pt = py_pass()
    rt = py_release_pass()
    c.append(ct)
    py.append(pt)
    pyr.append(rt)
    ratios.append(pt / ct)
st.close()

per = NSEQ * NBLK
ns = lambda t: t / per * 1e9  # noqa: E731
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
print(f"machine: {cpu}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; Python {sys.version.split()[0]}, kvx {kvx.version()}")
print(f"prefix 64-block prompts, {NSEQ} prompts per pass, best of {ROUNDS} alternated rounds:")
print(f"  C (kvx_store_prefix + kvx_views_release): {ns(min(c)):.1f} ns/block")
print(f"  Python st.prefix(row), views dropped:     {ns(min(py)):.1f} ns/block  Python/C {min(py) / min(c):.3f}"
      f"  (median of rounds {statistics.median(ratios):.3f})")
print(f"  Python, each v.release() explicitly:      {ns(min(pyr)):.1f} ns/block  Python/C {min(pyr) / min(c):.3f}")
