"""os.fork() with a store open: the child can neither use nor close the
parent's handles (kvx.h: a handle is not used in a child), its exit leaves
the parent's store intact, and views stay readable in the child."""
import os

import kvx
from conftest import GEOM, B, kv_pages, run_child, seq_tokens


# PROMISE: PY-4
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


# PROMISE: PY-4
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
