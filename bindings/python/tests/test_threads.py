"""Threads: lookups from several threads at once, with the GIL released."""
import array
import threading
import time

from conftest import B, kv_pages, seq_tokens


# PROMISE: PY-3
def test_two_threads_lookups(store):
    seqs = {s: seq_tokens(s, 4) for s in range(16)}
    for s, t in seqs.items():
        store.put(t, kv_pages(store, 4, seed=s))
    store.flush()
    want = {s: [p.tobytes() for p in kv_pages(store, 4, seed=s)] for s in seqs}
    bad = []

    def reader(k):
        for r in range(300):
            s = (r * 7 + k) % 16
            views = store.prefix(seqs[s])
            if [bytes(v) for v in views] != want[s]:
                bad.append((k, s))

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


# PROMISE: PY-3
def test_lookup_releases_the_gil(store):
    toks = [seq_tokens(s, 8, extra=0) for s in range(32)]
    for s in range(32):
        store.put(toks[s], kv_pages(store, 8, seed=s))
    rows = array.array("I")
    for t in toks:
        rows.extend(t)
    store.flush()
    ticks = [0]
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    # one C call of many lookups (tens of ms): the ticker runs meanwhile
    # only if the call released the GIL
    passes = 1
    while True:
        before = ticks[0]
        secs = store._c_prefix_loop(rows, 8 * B, passes)
        during = ticks[0] - before
        if sum(secs) > 0.05 or passes >= 512:
            break
        passes *= 2
    stop.set()
    t.join()
    assert during > 0, (during, secs)


# PROMISE: PY-3
def test_close_while_threads_look_up(store):
    toks = seq_tokens(0, 4)
    pages = kv_pages(store, 4)
    store.put(toks, pages)
    store.flush()
    held, errors = [], []
    go = threading.Event()

    def reader():
        go.wait()
        while True:
            try:
                views = store.prefix(toks)
            except ValueError:  # closed: the only answer after close
                return
            except Exception as e:  # noqa: BLE001
                errors.append(e)
                return
            held.append(views[-1])

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    go.set()
    time.sleep(0.05)
    store.close()  # waits for lookups in flight
    for t in threads:
        t.join()
    assert not errors and held
    assert all(bytes(v) == pages[3].tobytes() for v in held)  # still mapped after close
