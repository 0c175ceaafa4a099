"""kvx as an LMCache L2 store: the "native_plugin" connector contract.

LMCache (multiprocess mode) loads a third-party connector from its config::

    --l2-adapter '{"type": "native_plugin",
                   "module_path": "kvx.integrations.lmcache",
                   "class_name": "KvxConnector",
                   "adapter_params": {"path": "/var/cache/kvx-lmcache",
                                      "page_bytes": 33554432, "capacity": "64GiB"}}'

constructs ``KvxConnector(**adapter_params)`` and wraps it in its own
``NativeConnectorL2Adapter``, which polls ``event_fd()``, calls
``drain_completions()`` and routes each completion by its future id.

Contract mirrored (LMCache/LMCache, as read for this module; docs/ENGINES.md
names the files and commits): docs/source/developer_guide/extending_lmcache/
native_connectors.rst ("Required Connector Interface"),
lmcache/v1/distributed/l2_adapters/native_plugin_l2_adapter.py (loading,
required methods) and native_connector_l2_adapter.py (how completions are
consumed), csrc/storage_backends/connector_base.h and
connector_pybind_utils.h (the reference semantics: future ids from 1, one
eventfd, completion tuples ``(future_id, ok, error, bools or None)``, per-key
bools for get, exists and delete, None for set, an empty key list refused at
submission).

Shape: submissions validate their arguments at once (a bad key or size
raises kvx.InvalidError and queues nothing), take the buffers, queue the
operation and return its future id; worker threads (one writer lane for
sets and deletes, reader threads for gets and exists) run the operations
through the kvx binding (one C call per batch, GIL released) and post
completions, signalling the one eventfd. A set completes ok only after
its own write batch's flush returned 0: its pages are durable. A get copies
each held page into its buffer (lengths must match) and reports True; a
miss reports False and leaves that buffer untouched.

Keys: str or bytes of 1..page_bytes bytes; over 255 (kvx.KEY_MAX) one is
stored under a digest with the full key kept beside its page and compared
on every read (see _LONG). Buffers: any C-contiguous buffer; byte views of
a single-byte unsigned format ("B", LMCache's MemoryObj.byte_array "<B")
are taken as they are, others cast to bytes. For LMCache's usage report
after a restart, see kvx.integrations.lmcache_l2 (the "plugin" type).
"""
import collections
import hashlib
import os
import queue
import threading

import kvx

from . import _common

__all__ = ["KvxConnector"]

_GET, _SET, _EXISTS, _DELETE = "get", "set", "exists", "delete"
_STOP = object()

# Keys over 255 bytes (kvx.KEY_MAX): LMCache's key is the model name (a local snapshot path runs to ~120 bytes) plus
# ~76 bytes of chunk fields plus the salt. Such a key's page is stored under _LONG + SHA-256(key) and the full key
# is kept beside it, as its own keyed page under that digest + _KEYPAGE, written in the same flushed batch; every
# get, exists and delete reads the key page and compares it with the key asked for, so one key never serves
# another's page even were two digests equal. Keys beginning with _RESERVED are the store's own: refused.
_RESERVED = b"\x00kvx-"
_LONG = b"\x00kvx-lk\x00"
_KEYPAGE = b"\x00key"
_BYTE_FORMATS = frozenset(("B", "<B", ">B", "=B", "!B", "@B"))  # one unsigned byte (MemoryObj.byte_array: "<B")


def _long_digest(key):
    """The digest a long key's page is stored under (a module function: tests force collisions through it)."""
    return hashlib.sha256(b"kvx-lmcache-long-key\0" + key).digest()


def _rank_tag(rank):
    """rank: the adapter param, else $KVX_RANK, else torchrun's $RANK, else 0."""
    if rank is None:
        rank = os.environ.get("KVX_RANK", os.environ.get("RANK", "0"))
    return "rank" + _common.tag_safe(rank)


