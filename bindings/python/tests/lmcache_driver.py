"""A driver that uses a connector exactly as LMCache's multiprocess mode does
(LMCache is not installed here: no PyPI). It reproduces, in plain Python,
what LMCache/LMCache does with a "native_plugin" L2 adapter:

- loading (lmcache/v1/distributed/l2_adapters/native_plugin_l2_adapter.py,
  NativePluginL2AdapterConfig.from_dict and
  _create_native_plugin_l2_adapter): module_path and class_name non-empty
  strings, adapter_params a dict forwarded as **kwargs, the six required
  methods checked (close() called, TypeError raised when one is missing);
- the bridge (lmcache/v1/distributed/l2_adapters/
  native_connector_l2_adapter.py, NativeConnectorL2Adapter): ObjectKey ->
  "<model>@<kv_rank:08x>@<group:x>@<chunk_hash hex>[@<salt>]", a submit
  registering its future id under the bridge's lock, one demux thread that
  polls the connector's eventfd (select.poll, 500 ms), calls
  drain_completions() and routes each (future_id, ok, error, bools) by its
  future id: a store gives (ok, bytes), a lookup and a load a bitmap of the
  per-key bools (a load with bools None and ok set counts as all loaded), a
  delete wakes its blocking caller; three eventfds (store, lookup, load)
  signal the caller.

Pinned to LMCache/LMCache at the commits docs/ENGINES.md names (the files
above: native_connectors.rst 05d4437c, native_connector_l2_adapter.py
0b43a455, native_plugin_l2_adapter.py 68c638a6, connector_base.h 0b8d0c02,
connector_pybind_utils.h a4ef094e). Bitmaps are lists of bools here.
"""
import dataclasses
import importlib
import os
import select
import threading

REQUIRED_METHODS = ["event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists",
                    "drain_completions", "close"]


@dataclasses.dataclass(frozen=True)
class ObjectKey:
    model_name: str
    kv_rank: int
    object_group_id: int
    chunk_hash: bytes
    cache_salt: str = ""


def object_key_to_string(key):
    base = f"{key.model_name}@{key.kv_rank:08x}@{key.object_group_id:x}@{key.chunk_hash.hex()}"
    return f"{base}@{key.cache_salt}" if key.cache_salt else base


def load_native_plugin(d):
    """The native_plugin factory: config dict -> NativeConnectorL2Adapter over the loaded connector."""
    module_path, class_name = d.get("module_path"), d.get("class_name")
    if not isinstance(module_path, str) or not module_path:
        raise ValueError("module_path must be a non-empty string")
    if not isinstance(class_name, str) or not class_name:
        raise ValueError("class_name must be a non-empty string")
    params = d.get("adapter_params", {})
    if not isinstance(params, dict):
        raise ValueError("adapter_params must be a dict")
    cls = getattr(importlib.import_module(module_path), class_name)
    native = cls(**params)
    for m in REQUIRED_METHODS:
        if not callable(getattr(native, m, None)):
            if callable(getattr(native, "close", None)):
                native.close()
            raise TypeError(f"{module_path}.{class_name} instance missing required method '{m}'")
    return NativeConnectorL2Adapter(native)


class _Notifier:
    def __init__(self):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def notify(self):
        os.eventfd_write(self.fd, 1)

    def close(self):
        os.close(self.fd)


