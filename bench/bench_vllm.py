#!/usr/bin/python3
"""bench_vllm.py - the vLLM secondary tier (issue 38): store and load
throughput through the primary-view interface (KvxSecondaryTier, driven as
vLLM's tiering manager drives it: bindings/python/tests/vllm_driver.py)
against the file tier's approach (vLLM's tiering/fs: one file per chunk,
written to a temp file with O_DIRECT and renamed, read back with O_DIRECT
readv into the slot), on the same disk; and the load against fio's
sequential read of the same bytes at the chunk size, in one run.

    /usr/bin/python3 bench/bench_vllm.py [BUILD_DIR [WORK_DIR]] [--chunk-bytes N] [--chunks N] [--job N]
                                         [--file-threads N] [--read-threads N] [--rounds N]

BUILD_DIR (default build) holds python/kvx; WORK_DIR (default
/var/tmp/kvxbench-vllm, which must be on the disk under test, not tmpfs) is
emptied and used for all three. Each phase runs on a cold page cache (root:
`echo 3 > /proc/sys/vm/drop_caches` before each; elsewhere the loads are
warm and the script says so).

- kvx: chunks x chunk_bytes (default 256 x 2 MiB: Llama-3.1-8B bf16, 16
  tokens a chunk) in the primary view, submitted as store jobs of JOB chunks
  (default 8) at once, timed until every job reported success (each is
  flushed: durable); then cold, load jobs of JOB chunks into other slots,
  timed until all finished, bytes compared. The store is synced (no nosync).
- files: the same chunks, the same jobs, through vLLM's fs tier code path
  (store_block / load_block of tiering/fs/io.py, reproduced) on a thread
  pool of --file-threads (default 16: the fs tier's default; the kvx tier gets
  --read-threads 16 readers too, and its one writer); as upstream,
  no fsync (O_DIRECT writes reach the device, not necessarily its media).
- fio: a file of the same total bytes, cold, `fio --rw=read --direct=1
  --bs=<chunk> --ioengine=psync` (one job, queue depth 1), the same with
  `--ioengine=libaio --iodepth=8`, and the tier's own concurrency:
  --read-threads jobs, each reading its share in order at queue depth 1;
  where fio is missing, an O_DIRECT pread loop of the same bytes at the
  chunk size instead (said in the output).

Each round (--rounds, default 3) runs every phase once, in that order, on
a fresh store and file tree: on a shared machine a busy moment lands on
both sides of a ratio rather than one. Each round's ratios are printed,
then min-median-max.
"""
import argparse
import concurrent.futures
import json
import mmap
import os
import shutil
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("build", nargs="?", default="build")
p.add_argument("work", nargs="?", default="/var/tmp/kvxbench-vllm")
p.add_argument("--chunk-bytes", type=int, default=2 << 20)
p.add_argument("--chunks", type=int, default=256)
p.add_argument("--job", type=int, default=8)
p.add_argument("--file-threads", type=int, default=16)
p.add_argument("--read-threads", type=int, default=16)
p.add_argument("--rounds", type=int, default=3)
a = p.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(a.build, "python"))
sys.path.insert(0, os.path.join(here, "..", "bindings", "python", "tests"))
import vllm_driver as D  # noqa: E402

CB, N, J = a.chunk_bytes, a.chunks, a.job
TOTAL = CB * N
shutil.rmtree(a.work, ignore_errors=True)
os.makedirs(a.work)
can_drop = os.geteuid() == 0


def drop():
    os.sync()
    if can_drop:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def gib(nbytes, secs):
    return nbytes / secs / (1 << 30)


prim = D.Primary(2 * N, CB, aligned=True)  # vLLM's CPU tier is pinned, page-aligned memory
for i in range(N):
    prim.fill(i, i)
want = [prim.get(i) for i in range(N)]
keys = [D.key(i) for i in range(N)]
jobs = [(keys[j:j + J], list(range(j, min(j + J, N)))) for j in range(0, N, J)]


# ---- kvx through the tier --------------------------------------------------------------------------------------
def kvx_tier():
    return D.create_secondary_tier(D.tier_config(os.path.join(a.work, "kvx"), capacity=4 * TOTAL, revision="bench",
                                                 n_read_threads=a.read_threads), prim.view, D.make_spec())


def kvx_store():
    shutil.rmtree(os.path.join(a.work, "kvx"), ignore_errors=True)
    drop()
    tier = kvx_tier()
    m = D.Manager(tier)
    t0 = time.monotonic()
    ids = [m.submit_store(k, s) for k, s in jobs]
    assert all(r.success for r in m.wait(ids, timeout=600))
    secs = time.monotonic() - t0
    tier.shutdown()
    return gib(TOTAL, secs)


def kvx_load():
    drop()
    tier = kvx_tier()
    m = D.Manager(tier)
    for i in range(N, 2 * N):
        prim.buf[i * CB:(i + 1) * CB] = bytes(CB)
    t0 = time.monotonic()
    ids = [m.submit_load(k, [N + s for s in sl]) for k, sl in jobs]
    assert all(r.success for r in m.wait(ids, timeout=600))
    secs = time.monotonic() - t0
    assert all(prim.get(N + i) == want[i] for i in range(N))
    tier.shutdown()
    return gib(TOTAL, secs)


# ---- one file per chunk (vLLM's fs tier I/O) -------------------------------------------------------------------
O_DIRECT = getattr(os, "O_DIRECT", 0)
aligned = mmap.mmap(-1, 2 * N * CB)  # O_DIRECT needs aligned memory: the fs tier's primary view is an mmap too
aligned[:] = prim.buf
aview = memoryview(aligned)
fdir = os.path.join(a.work, "files")


