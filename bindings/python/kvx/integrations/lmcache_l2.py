"""kvx as an LMCache L2 store through the "plugin" adapter type: an
L2AdapterInterface whose usage, key listing and status come from kvx's own
index, so LMCache's accounting and eviction see what survived a restart.

    --l2-adapter '{"type": "plugin",
                   "module_path": "kvx.integrations.lmcache_l2",
                   "class_name": "KvxL2Adapter",
                   "adapter_params": {"path": "/var/cache/kvx-lmcache",
                                      "page_bytes": 33554432, "capacity": "64GiB"}}'

The adapter params are KvxConnector's (kvx.integrations.lmcache): the I/O is
that connector's (its lanes, long keys, namespace), bridged to LMCache's
three eventfds here. What differs from the native_plugin type: LMCache's
bridge for native connectors keeps its byte accounting in process memory,
so after a restart it reports an empty L2; this adapter reads, when it
opens, every LMCache key kvx holds and its page's length (one pass over the
index and the pages: it reads the store once), reports them through
get_usage() (total and per cache_salt, capacity = the store's capacity),
list_l2_keys() and report_status(), and keeps them current as it stores and
deletes. Pages kvx evicts by itself (whole shards, beyond capacity) are
counted until the next open.

Upstream (docs/ENGINES.md names the commits): the interface and accounting
of lmcache/v1/distributed/l2_adapters/base.py, the loading of
plugin_l2_adapter.py (adapter_params as one dict, l1_memory_desc as a
keyword), the bridge of native_connector_l2_adapter.py. Where LMCache is not
importable, _lmcache_standin provides the same interface.
"""
import os
import select
import threading

from . import _common
from .lmcache import _KEYPAGE, _LONG, _RESERVED, KvxConnector

try:  # pragma: no cover - LMCache is not installable here
    from lmcache.v1.distributed.api import KeyEntry, KeyListPage, ObjectKey
    from lmcache.v1.distributed.internal_api import L2StoreResult
    from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
except ImportError:
    from ._lmcache_standin import KeyEntry, KeyListPage, L2AdapterInterface, L2StoreResult, ObjectKey

__all__ = ["KvxL2Adapter", "key_string", "parse_key"]

_STORE, _LOOKUP, _LOAD, _DELETE = "store", "lookup", "load", "delete"
_SCAN = 256  # keys per index read while counting usage


def key_string(key):
    """LMCache's ObjectKey as its native connectors name it: model@kv_rank(08x)@group(x)@chunk hash hex[@salt]."""
    base = f"{key.model_name}@{key.kv_rank:08x}@{key.object_group_id:x}@{key.chunk_hash.hex()}"
    return f"{base}@{key.cache_salt}" if key.cache_salt else base


def parse_key(s):
    """key_string's inverse -> ObjectKey, or None for a key LMCache did not name."""
    if isinstance(s, bytes):
        try:
            s = s.decode()
        except UnicodeDecodeError:
            return None
    parts = s.split("@", 4)
    if len(parts) < 4:
        return None
    try:
        return ObjectKey(model_name=parts[0], kv_rank=int(parts[1], 16), object_group_id=int(parts[2], 16),
                         chunk_hash=bytes.fromhex(parts[3]), cache_salt=parts[4] if len(parts) == 5 else "")
    except (ValueError, TypeError):
        return None


def _buffer(obj):
    """A MemoryObj's bytes (its byte_array), or the buffer itself."""
    return getattr(obj, "byte_array", obj)


