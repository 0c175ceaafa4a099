"""Reference counts of the singletons the extension returns: every None,
True and False it hands back carries its own reference. (The abi3
extension built with Python 3.12's or 3.13.0's headers returned None
without one: on 3.11, where None is not immortal, each call took a
reference from it and the interpreter died at exit, none_dealloc. On 3.12
and later the singletons are immortal and the counts never move.)"""
import sys

from conftest import kv_pages, seq_tokens

N = 2000


def singleton_counts():
    return sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)


def test_returned_singletons_keep_their_references(filled, tmp_path):
    st, toks, _ = filled
    b = st.batch()
    b.put(seq_tokens(7, 1), kv_pages(st, 1, seed=7))
    v = st.prefix(toks)[0]
    calls = [
        st.flush,  # None
        b.flush,  # None
        v.release,  # None (idempotent)
        lambda: v.__exit__(None, None, None),  # None
        lambda: st.get_hashes([12345]),  # [None]
        lambda: st.closed, lambda: st.readonly, lambda: st.keyed, lambda: v.released, lambda: b.closed,
        lambda: st.batch().__exit__(None, None, None),  # False, after a flush and a close
    ]
    for call in calls:  # warm up: caches, interned objects
        call()
    before = singleton_counts()
    for _ in range(N):
        for call in calls:
            call()
    after = singleton_counts()
    b.close()
    st.close()
    for _ in range(N):
        st.close()  # None, on a closed store
        b.close()  # None, on a closed batch
    closed = singleton_counts()
    # a lost reference per call would move a count by N or more; a few references come and go meanwhile
    assert all(abs(a - c) < N // 10 for a, c in zip(before, after)), (before, after)
    assert all(abs(a - c) < N // 10 for a, c in zip(after, closed)), (after, closed)
