"""SGLang at TP > 1: each TP rank a real process with its own backend, one
store path, the hit counts reduced with MIN across the ranks before any
page is read (sglang_ranks.py, the pinned controller's prefetch thread)."""
import os
import random

from sglang_ranks import Ranks

PAGE = 4


def extra(path, **kw):
    e = {"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
         "interface_v1": 1, "path": str(path), "page_bytes": 65536, "capacity": "64MiB", "nosync": True}
    e.update(kw)
    return e


def prompt(n_pages, seed):
    rng = random.Random(seed)
    return [rng.randrange(150000) for _ in range(n_pages * PAGE)]


def prefetch_all_ranks(rk, toks, pages):
    """The controller's prefetch: every rank's hit query, MIN over them; every rank reads that many pages; MIN of
    the completed tokens. -> (min hit tokens, min completed tokens, each rank's answer)."""
    hit = min(r["hit_tokens"] for r in rk.all("hit", tokens=toks))
    got = rk.all("prefetch", tokens=toks, hit_tokens=hit, pages=pages)
    return hit, min(g["completed"] for g in got), got


# PROMISE: ENGINE-16
def test_mla_tp2_rank0_writes_every_rank_hits(tmp_path):
    """DeepSeek-class MLA at TP 2: rank 0 backs up (the others skip: backup_skip), rank 1 reads rank 0's store
    (opened read-only once it exists: rank 1 comes up first here), so the MIN over the ranks' hits is every page
    and both ranks get rank 0's bytes; after both ranks restart, the same. With a store per rank, rank 1 found
    nothing and the MIN made every prefetch 0 pages."""
    toks = prompt(6, seed=1)
    ex = extra(tmp_path / "l3")
    with Ranks(2, ex, mla=True) as rk:
        d1 = rk.ask(1, "open")["dir"]
        d0 = rk.ask(0, "open")["dir"]
        b = rk.all("backup", tokens=toks, pages=list(range(6)), seed=3)
        assert b[0]["ok"] is True and b[1]["ok"] is None  # rank 1 skipped the backup
        want = b[0]["data"]
        hit, done, got = prefetch_all_ranks(rk, toks, list(range(10, 16)))
        assert hit == 6 * PAGE and done == 6 * PAGE
        assert got[0]["data"] == want and got[1]["data"] == want
        assert d0 == d1 and os.path.basename(d0).startswith("deepseek-ai-DeepSeek-V3_mla_")
        assert sorted(os.listdir(tmp_path / "l3")) == [os.path.basename(d0)]  # one store, rank 0's
    with Ranks(2, ex, mla=True) as rk:  # both ranks restart
        rk.all("open")
        hit, done, got = prefetch_all_ranks(rk, toks + [7, 8], list(range(20, 26)))
        assert hit == 6 * PAGE and done == 6 * PAGE and got[1]["data"] == want


# PROMISE: ENGINE-16
def test_mha_tp2_each_rank_its_own_heads(tmp_path):
    """MHA at TP 2: each rank writes and reads its own store (its own heads' bytes), and the MIN over the ranks'
    hits is every page stored by both."""
    toks = prompt(5, seed=2)
    with Ranks(2, extra(tmp_path / "l3"), model="Qwen/Qwen3-8B") as rk:
        dirs = [r["dir"] for r in rk.all("open")]
        assert dirs[0] != dirs[1]
        assert [os.path.basename(d).split("_")[1] for d in dirs] == ["tp0of2", "tp1of2"]
        b = rk.all("backup", tokens=toks, pages=list(range(5)), seed=4)
        assert b[0]["ok"] is True and b[1]["ok"] is True and b[0]["data"] != b[1]["data"]
        hit, done, got = prefetch_all_ranks(rk, toks, list(range(10, 15)))
        assert hit == 5 * PAGE and done == 5 * PAGE
        assert [g["data"] for g in got] == [b[0]["data"], b[1]["data"]]
        # pages rank 1 does not hold: the MIN is what both hold
        more = toks + prompt(2, seed=9)
        rk.ask(0, "backup", tokens=more, pages=list(range(7)), seed=4)
        hit, done, _ = prefetch_all_ranks(rk, more, list(range(10, 17)))
        assert hit == 5 * PAGE and done == 5 * PAGE
