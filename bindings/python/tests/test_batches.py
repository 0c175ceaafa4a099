"""Write batches: per-writer acknowledgement, context manager, threads."""
import threading

import pytest

import kvx
from conftest import kv_pages, seq_tokens


# PROMISE: DUR-8, PY-7
def test_batch_flush_publishes_only_its_blocks(store):
    b = store.batch()
    t1 = seq_tokens(1, 3)
    assert b.put(t1, kv_pages(store, 3, seed=1)) == 3
    assert store.prefix(t1) == []  # not visible before its flush
    t2 = seq_tokens(2, 2)
    store.put(t2, kv_pages(store, 2, seed=2))
    b.flush()
    assert len(store.prefix(t1)) == 3
    assert store.prefix(t2) == []  # the built-in batch is not flushed by b
    store.flush()
    assert len(store.prefix(t2)) == 2
    b.close()
    b.close()
    assert b.closed
    with pytest.raises(ValueError):
        b.flush()


# PROMISE: PY-7
def test_batch_context_manager(store):
    t1, t2 = seq_tokens(3, 2), seq_tokens(4, 2)
    with store.batch() as b:
        b.put(t1, kv_pages(store, 2, seed=3))
    assert b.closed and len(store.prefix(t1)) == 2  # flushed on exit
    with pytest.raises(RuntimeError):
        with store.batch() as b:
            b.put(t2, kv_pages(store, 2, seed=4))
            raise RuntimeError("boom")
    assert b.closed and store.prefix(t2) == []  # dropped on the exception


# PROMISE: DUR-13
def test_batch_after_store_close(store):
    b = store.batch()
    b.put(seq_tokens(5, 1), kv_pages(store, 1))
    store.close()  # the batch is detached: its unflushed blocks dropped
    with pytest.raises(ValueError, match="batch's store is closed"):  # misuse, as for the store (PY-1)
        b.flush()
    b.close()


def test_batches_in_threads(store):
    errors = []

    def writer(k):
        try:
            with store.batch() as b:
                for s in range(k * 10, k * 10 + 10):
                    b.put(seq_tokens(s, 2), kv_pages(store, 2, seed=s))
                    if s % 3 == 0:
                        b.flush()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for s in range(30):
        views = store.prefix(seq_tokens(s, 2))
        assert [bytes(v) for v in views] == [p.tobytes() for p in kv_pages(store, 2, seed=s)]


# PROMISE: PY-7
def test_batch_with_block_raising_drops_its_blocks(store):
    toks, pages = seq_tokens(4, 2), kv_pages(store, 2)
    with pytest.raises(RuntimeError):
        with store.batch() as b:
            assert b.put(toks, pages) == 2
            raise RuntimeError("mid-batch")
    assert b.closed
    assert store.prefix(toks) == []
    with pytest.raises(ValueError, match="closed"):
        b.put(toks, pages)
    with pytest.raises(ValueError, match="closed"):
        b.__enter__()


# PROMISE: PY-3
def test_one_batch_shared_by_threads(store):
    # a kvx_store_batch belongs to one thread at a time: the binding's lock
    # serializes the threads, every block put is flushed exactly once
    b = store.batch()
    seqs = list(range(10, 18))

    def writer(q):
        t = seq_tokens(q, 3)
        assert b.put(t, kv_pages(store, 3, seed=q)) == 3
        b.flush()

    ts = [threading.Thread(target=writer, args=(q,)) for q in seqs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    b.close()
    for q in seqs:
        vs = store.prefix(seq_tokens(q, 3))
        assert [bytes(v) for v in vs] == [p.tobytes() for p in kv_pages(store, 3, seed=q)]
