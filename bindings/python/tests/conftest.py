"""Shared fixtures of the Python binding's tests.

Run against the build tree (`PYTHONPATH=build/python /usr/bin/python3 -m
pytest bindings/python/tests`, ctest's python_binding), or against an
installed kvx (scripts/test-python.sh: every interpreter, from a wheel).
The fixtures need no numpy: tokens are array('I'), pages are Pages (bytes);
numpy exists only for Debian's /usr/bin/python3, so a test of the numpy
interop is marked needs_numpy and skipped elsewhere with that reason, and
each behaviour it checks is also checked by a numpy-free test.

KVX_TEST_EXPECT_KVX_UNDER=DIR (set by scripts/test-python.sh): kvx must be
imported from under DIR (the venv's site-packages), never the checkout.
"""
import array
import os
import random
import subprocess
import sys
import textwrap

import pytest

import kvx

try:
    import numpy as np
except ImportError:  # every interpreter but Debian's /usr/bin/python3
    np = None

NUMPY_MISSING = ("numpy is not installed for %s (only Debian's /usr/bin/python3 has python3-numpy): this test "
                 "is of the numpy interop; a numpy-free test checks the same behaviour" % sys.executable)
needs_numpy = pytest.mark.skipif(np is None, reason=NUMPY_MISSING)



def np_param(make, id):
    """A parametrize case that needs numpy: make(np) where numpy is installed, else the same case skipped with
    NUMPY_MISSING (listed as skipped, never dropped)."""
    if np is None:
        return pytest.param(None, id=id, marks=pytest.mark.skip(reason=NUMPY_MISSING))
    return pytest.param(make(np), id=id)


HERE = os.path.dirname(os.path.abspath(__file__))

# One layer, two KV heads, D = 8, B = 16, fp16: 1 KiB pages.
GEOM = dict(num_layers=1, kv_heads=2, head_dim=8, block_tokens=16)
B = GEOM["block_tokens"]

_FINITE_HIGH = bytes(x & 0xBF for x in range(256))  # an fp16 high byte without the top exponent bit: |x| < 2


def pytest_report_header(config):
    where = os.path.dirname(kvx.__file__)
    return ["kvx %s from %s (extension %s)" % (kvx.__version__, where, os.path.basename(kvx._kvx.__file__)),
            "numpy: " + (np.__version__ if np else "not installed (numpy tests skip)")]


def pytest_configure(config):
    want = os.environ.get("KVX_TEST_EXPECT_KVX_UNDER")
    if want and not os.path.realpath(kvx.__file__).startswith(os.path.realpath(want) + os.sep):
        raise pytest.UsageError("kvx was imported from %s, not from under %s (the installed package)"
                                % (kvx.__file__, want))


def seq_tokens(s, n_blocks, extra=5):
    """Token ids of sequence s (as bench_prefix_c.c): n_blocks full blocks plus a partial tail, as array('I')
    (4-byte ids: used in place by the binding)."""
    return array.array("I", (((s * 1000003 + i * 7919 + 1) & 0xFFFFFF) + 1 for i in range(n_blocks * B + extra)))


def rand_bytes(seed, n):
    """n random bytes (a bytearray), the same for the same seed on every interpreter."""
    return bytearray(random.Random(seed).randbytes(n))


class Pages(bytes):
    """Pages of KV as one bytes object: a buffer the binding reads as raw bytes, indexed, sliced and iterated
    by page as the [block][K|V][L][Hkv][B][D] array it stands for (pages[i].tobytes(), pages[:2], for p in
    pages). len() is the number of pages."""

    def __new__(cls, data, page_bytes):
        o = super().__new__(cls, data)
        assert page_bytes > 0 and bytes.__len__(o) % page_bytes == 0
        o.page_bytes = page_bytes
        return o

    def __len__(self):
        return bytes.__len__(self) // self.page_bytes

    def __getitem__(self, i):
        pb, n = self.page_bytes, len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            assert step == 1, "Pages: a slice with a step"
            return Pages(bytes.__getitem__(self, slice(start * pb, max(start, stop) * pb)), pb)
        i = i.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("page %d of %d" % (i, n))
        return Pages(bytes.__getitem__(self, slice(i * pb, (i + 1) * pb)), pb)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def tobytes(self):
        return bytes(self)


def kv_pages(store, n_blocks, seed=0):
    """n_blocks pages of random finite fp16 values (its bits, little-endian), as Pages."""
    data = rand_bytes(seed, n_blocks * store.page_bytes)
    data[1::2] = data[1::2].translate(_FINITE_HIGH)
    return Pages(data, store.page_bytes)


def as_array(pages, store):
    """numpy tests only: Pages (or bytes) as the float16 array [block][K|V][L][Hkv][B][D] they stand for."""
    g = store.geometry
    shape = (-1, 2, g["num_layers"], g["kv_heads"], g["block_tokens"], g["head_dim"])
    return np.frombuffer(bytes(pages), dtype=np.float16).reshape(shape).copy()


def damage_page(d, page):
    """Flips one byte of page inside the file under d that holds it (a store's shard); returns that file."""
    for root, _, files in os.walk(d):
        for f in files:
            fn = os.path.join(root, f)
            with open(fn, "r+b") as fh:
                data = fh.read()
                at = data.find(page)
                if at >= 0:
                    fh.seek(at + 100)
                    fh.write(bytes([data[at + 100] ^ 0xFF]))
                    return fn
    raise AssertionError("page not found in any file")


def run_child(code, timeout=60):
    """Runs code in a fresh interpreter (the tests' directory and this sys.path): (returncode, output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture
def store(tmp_path):
    with kvx.Store.create(str(tmp_path / "store"), **GEOM, nosync=True) as st:
        yield st


@pytest.fixture
def filled(store):
    """The store with sequence 0's four blocks flushed; yields (store, tokens, pages)."""
    toks = seq_tokens(0, 4)
    pages = kv_pages(store, 4)
    assert store.put(toks, pages) == 4
    store.flush()
    return store, toks, pages
