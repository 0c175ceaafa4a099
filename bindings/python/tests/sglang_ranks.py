"""SGLang's tensor-parallel ranks as real processes, each with its own
backend (SGLang runs one scheduler process per TP rank, each building its
backend from the one shared extra_config), against one store path. The
parent plays the gloo all-reduce of the pinned cache controller
(managers/cache_controller.py at the commit docs/ENGINES.md names): the
prefetch thread's hit counts are reduced with MIN before any page is read,
and so are the completed tokens. backup_skip: an MLA model's ranks other
than TP rank 0 never back up.

    with Ranks(2, extra, mla=True) as rk:
        rk.ask(1, "open"); rk.ask(0, "open")
        rk.all("backup", tokens=toks, pages=[0, 1], seed=5)
        hit = min(r["hit_tokens"] for r in rk.all("hit", tokens=toks))
        got = rk.all("prefetch", tokens=toks, hit_tokens=hit, pages=[8, 9])

Run as a script, this file is one rank: it reads one JSON command a line
from stdin and answers one JSON line on stdout.
"""
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class Ranks:
    def __init__(self, n, extra, mla=False, model="deepseek-ai/DeepSeek-V3", page_size=4):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
        self.n = n
        self.procs = []
        for r in range(n):
            args = json.dumps({"rank": r, "size": n, "extra": extra, "mla": mla, "model": model, "page": page_size})
            self.procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "sglang_ranks.py"), args],
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True, env=env))

    def _send(self, r, op, kw):
        p = self.procs[r]
        p.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        p.stdin.flush()

    def _recv(self, r):
        p = self.procs[r]
        line = p.stdout.readline()
        if not line:
            p.wait(10)
            raise AssertionError(f"rank {r} died (exit {p.returncode}): {p.stderr.read()}")
        out = json.loads(line)
        if "error" in out:
            raise AssertionError(f"rank {r}: {out['error']}")
        return out

    def ask(self, r, op, **kw):
        """One rank's answer to op."""
        self._send(r, op, kw)
        return self._recv(r)

    def all(self, op, **kw):
        """Every rank's answer to op, the ranks running it at once."""
        for r in range(self.n):
            self._send(r, op, kw)
        return [self._recv(r) for r in range(self.n)]

    def close(self):
        for r, p in enumerate(self.procs):
            if p.poll() is None:
                try:
                    self._send(r, "exit", {})
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _rank_main(args):
    import array
    import traceback

    from sglang_driver import (MHAHostPool, MLAHostPool, create_dynamic_backend, page_get_zero_copy, page_hashes,
                               page_set_zero_copy, storage_config, storage_hit_query)

    a = json.loads(args)
    rank, mla, page = a["rank"], a["mla"], a["page"]
    pool = MLAHostPool(page_size=page) if mla else MHAHostPool(page_size=page, heads=1)
    backend = None

    def idx(pages):
        out = array.array("q")
        for p in pages:
            out.extend(pool.page_indices(p))
        return out

    def digests(pages):
        return [hashlib.sha256(pool.page_bytes_of(p)).hexdigest() for p in pages]

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "exit":
                break
            if op == "open":
                backend = create_dynamic_backend(storage_config(a["extra"], tp_rank=rank, tp_size=a["size"],
                                                                model=a["model"], mla=mla), pool)
                out = {"dir": backend.dir}
            elif op == "backup":
                # an MLA rank's latent KV is the same on every rank; an MHA rank holds its own heads
                for i, p in enumerate(cmd["pages"]):
                    pool.fill_page(p, seed=cmd["seed"] * 100 + i + (0 if mla else 7919 * rank))
                hashes = page_hashes(cmd["tokens"], page)
                if mla and rank != 0:  # the controller's backup_skip
                    out = {"ok": None, "data": digests(cmd["pages"])}
                else:
                    out = {"ok": page_set_zero_copy(backend, hashes, idx(cmd["pages"])),
                           "data": digests(cmd["pages"])}
            elif op == "hit":
                _, n = storage_hit_query(backend, cmd["tokens"], page)
                out = {"hit_tokens": n}
            elif op == "prefetch":
                hashes = page_hashes(cmd["tokens"], page)[:cmd["hit_tokens"] // page]
                pool.mark_pages(cmd["pages"], 0xA7)
                n = page_get_zero_copy(backend, hashes, idx(cmd["pages"][:len(hashes)])) if hashes else 0
                out = {"completed": n * page, "data": digests(cmd["pages"][:n])}
            else:
                out = {"error": f"unknown op {op}"}
        except Exception:
            out = {"error": traceback.format_exc()}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    if backend is not None:
        backend.close()


if __name__ == "__main__":
    _rank_main(sys.argv[1])