class KvxL2Adapter(L2AdapterInterface):
    """LMCache L2 "plugin" adapter over KvxConnector (see the module doc)."""

    def __init__(self, config=None, l1_memory_desc=None, **params):
        p = dict(config) if isinstance(config, dict) else dict(getattr(config, "adapter_params", None) or {})
        p.update(params)
        cap = _common.parse_size(p.get("capacity", "64GiB"))
        super().__init__(max_capacity_bytes=cap)
        self._conn = KvxConnector(**p)
        self._efds = []
        try:
            self._efds = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(3)]
            self._mu = threading.Lock()
            self._pending = {}  # future id -> (op, task, keys, strings, sizes)
            self._stores, self._lookups, self._loads = {}, {}, {}
            self._deletes = {}  # task -> threading.Event
            self._sizes = {}  # key string -> (ObjectKey, bytes): the LMCache keys kvx holds, as this adapter knows
            self._next_task = 1
            self._closed = False
            self._scan()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._demux, name="kvx-lmcache-l2", daemon=True)
            self._thread.start()
        except BaseException:
            self._conn.close()
            for fd in self._efds:
                os.close(fd)
            raise

    # ---- usage from kvx's index -------------------------------------------------

    def _scan(self):
        """Count every LMCache key kvx holds and its page's length (the usage a restart would otherwise lose)."""
        st = self._conn._store
        names = []  # (store key, LMCache key string)
        longs = []
        for k in st.keyed_keys():
            if k.startswith(_LONG) and not k.endswith(_KEYPAGE):
                longs.append(k)
            elif not k.startswith(_RESERVED):
                names.append((k, k))
        for i in range(0, len(longs), _SCAN):  # a long key's name is its key page
            part = longs[i:i + _SCAN]
            for k, v in zip(part, st.keyed_get([k + _KEYPAGE for k in part])):
                if v is not None:
                    with v:
                        names.append((k, bytes(v.page)))
        keys, sizes = [], []
        for i in range(0, len(names), _SCAN):
            part = names[i:i + _SCAN]
            for (sk, name), v in zip(part, st.keyed_get([sk for sk, _ in part])):
                if v is None:
                    continue  # deleted or replaced, or damaged: not served, not counted
                with v:
                    n = len(v.page)
                ok = parse_key(name)
                if ok is not None:
                    self._sizes[name.decode()] = (ok, n)
                    keys.append(ok)
                    sizes.append(n)
        if keys:
            self._notify_keys_stored(keys, sizes)

    def list_l2_keys(self, model_name=None, page_size=500, cursor=None):
        """The LMCache keys kvx holds (as counted at open and kept since), sorted by their string; cursor: the
        index to go on from."""
        if int(page_size) <= 0:
            raise ValueError("page_size must be positive")
        try:
            start = int(cursor) if cursor is not None else 0
        except ValueError:
            raise ValueError(f"malformed cursor {cursor!r}") from None
        with self._mu:
            items = sorted((s, kn) for s, kn in self._sizes.items()
                           if model_name is None or kn[0].model_name == model_name)
        page = items[start:start + int(page_size)]
        nxt = start + len(page)
        return KeyListPage(entries=tuple(KeyEntry(kn[0], kn[1]) for _, kn in page),
                           next_page_token=str(nxt) if nxt < len(items) else None)

    def report_status(self):
        st = self._conn._store.stat()
        u = self.get_usage()
        return {"is_healthy": not self._closed, "path": self._conn.dir, "keys": len(self._sizes),
                "bytes_used": u.total_bytes_used, "capacity_bytes": u.total_capacity_bytes,
                "store_bytes": st["bytes"], "store_pages": st["blocks"], "evictions": st["evictions"],
                "quarantined": st["quarantined"]}

    # ---- the interface ------------------------------------------------------------

    def get_store_event_fd(self):
        return self._efds[0]

    def get_lookup_and_lock_event_fd(self):
        return self._efds[1]

    def get_load_event_fd(self):
        return self._efds[2]

    def _submit(self, op, keys, call, sizes=None, event=None):
        strings = [key_string(k) for k in keys]
        with self._mu:
            if self._closed:
                raise ValueError("kvx: the adapter is closed")
            task = self._next_task
            self._next_task += 1
            if event is not None:
                self._deletes[task] = event
            fid = int(call(strings))
            self._pending[fid] = (op, task, list(keys), strings, sizes)
        return task

    def submit_store_task(self, keys, objects):
        bufs = [memoryview(_buffer(o)) for o in objects]
        return self._submit(_STORE, keys, lambda s: self._conn.submit_batch_set(s, bufs), [m.nbytes for m in bufs])

    def pop_completed_store_tasks(self):
        with self._mu:
            done, self._stores = self._stores, {}
        return done

    def submit_lookup_and_lock_task(self, keys):
        return self._submit(_LOOKUP, keys, self._conn.submit_batch_exists)

    def query_lookup_and_lock_result(self, task_id):
        with self._mu:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys):
        return None  # kvx evicts whole shards by its own policy; nothing is locked

    def submit_load_task(self, keys, objects):
        bufs = [memoryview(_buffer(o)) for o in objects]
        return self._submit(_LOAD, keys, lambda s: self._conn.submit_batch_get(s, bufs))

    def query_load_result(self, task_id):
        with self._mu:
            return self._loads.pop(task_id, None)

    def delete(self, keys):
        """Delete the keys' pages, blocking until done (LMCache's eviction calls it)."""
        if not keys:
            return
        ev = threading.Event()
        self._submit(_DELETE, keys, self._conn.submit_batch_delete, event=ev)
        if not ev.wait(30.0):
            raise TimeoutError("kvx: delete() timed out after 30s")

    def close(self):
        with self._mu:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._thread.join()
        self._conn.close()
        for fd in self._efds:
            os.close(fd)

    # ---- completions ----------------------------------------------------------------

    def _demux(self):
        poller = select.poll()
        poller.register(self._conn.event_fd(), select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(200):
                continue
            stored, deleted, wake, sig = [], [], [], set()
            with self._mu:
                for fid, ok, _err, bools in self._conn.drain_completions():
                    entry = self._pending.pop(int(fid), None)
                    if entry is None:
                        continue
                    op, task, keys, strings, sizes = entry
                    if op == _STORE:
                        self._stores[task] = L2StoreResult(bool(ok), sum(sizes) if ok else 0)
                        sig.add(0)
                        if ok:
                            for k, s, n in zip(keys, strings, sizes):
                                if s not in self._sizes:  # a key already held is kept as it is
                                    self._sizes[s] = (k, n)
                                    stored.append((k, n))
                    elif op == _LOOKUP:
                        self._lookups[task] = [bool(b) for b in bools] if bools is not None else [False] * len(keys)
                        sig.add(1)
                    elif op == _LOAD:
                        self._loads[task] = [bool(b) for b in bools] if bools is not None else [False] * len(keys)
                        sig.add(2)
                    else:
                        for s, b in zip(strings, bools or ()):
                            kn = self._sizes.pop(s, None) if b else None
                            if kn is not None:
                                deleted.append(kn)
                        ev = self._deletes.pop(task, None)
                        if ev is not None:
                            wake.append(ev)
            if stored:
                self._notify_keys_stored([k for k, _ in stored], [n for _, n in stored])
            if deleted:
                self._notify_keys_deleted([k for k, _ in deleted], [n for _, n in deleted])
            for i in sig:
                os.eventfd_write(self._efds[i], 1)
            for ev in wake:
                ev.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