class KvxConnector:
    """LMCache native_plugin connector over a kvx keyed store (see the module doc).

    Adapter params: path (required), page_bytes (required to create the store; checked against an existing
    one), capacity (default "64GiB"), rank (default $KVX_RANK, $RANK, 0: the directory is path/rank<N>),
    per_rank_path (True: path is already this process's own directory; a "{rank}" in path is replaced by
    rank<N> instead), num_workers (default 2: one writer thread for sets and deletes, num_workers - 1 (at
    least 1) reader threads for gets and exists), nosync (tests and benchmarks only), verify.

    Namespace (optional; _common.namespace, as the SGLang adapter's): model, revision (default: a digest of
    model_path's config files, else none, said once in the log), model_path, dtype, chunk_size, layout, and
    namespace (a dict of any other fields that change a chunk's bytes). When any is given the directory is
    path/<model>_rank<N>_<digest16> and the store records the namespace: a changed one opens another store, a
    hand-named directory (per_rank_path, "{rank}") of another is refused with kvx.ShapeError. None given: the
    directory is path/rank<N> as before (LMCache's keys name the model, not its revision, dtype or layout).
    """

    def __init__(self, path=None, page_bytes=None, capacity="64GiB", rank=None, per_rank_path=False,
                 num_workers=2, nosync=False, verify=False, model=None, revision=None, model_path=None, dtype=None,
                 chunk_size=None, layout=None, namespace=None):
        num_workers = int(num_workers)
        if num_workers <= 0:
            raise ValueError("kvx: num_workers must be > 0")
        tag = _rank_tag(rank)
        self.namespace = None  # (digest, record) when the params name one
        if any(v not in (None, "", {}) for v in (model, revision, model_path, dtype, chunk_size, layout, namespace)):
            if not page_bytes:
                raise ValueError("kvx: page_bytes is part of the store's namespace: give it with model/revision/...")
            fields = dict(namespace or {})
            fields.update({"engine": "lmcache", "model": model, "page_bytes": int(page_bytes), "dtype": dtype,
                           "chunk_size": chunk_size, "layout": layout,
                           "revision": _common.model_revision(model, revision, model_path, "lmcache")})
            self.namespace = _common.namespace(fields)
            tag = ((_common.tag_safe(model.replace("/", "-")) + "_") if model else "") + tag + "_" + self.namespace[0]
        self.dir = _common.store_dir(path, tag, per_rank_path)
        self._store = _common.open_keyed_store(self.dir, page_bytes, capacity, nosync=nosync, verify=verify)
        self.page_bytes = self._store.page_bytes
        try:
            if self.namespace is not None:
                self._record_namespace()
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except BaseException:
            self._store.close()
            raise
        self._mu = threading.Lock()  # future ids, completions, closed
        self._pid = os.getpid()  # a forked child's copy is unusable: its lock may be held by a thread it lacks
        self._next_id = 1
        self._done = collections.deque()
        self._closed = False
        # Two lanes, as LMCache's own connectors have per-op lanes: gets and exists on reader threads,
        # sets and deletes on one writer thread, so a load never waits behind a store's fsync and the
        # reader that copies into the caller's buffers stays the same thread (warm caches).
        self._rq, self._wq = queue.SimpleQueue(), queue.SimpleQueue()
        self._lanes = lanes = [self._wq] + [self._rq] * max(1, num_workers - 1)
        self._workers = [threading.Thread(target=self._work, args=(q,), name=f"kvx-lmcache-{i}", daemon=True)
                         for i, q in enumerate(lanes)]
        for t in self._workers:
            t.start()

    # ---- the contract ------------------------------------------------------

    def event_fd(self):
        """The eventfd that becomes readable when completions are waiting (-1 once closed)."""
        return self._efd

    def submit_batch_get(self, keys, memoryviews):
        """Copy each key's page into its buffer (writable, the page's length). -> future id; the completion's
        bools say which keys were copied (a miss: False, its buffer untouched)."""
        ks, longs = self._keys(keys, "submit_batch_get")
        bufs = self._buffers(memoryviews, len(ks), writable=True, what="submit_batch_get")
        return self._submit(_GET, ks, bufs, longs)

    def submit_batch_set(self, keys, memoryviews):
        """Store each buffer (1..page_bytes bytes, read in place) under its key. -> future id; the completion
        is ok once every page is durable (its flush returned 0); keys already held are kept as they are."""
        ks, longs = self._keys(keys, "submit_batch_set")
        bufs = self._buffers(memoryviews, len(ks), writable=False, what="submit_batch_set")
        return self._submit(_SET, ks, bufs, longs)

    def submit_batch_exists(self, keys):
        """-> future id; the completion's bools say which keys are held."""
        ks, longs = self._keys(keys, "submit_batch_exists")
        return self._submit(_EXISTS, ks, None, longs)

    def submit_batch_delete(self, keys):
        """Delete the keys' pages (the owner's delete). -> future id; bools: True where a page was deleted."""
        ks, longs = self._keys(keys, "submit_batch_delete")
        return self._submit(_DELETE, ks, None, longs)

    def drain_completions(self):
        """Every completion posted so far, oldest first: [(future_id, ok, error, [bool] or None)]. Clears the
        eventfd first, so a completion posted meanwhile signals it again."""
        if os.getpid() != self._pid:
            return []  # a forked child's copy: nothing of the parent's is completed here
        with self._mu:
            if self._closed:
                return []
            try:
                os.eventfd_read(self._efd)
            except BlockingIOError:
                pass
            out = list(self._done)
            self._done.clear()
        return out

    def close(self):
        """Stop: the operations being run finish, the queued ones are dropped (never completed: a set not
        completed was never acknowledged), then the store and the eventfd close. After close returns no
        buffer given to a submission is read or written again. Idempotent."""
        if os.getpid() != self._pid:  # a forked child's copy: the parent's threads and store are the parent's
            self._closed = True
            return
        with self._mu:
            if self._closed:
                return
            self._closed = True
        for lane in self._lanes:
            lane.put(_STOP)  # one stop per thread, on its own lane
        for t in self._workers:
            if t is not threading.current_thread():
                t.join()
        self._store.close()  # unflushed puts (none: each set flushes) dropped
        with self._mu:
            self._done.clear()
            efd, self._efd = self._efd, -1
        os.close(efd)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _keep_namespace(self):
        """After a flush: the namespace record again if its eviction took it (_common.keep_namespace)."""
        if self.namespace is not None:
            _common.keep_namespace(self._store, self.namespace[1])

    def _record_namespace(self):
        """Record this connector's namespace in a store holding none; refuse one that records another."""
        rec = _common.read_namespace(self._store)
        if rec is None:
            with self._store.batch() as b:
                b.keyed_put([_common.NAMESPACE_KEY], [self.namespace[1]])
        elif rec != self.namespace[1]:
            _common.raise_kvx(kvx.ShapeError, kvx.ESHAPE,
                              f"{self.dir} holds the pages of another namespace ({rec.decode(errors='replace')}), "
                              f"not this connector's ({self.namespace[1].decode()}): give another path")

    # ---- submission ---------------------------------------------------------

    def _keys(self, keys, what):
        """-> (the store's keys, longs): longs is None, or [(index, key page's key, full key)] for the keys over
        255 bytes, whose store key is their digest (see _LONG)."""
        if type(keys) is list and keys:  # the common case, checked in bulk; any doubt: the exact path below
            try:
                kb = [k.encode() if type(k) is str else (k if type(k) is bytes else None) for k in keys]
                lens = list(map(len, kb))
                if min(lens) >= 1 and max(lens) <= min(_common.KEY_MAX, self.page_bytes) and \
                        not any(k.startswith(_RESERVED) for k in kb):
                    return kb, None
            except (TypeError, UnicodeError, AttributeError):
                pass
        if isinstance(keys, (str, bytes)):
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: keys is a list of keys, not one key")
        try:
            keys = list(keys)
        except TypeError:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: keys is not a list of keys")
        if not keys:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: keys list is empty")
        out, longs = [], []
        for i, k in enumerate(keys):
            b = _common.key_bytes(k, i, max_len=self.page_bytes)  # a long key's page holds it: 1..page_bytes
            if b.startswith(_RESERVED):
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"{what}: keys[{i}] begins with {_RESERVED!r}, the store's own keys")
            if len(b) > _common.KEY_MAX:
                d = _LONG + _long_digest(b)
                longs.append((i, d + _KEYPAGE, b))
                b = d
            out.append(b)
        return out, (longs or None)

    def _buffers(self, bufs, n, writable, what):
        if type(bufs) is list and len(bufs) == n:  # the common case: byte memoryviews, checked in bulk
            try:
                ms = list(map(memoryview, bufs))
                if all(m.c_contiguous and m.ndim == 1 and m.itemsize == 1 and m.format in _BYTE_FORMATS
                       and not (writable and m.readonly) for m in ms):
                    sizes = [m.nbytes for m in ms]
                    if min(sizes) >= 1 and max(sizes) <= self.page_bytes:
                        return ms
            except (TypeError, ValueError):  # any doubt (a released view): the exact path below names it
                pass
        try:
            bufs = list(bufs)
        except TypeError:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: memoryviews is not a list of buffers")
        if len(bufs) != n:
            _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: {n} keys but {len(bufs)} memoryviews")
        out = []
        for i, b in enumerate(bufs):
            try:
                m = memoryview(b)
            except (TypeError, ValueError):  # ValueError: a released memoryview
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID, f"{what}: memoryviews[{i}] is not a buffer "
                                  "(or was released)")
            if not m.c_contiguous or (writable and m.readonly):
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"{what}: memoryviews[{i}] is not a contiguous{' writable' if writable else ''} "
                                  "buffer")
            m = m.cast("B") if m.ndim != 1 or m.format != "B" else m
            if not 1 <= m.nbytes <= self.page_bytes:
                _common.raise_kvx(kvx.InvalidError, kvx.EINVALID,
                                  f"{what}: memoryviews[{i}] holds {m.nbytes} bytes (a page is 1..{self.page_bytes})")
            out.append(m)
        return out

    def _submit(self, op, keys, bufs, longs=None):
        if os.getpid() != self._pid:  # never its lock: a parent thread may have held it at the fork
            raise ValueError("kvx: this connector belongs to the parent of a fork: open one in the child")
        with self._mu:
            if self._closed:
                raise ValueError("kvx: the connector is closed")
            fid = self._next_id
            self._next_id += 1
            (self._rq if op in (_GET, _EXISTS) else self._wq).put((fid, op, keys, bufs, longs))
        return fid

    # ---- the workers --------------------------------------------------------

    def _work(self, lane):
        batch = None  # this worker's write batch: its flush acknowledges exactly its own sets
        try:
            while True:
                item = lane.get()
                if item is _STOP or self._closed:
                    break
                fid, op, keys, bufs, longs = item
                try:
                    if longs is not None:
                        if op == _SET and batch is None:
                            batch = self._store.batch()
                        res = (fid, True, "", self._run_long(op, keys, bufs, longs, batch))
                    elif op == _GET:
                        res = (fid, True, "", self._store.keyed_get_into(keys, bufs))
                    elif op == _SET:
                        if batch is None:
                            batch = self._store.batch()
                        batch.keyed_put(keys, bufs)
                        batch.flush()  # 0: durable; only now is the set ok
                        self._keep_namespace()
                        res = (fid, True, "", None)
                    elif op == _EXISTS:
                        res = (fid, True, "", self._store.keyed_exists(keys)[0])
                    else:  # delete: per key, was a copy (sound or damaged) deleted (one locked C pass)
                        res = (fid, True, "", self._store.keyed_delete(keys, each=True))
                except Exception as e:  # any failure is this batch's failed completion, never a dead worker
                    bools = [False] * len(keys) if op != _SET else None
                    res = (fid, False, str(e) or type(e).__name__, bools)
                    if op == _SET and batch is not None:  # its unflushed pages are dropped: start afresh
                        batch.close()
                        batch = None
                item = bufs = longs = None  # the buffers are not touched after this
                with self._mu:
                    if self._closed:
                        break
                    self._done.append(res)
                    os.eventfd_write(self._efd, 1)
        finally:
            if batch is not None:
                batch.close()

    # ---- keys over 255 bytes ----------------------------------------------------

    def _owned(self, longs):
        """{index: True where the key page beside the digest's page holds exactly this key}."""
        views = self._store.keyed_get([kk for _, kk, _ in longs])
        own = {}
        for (i, _, full), v in zip(longs, views):
            if v is None:
                own[i] = False
            else:
                with v:
                    own[i] = bytes(v.page) == full
        return own

    def _run_long(self, op, keys, bufs, longs, batch):
        """One batch holding keys over 255 bytes. get/exists/delete -> [bool]; set (on the writer's batch) -> None."""
        if op == _SET:  # the key pages in the same batch as the pages: one flush makes both durable
            batch.keyed_put(list(keys) + [kk for _, kk, _ in longs], list(bufs) + [full for _, _, full in longs])
            batch.flush()
            self._keep_namespace()
            return None
        own = self._owned(longs)
        idx = [j for j in range(len(keys)) if own.get(j, True)]  # a digest's page another key owns: a miss
        out = [False] * len(keys)
        if not idx:
            return out
        if op == _GET:
            got = self._store.keyed_get_into([keys[j] for j in idx], [bufs[j] for j in idx])
        elif op == _EXISTS:
            got = self._store.keyed_exists([keys[j] for j in idx])[0]
        else:  # delete: the page and, where this key owns it, its key page
            kps = [kk for i, kk, _ in longs if own[i]]
            got = self._store.keyed_delete([keys[j] for j in idx] + kps, each=True)[:len(idx)]
        for j, g in zip(idx, got):
            out[j] = bool(g)
        return out