def fname(k):
    h = k[:-4].hex()
    return os.path.join(fdir, h[:3], h[3:5] + "_g0", h + ".bin")


def store_block(path, off):
    if os.path.exists(path):
        return
    tmp = path + ".%d.tmp" % os.getpid()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_TRUNC | O_DIRECT, 0o644)
    try:
        assert os.write(fd, aview[off:off + CB]) == CB
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_block(path, off):
    fd = os.open(path, os.O_RDONLY | O_DIRECT)
    try:
        assert os.readv(fd, [aview[off:off + CB]]) == CB
    finally:
        os.close(fd)


def run_jobs(fn, slot0):
    with concurrent.futures.ThreadPoolExecutor(a.file_threads) as ex:
        futs = [ex.submit(lambda k=k, s=s: [fn(fname(x), (slot0 + y) * CB) for x, y in zip(k, s)]) for k, s in jobs]
        for f in futs:
            f.result()


def files_store():
    shutil.rmtree(fdir, ignore_errors=True)
    drop()
    t0 = time.monotonic()
    run_jobs(store_block, 0)
    return gib(TOTAL, time.monotonic() - t0)


def files_load():
    drop()
    aligned[N * CB:] = bytes(N * CB)
    t0 = time.monotonic()
    run_jobs(load_block, N)
    secs = time.monotonic() - t0
    assert all(aligned[(N + i) * CB:(N + i + 1) * CB] == want[i] for i in range(N))
    return gib(TOTAL, secs)


# ---- fio: sequential read of the same bytes at the chunk size --------------------------------------------------
seq = os.path.join(a.work, "seq.bin")
with open(seq, "wb") as f:
    for i in range(N):
        f.write(want[i])
    os.fsync(f.fileno())
fio = shutil.which("fio")


def fio_read(eng):
    drop()
    if fio:
        size = [] if any(e.startswith("--size=") for e in eng) else [f"--size={TOTAL}"]
        r = subprocess.run([fio, "--name=seq", f"--filename={seq}", "--rw=read", "--direct=1", f"--bs={CB}",
                            "--output-format=json"] + size + eng, capture_output=True, text=True, check=True)
        rd = json.loads(r.stdout)["jobs"][0]["read"]  # --group_reporting: one entry for all jobs
        return rd["io_bytes"] / (rd["runtime"] / 1000.0) / (1 << 30)
    fd = os.open(seq, os.O_RDONLY | O_DIRECT)
    t0 = time.monotonic()
    for i in range(N):
        os.preadv(fd, [aview[:CB]], i * CB)
    os.close(fd)
    return gib(TOTAL, time.monotonic() - t0)


# ---- rounds: every phase once a round, interleaved, so a busy moment of a shared machine lands on all sides ----
phases = [("kvx_store", kvx_store), ("files_store", files_store), ("kvx_load", kvx_load), ("files_load", files_load),
          ("fio_qd1", lambda: fio_read(["--ioengine=psync"])),
          ("fio_qd8", lambda: fio_read(["--ioengine=libaio", "--iodepth=8"])),
          # the tier's own concurrency: --read-threads readers, each reading its share of the bytes in order
          ("fio_par", lambda: fio_read(["--ioengine=psync", f"--numjobs={a.read_threads}", "--group_reporting",
                                        f"--offset_increment={TOTAL // a.read_threads}",
                                        f"--size={TOTAL // a.read_threads}"]))]
rows = []
print(f"chunks {N} x {CB} B ({TOTAL >> 20} MiB), jobs of {J}, {a.rounds} rounds; cold cache: "
      f"{'yes' if can_drop else 'NO (not root)'}; fio: {fio or 'absent: an O_DIRECT pread loop (qd1) instead'}")
print(f"round  load  kvx_store files_store kvx_load files_load fio_qd1 fio_qd8 fio_par{a.read_threads} (GiB/s) | "
      "store k/f  load k/f  load/fio_qd1  load/fio_qd8  load/fio_par")
for r in range(a.rounds):
    out = {name: fn() for name, fn in phases}
    out["store"] = out["kvx_store"] / out["files_store"]
    out["load"] = out["kvx_load"] / out["files_load"]
    out["qd1"] = out["kvx_load"] / out["fio_qd1"]
    out["qd8"] = out["kvx_load"] / out["fio_qd8"]
    out["par"] = out["kvx_load"] / out["fio_par"]
    rows.append(out)
    print(f"{r + 1:5d} {os.getloadavg()[0]:5.1f} {out['kvx_store']:10.3f} {out['files_store']:11.3f} "
          f"{out['kvx_load']:8.3f} {out['files_load']:10.3f} {out['fio_qd1']:7.3f} {out['fio_qd8']:7.3f} "
          f"{out['fio_par']:9.3f}         | "
          f"{out['store']:8.2f}x {out['load']:8.2f}x {out['qd1']:12.2f} {out['qd8']:13.2f} {out['par']:13.2f}")
shutil.rmtree(a.work, ignore_errors=True)


def mmm(k):
    v = sorted(o[k] for o in rows)
    return f"{v[0]:.2f}-{v[len(v) // 2]:.2f}-{v[-1]:.2f}"


print(f"min-median-max over {len(rows)} rounds: kvx/files store {mmm('store')}x, load {mmm('load')}x; "
      f"kvx load / fio qd1 {mmm('qd1')}, / fio qd8 {mmm('qd8')}, / fio {a.read_threads} jobs {mmm('par')}")
