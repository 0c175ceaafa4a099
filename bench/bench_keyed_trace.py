#!/usr/bin/python3
"""bench_keyed_trace.py - a keyed store's prefix hit ratio on a Mooncake
trace against an exact LRU of the same number of pages (STORE-6).

    /usr/bin/python3 bench/bench_keyed_trace.py BUILD_DIR TRACE BLOCKS [WORK_DIR]

BUILD_DIR holds python/kvx; TRACE is a Mooncake jsonl trace (its first
1,000 requests); BLOCKS the LRU's size in pages; WORK_DIR (default
/tmp/kvxbench-keyed-trace) is emptied and used for the store.

Each hash id is a key ("h<id>": the trace's ids already name a prefix, as
LMCache's chunk keys do) of one 4 KiB page. Per request: keyed_exists of
its keys (a use of each key held; the leading held keys are its prefix
hits), keyed_put of the keys not held, flush. The store's capacity is
BLOCKS x (4,096 + 160) bytes: the page plus about what a page costs in a
shard's tables (entry, key, sequence); headers and padding count against
the store. The exact LRU holds BLOCKS pages; its hits are counted the same
way (up to a request's first miss). Recency is by the clock, so two runs
differ slightly. Written / put: the process's device writes
(/proc/self/io write_bytes, create to close) over the page bytes put.
"""
import collections
import json
import os
import shutil
import sys

PB = 4096


def write_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    build, trace, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    work = sys.argv[4] if len(sys.argv) > 4 else "/tmp/kvxbench-keyed-trace"
    sys.path.insert(0, os.path.join(build, "python"))
    import kvx

    with open(trace) as f:
        reqs = [json.loads(line)["hash_ids"] for line in f][:1000]
    lru = collections.OrderedDict()
    lru_hits = total = 0
    for ids in reqs:
        lead = True
        for h in ids:
            total += 1
            if h in lru:
                lru.move_to_end(h)
                lru_hits += lead
            else:
                lead = False
                lru[h] = 1
        while len(lru) > n:
            lru.popitem(last=False)
    shutil.rmtree(work, ignore_errors=True)
    w0 = write_bytes()
    st = kvx.Store.create(work, page_bytes=PB, capacity=n * (PB + 160))
    hits = put = 0
    for ids in reqs:
        keys = [b"h%d" % h for h in ids]
        held, lead = st.keyed_exists(keys)
        hits += lead
        miss = [k for k, x in zip(keys, held) if not x]
        if miss:
            st.keyed_put(miss, [k.ljust(PB, b".") for k in miss])
            put += len(miss)
            st.flush()
    s = st.stat()
    st.close()
    written = write_bytes() - w0
    shutil.rmtree(work, ignore_errors=True)
    print("%s, %d pages: store %.2f %%, exact LRU %.2f %%, store / LRU %.3fx, written / put %.2fx "
          "(%d evictions, %d compactions, %d pages held)"
          % (os.path.basename(trace), n, 100.0 * hits / total, 100.0 * lru_hits / total, hits / lru_hits,
             written / (put * PB), s["evictions"], s["compactions"], s["blocks"]))


if __name__ == "__main__":
    main()
