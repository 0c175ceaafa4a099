"""Release and close racing every accessor, from other threads, many times:
each access answers the page that was put or raises ValueError, never reads
freed memory (the Python counterpart of bindings/go/release_test.go; run
plain and under ASan by ctest). Needs no numpy."""
import array
import threading

import kvx

# 2 MiB pages: a copy long enough to overlap a release
BIG = dict(num_layers=32, kv_heads=8, head_dim=128, block_tokens=16)
ITERATIONS = 200


def _tokens(seed, n):
    return array.array("I", [(seed * 1000003 + i * 7919 + 1) & 0xFFFFFF for i in range(n)])


def _big_store(tmp_path):
    d = str(tmp_path / "big")
    toks = _tokens(5, 16 + 5)
    with kvx.Store.create(d, **BIG, nosync=True) as st:
        page = bytes((i * 31 + 7) & 0xFF for i in range(st.page_bytes))
        assert st.put(toks, page) == 1
        st.flush()
    return d, toks, page


def _race(access, stops):
    """Runs access on one thread and each of stops on its own, all at once."""
    go = threading.Barrier(1 + len(stops))
    errors = []

    def run(fn):
        go.wait()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - collected, then asserted empty
            errors.append(e)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in [access, *stops]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


# PROMISE: PY-11
def test_release_and_close_race_accessors(tmp_path):
    d, toks, page = _big_store(tmp_path)
    wrong = []

    def accessors(v):
        def access():
            for _ in range(3):
                for read in (lambda: bytes(v), lambda: memoryview(v).tobytes(), lambda: v.page.tobytes()):
                    try:
                        got = read()
                    except ValueError:  # released: the one other answer
                        continue
                    if got != page:
                        wrong.append("a page that differs from the one put")
                try:
                    v.hash, v.token_count, v.coordinate, v.entry, v.scales
                except ValueError:
                    pass
        return access

    for i in range(ITERATIONS):
        st = kvx.Store.open(d, readonly=True)
        views = st.prefix(toks)
        assert len(views) == 1
        v = views[0]
        stops = [v.release, st.close] if i % 2 else [st.close, v.release]
        errors = _race(accessors(v), stops)
        assert not errors, errors[:3]
        v.release()
        st.close()
    assert not wrong, f"{len(wrong)} wrong answers, first: {wrong[0]}"


# PROMISE: PY-11
def test_close_races_lookups_and_exports(tmp_path):
    d, toks, page = _big_store(tmp_path)
    for _ in range(ITERATIONS // 2):
        st = kvx.Store.open(d, readonly=True)
        exported = []

        def lookup():
            for _ in range(4):
                try:
                    vs = st.prefix(toks)
                except ValueError:  # closed
                    return
                exported.append(memoryview(vs[0]))  # an export outlives release and close
                vs[0].release()

        errors = _race(lookup, [st.close])
        assert not errors, errors[:3]
        assert all(m.tobytes() == page for m in exported)
        for m in exported:
            m.release()
