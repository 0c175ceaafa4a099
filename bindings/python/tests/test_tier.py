"""The shared tier through the binding (docs/TIER.md): the options pass
through, a tier nobody answers fails nothing, and with a redis-server
(skipped without one) a block put in one store is served in another."""
import shutil
import socket
import subprocess
import time

import pytest

import kvx
from conftest import GEOM, kv_pages, seq_tokens


# PROMISE: TIER-7, TIER-23
def test_tier_down_and_options(tmp_path):
    d = str(tmp_path / "a")
    with kvx.Store.create(d, **GEOM, nosync=True, tier_url="redis://127.0.0.1:1", tier_tenant="py",
                          tier_ttl_ms=60000) as st:
        toks = seq_tokens(3, 4)
        assert st.put(toks, kv_pages(st, 4)) == 4
        st.flush()
        assert len(st.prefix(toks + seq_tokens(4, 2))) == 4
        s = st.stat()
        assert s["tier_up"] == 0 and s["tier_misses"] > 0
    text = open(d + "/TIER").read()
    assert "tenant py\n" in text and "ttl_ms 60000\n" in text
    with kvx.Store.open(d, readonly=True, tier_url="off") as ro:
        assert ro.stat()["tier_hits"] == 0


# PROMISE: TIER-23
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_tier_cross_store(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        url = "redis://127.0.0.1:%d" % port
        toks = seq_tokens(9, 5)
        with kvx.Store.create(str(tmp_path / "a"), **GEOM, nosync=True, tier_url=url) as a:
            pages = kv_pages(a, 5)
            assert a.put(toks, pages) == 5
            a.flush()
        with kvx.Store.create(str(tmp_path / "b"), **GEOM, nosync=True):
            pass
        with kvx.Store.open(str(tmp_path / "b"), readonly=True, tier_url=url) as b:
            views = b.prefix(toks)
            assert len(views) == 5
            for i, v in enumerate(views):
                assert bytes(v) == pages[i].tobytes()
            s = b.stat()
            assert s["tier_hits"] == 5 and s["tier_up"] == 1 and s["blocks"] == 0
    finally:
        srv.kill()
        srv.wait()