class NativeConnectorL2Adapter:
    STORE, LOOKUP, LOAD, DELETE = "store", "lookup", "load", "delete"

    def __init__(self, client):
        self.client = client
        self.client_fd = int(client.event_fd())
        self.store_efd, self.lookup_efd, self.load_efd = _Notifier(), _Notifier(), _Notifier()
        self.pending = {}  # future id -> (op, task id, n keys, keys)
        self.completed_stores, self.completed_lookups, self.completed_loads = {}, {}, {}
        self.locked = {}
        self.has_delete = callable(getattr(client, "submit_batch_delete", None))
        self.delete_events = {}
        self.unknown = []  # completions for future ids never submitted (must stay empty)
        self.next_task = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._demux, daemon=True, name="l2-adapter-demux")
        self.thread.start()

    def _task(self):
        t = self.next_task
        self.next_task += 1
        return t

    def submit_store_task(self, keys, objs):
        ks = [object_key_to_string(k) for k in keys]
        mvs = [memoryview(o) for o in objs]
        with self.lock:
            task = self._task()
            fid = int(self.client.submit_batch_set(ks, mvs))
            self.pending[fid] = (self.STORE, task, len(keys), None, sum(m.nbytes for m in mvs))
        return task

    def pop_completed_store_tasks(self):
        with self.lock:
            done, self.completed_stores = self.completed_stores, {}
        return done

    def submit_lookup_and_lock_task(self, keys):
        ks = [object_key_to_string(k) for k in keys]
        with self.lock:
            task = self._task()
            fid = int(self.client.submit_batch_exists(ks))
            self.pending[fid] = (self.LOOKUP, task, len(keys), list(keys), 0)
        return task

    def query_lookup_and_lock_result(self, task):
        with self.lock:
            return self.completed_lookups.pop(task, None)

    def submit_load_task(self, keys, objs):
        ks = [object_key_to_string(k) for k in keys]
        mvs = [memoryview(o) for o in objs]
        with self.lock:
            task = self._task()
            fid = int(self.client.submit_batch_get(ks, mvs))
            self.pending[fid] = (self.LOAD, task, len(keys), list(keys), 0)
        return task

    def query_load_result(self, task):
        with self.lock:
            return self.completed_loads.pop(task, None)

    def delete(self, keys):
        if not keys or not self.has_delete:
            return
        ks = [object_key_to_string(k) for k in keys]
        ev = threading.Event()
        with self.lock:
            task = self._task()
            fid = int(self.client.submit_batch_delete(ks))
            self.pending[fid] = (self.DELETE, task, len(keys), list(keys), 0)
            self.delete_events[task] = ev
        if not ev.wait(timeout=30.0):
            raise TimeoutError("delete() timed out after 30s")

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        self.client.close()
        for n in (self.store_efd, self.lookup_efd, self.load_efd):
            n.close()

    def _demux(self):
        poller = select.poll()
        poller.register(self.client_fd, select.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(500):
                continue
            comps = self.client.drain_completions()
            if not comps:
                continue
            wake = []
            with self.lock:
                for fid, ok, error, bools in comps:
                    entry = self.pending.pop(int(fid), None)
                    if entry is None:
                        self.unknown.append((fid, ok, error, bools))
                        continue
                    op, task, n, keys, nbytes = entry
                    if op == self.STORE:
                        self.completed_stores[task] = (bool(ok), nbytes if ok else 0, error)
                        self.store_efd.notify()
                    elif op == self.LOOKUP:
                        bm = [False] * n
                        if ok and bools is not None:
                            for i, f in enumerate(bools):
                                if f:
                                    bm[i] = True
                                    self.locked[keys[i]] = self.locked.get(keys[i], 0) + 1
                        self.completed_lookups[task] = bm
                        self.lookup_efd.notify()
                    elif op == self.LOAD:
                        bm = [False] * n
                        if bools is not None:
                            bm = [bool(b) for b in bools]
                        elif ok:
                            bm = [True] * n
                        self.completed_loads[task] = bm
                        self.load_efd.notify()
                    else:
                        ev = self.delete_events.pop(task, None)
                        if ev is not None:
                            wake.append(ev)
            for ev in wake:
                ev.set()


def wait_fd(fd, timeout=10.0):
    """Wait until an eventfd is readable and consume it (as a caller of the adapter does)."""
    r, _, _ = select.select([fd], [], [], timeout)
    if not r:
        raise TimeoutError("no completion signalled")
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def wait_result(notifier, query, task, timeout=10.0):
    """Wait on one of the adapter's eventfds until query(task) answers."""
    import time
    end = time.monotonic() + timeout
    while True:
        r = query(task)
        if r is not None:
            return r
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"task {task} did not complete")
        select.select([notifier.fd], [], [], min(left, 0.5))
        try:
            os.eventfd_read(notifier.fd)
        except BlockingIOError:
            pass


def wait_store(adapter, task, timeout=10.0):
    def q(t):
        done = adapter.pop_completed_store_tasks()
        with adapter.lock:  # keep what belongs to other tasks
            for k, v in done.items():
                if k != t:
                    adapter.completed_stores[k] = v
        return done.get(t)
    return wait_result(adapter.store_efd, q, task, timeout)
