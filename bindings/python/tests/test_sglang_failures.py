"""Failures that never kill SGLang's cache: the pinned controller's backup
and prefetch threads catch only queue.Empty, so whatever the backend raises
ends the thread for the life of the process. A runtime failure (ENOSPC, a
full or closed store) is answered as upstream's backends answer it (False,
[False] * n, 0, None), and the backend works again once the cause is gone."""
import array
import ctypes
import errno
import os
import random
import uuid

import pytest

import kvx
from kvx.integrations.sglang import KvxHiCacheStorage
from sglang_driver import (MHAHostPool, StorageThreads, create_dynamic_backend, page_hashes, storage_config,
                           storage_hit_query)

PAGE = 4


def extra(path, **kw):
    e = {"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
         "interface_v1": 1, "path": str(path), "page_bytes": 65536, "capacity": "64MiB", "nosync": True}
    e.update(kw)
    return e


def prompt(n_pages, seed):
    rng = random.Random(seed)
    return [rng.randrange(150000) for _ in range(n_pages * PAGE)]


def indices(pool, pages):
    out = array.array("q")
    for p in pages:
        out.extend(pool.page_indices(p))
    return out


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs mounted for the test by mount(2) (no mount binary needed: the standalone wheel test runs in a
    chroot without one). CI runs as root; where mounting is refused the test is skipped, naming why."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"kvx-test", os.fsencode(mnt), b"tmpfs", ctypes.c_ulong(0), b"size=4m,mode=0700") != 0:
        err = ctypes.get_errno()
        pytest.skip(f"cannot mount a tmpfs here: mount(2): {os.strerror(err)} (needs root or CAP_SYS_ADMIN, as CI "
                    "has)")
    try:
        yield mnt
    finally:
        libc.umount2(os.fsencode(mnt), 2)  # MNT_DETACH


def fill_fs(path):
    """Fill the file system of path with a file (its path) until ENOSPC."""
    f = os.path.join(path, "filler-" + uuid.uuid4().hex)
    with open(f, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return f


# PROMISE: ENGINE-17
def test_enospc_during_backup_never_kills_the_threads(small_tmpfs):
    """The store's file system fills up during a backup: batch_set_v1 answers [False] * n (the controller's
    backup stops that operation and logs), the backup and prefetch threads live on, pages stored before are
    still prefetched, and once space is freed the same pages are backed up and read back. Raising ENOSPC ended
    the backup thread, and with it L3, for the life of the process."""
    pool = MHAHostPool(page_size=PAGE, pages=64)
    b = create_dynamic_backend(storage_config(extra(small_tmpfs / "l3")), pool)
    th = StorageThreads(b, PAGE)
    try:
        first, second = page_hashes(prompt(4, 1), PAGE), page_hashes(prompt(6, 2), PAGE)
        for p in range(10):
            pool.fill_page(p, seed=p)
        assert th.backup(first, indices(pool, range(4))) == 4
        filler = fill_fs(small_tmpfs)
        assert b.batch_set_v1(second, indices(pool, range(4, 10))) == [False] * 6
        assert th.backup(second, indices(pool, range(4, 10))) == 0
        assert th.alive(), th.errors
        assert th.prefetch(first, indices(pool, range(20, 24))) == 4
        assert [pool.page_bytes_of(p) for p in range(20, 24)] == [pool.page_bytes_of(p) for p in range(4)]
        assert b.batch_exists(second) == 0
        stats = b.get_stats().kvx
        assert stats["failed_sets"] >= 2 and "ENOSPC" in stats["last_failure"]
        os.unlink(filler)
        assert th.backup(second, indices(pool, range(4, 10))) == 6
        assert th.prefetch(second, indices(pool, range(30, 36))) == 6
        assert [pool.page_bytes_of(p) for p in range(30, 36)] == [pool.page_bytes_of(p) for p in range(4, 10)]
        assert th.alive(), th.errors
    finally:
        th.close()
        b.close()


# PROMISE: ENGINE-17
def test_a_batch_over_capacity_is_a_failed_write(tmp_path):
    """A backup batch larger than the store's capacity (KVX_ECAPACITY) is [False] * n and the thread lives on;
    smaller batches are stored after it."""
    pool = MHAHostPool(page_size=PAGE, pages=128, dim=1024)  # 32 KiB buffers, 64 KiB pages
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3", capacity="1MiB")), pool)
    th = StorageThreads(b, PAGE)
    try:
        big = page_hashes(prompt(24, 3), PAGE)  # 1.5 MiB of pages in one batch
        assert b.batch_set_v1(big, indices(pool, range(24))) == [False] * 24
        assert th.backup(big, indices(pool, range(24))) == 0 and th.alive(), th.errors
        few = page_hashes(prompt(2, 4), PAGE)
        assert th.backup(few, indices(pool, range(2))) == 2
        assert th.prefetch(few, indices(pool, range(40, 42))) == 2
    finally:
        th.close()
        b.close()


# PROMISE: ENGINE-17
def test_a_closed_store_answers_misses_and_failed_writes(tmp_path):
    """After close() every call answers as a miss or a failed write (0, [False] * n, None, False), never an
    exception a controller thread would die of; close() is idempotent."""
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3")), pool)
    hashes = page_hashes(prompt(2, 5), PAGE)
    for p in range(2):
        pool.fill_page(p, seed=p)
    assert b.batch_set_v1(hashes, indices(pool, range(2))) == [True, True]
    b.close()
    b.close()
    assert b.batch_exists(hashes) == 0 and b.exists(hashes[0]) is False
    assert storage_hit_query(b, prompt(2, 5), PAGE) == ([], 0)
    assert b.batch_get_v1(hashes, indices(pool, range(4, 6))) == [False, False]
    assert b.batch_set_v1(hashes, indices(pool, range(2))) == [False, False]
    assert b.get(hashes[0]) is None and b.batch_get(hashes) == [None, None]
    assert b.set("k", b"x") is False and b.batch_set(["k"], [b"x"]) is False
    assert b.get_stats().kvx["failed_gets"] == 3


def test_bad_input_still_raises(tmp_path):
    """Programming errors raise kvx.InvalidError (as upstream's backends raise for them): a bad key, a page
    over page_bytes, counts that differ, no host pool."""
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3")), pool)
    try:
        with pytest.raises(kvx.InvalidError):
            b.batch_get_v1([""], indices(pool, [0]))
        with pytest.raises(kvx.InvalidError):
            b.batch_set_v1(["x" * 256], indices(pool, [0]))
        with pytest.raises(kvx.InvalidError):
            b.set("big", bytearray(65537))
        with pytest.raises(kvx.InvalidError):
            b.batch_get_v1(["a", "b"], indices(pool, [0]))
    finally:
        b.close()
    bare = KvxHiCacheStorage(storage_config(extra(tmp_path / "bare")), {})
    try:
        with pytest.raises(kvx.InvalidError, match="no host pool"):
            bare.batch_get_v1(["a"], indices(pool, [0]))
    finally:
        bare.close()
