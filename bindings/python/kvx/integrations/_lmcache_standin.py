"""A stand-in for the part of LMCache's L2 adapter interface that
kvx.integrations.lmcache_l2 uses where LMCache is not importable (it is not
on PyPI for this platform; no torch needed).

Pinned upstream: LMCache/LMCache at commit
000e8777a114b0f687cbdc8d06d075886de6895a (docs/ENGINES.md, "LMCache"):
lmcache/v1/distributed/l2_adapters/base.py (L2AdapterInterface: the
abstract methods, the byte accounting behind get_usage, delete,
list_l2_keys, report_status; AdapterUsage) and lmcache/v1/distributed/api.py
(KeyEntry, KeyListPage); the plugin factory of plugin_l2_adapter.py at
2b7c160f passes adapter_params as one dict (or a config object) and
l1_memory_desc as a keyword. Bitmaps are lists of bools here; a store
result is (ok, bytes) here, L2StoreResult upstream. Written from those
files' documented behaviour, not copied.
"""
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

_EMPTY = MappingProxyType({})


@dataclass(frozen=True)
class AdapterUsage:
    total_bytes_used: int
    total_capacity_bytes: int
    bytes_by_cache_salt: Mapping[str, int] = field(default_factory=lambda: _EMPTY)

    @property
    def usage_fraction(self):
        if self.total_capacity_bytes <= 0:
            return -1.0
        return self.total_bytes_used / self.total_capacity_bytes


@dataclass(frozen=True)
class KeyEntry:
    key: object
    size_bytes: int


@dataclass(frozen=True)
class KeyListPage:
    entries: Tuple[KeyEntry, ...]
    next_page_token: Optional[str]


class L2AdapterInterface(ABC):
    def __init__(self, max_capacity_bytes=0):
        self._listeners = []
        self._max_capacity_bytes = max_capacity_bytes
        self._total_bytes_used = 0
        self._bytes_by_cache_salt = {}
        self._usage_lock = threading.Lock()

    @abstractmethod
    def get_store_event_fd(self): ...

    @abstractmethod
    def get_lookup_and_lock_event_fd(self): ...

    @abstractmethod
    def get_load_event_fd(self): ...

    @abstractmethod
    def submit_store_task(self, keys, objects): ...

    @abstractmethod
    def pop_completed_store_tasks(self): ...

    @abstractmethod
    def submit_lookup_and_lock_task(self, keys): ...

    @abstractmethod
    def query_lookup_and_lock_result(self, task_id): ...

    @abstractmethod
    def submit_unlock(self, keys): ...

    @abstractmethod
    def submit_load_task(self, keys, objects): ...

    @abstractmethod
    def query_load_result(self, task_id): ...

    @abstractmethod
    def close(self): ...

    def register_listener(self, listener):
        self._listeners.append(listener)

    def _notify_keys_stored(self, keys, sizes):
        with self._usage_lock:
            for k, n in zip(keys, sizes):
                self._total_bytes_used += n
                self._bytes_by_cache_salt[k.cache_salt] = self._bytes_by_cache_salt.get(k.cache_salt, 0) + n
        for listener in self._listeners:
            listener.on_l2_keys_stored(keys, sizes)

    def _notify_keys_accessed(self, keys):
        for listener in self._listeners:
            listener.on_l2_keys_accessed(keys)

    def _notify_keys_deleted(self, keys, sizes):
        with self._usage_lock:
            for k, n in zip(keys, sizes):
                self._total_bytes_used = max(0, self._total_bytes_used - n)
                left = self._bytes_by_cache_salt.get(k.cache_salt, 0) - n
                if left <= 0:
                    self._bytes_by_cache_salt.pop(k.cache_salt, None)
                else:
                    self._bytes_by_cache_salt[k.cache_salt] = left
        for listener in self._listeners:
            listener.on_l2_keys_deleted(keys)

    @property
    def supports_global_eviction(self):
        return self._max_capacity_bytes > 0

    def delete(self, keys):
        return None

    def list_l2_keys(self, model_name=None, page_size=500, cursor=None):
        raise NotImplementedError(f"{type(self).__name__} does not implement list_l2_keys")

    def get_usage(self):
        with self._usage_lock:
            return AdapterUsage(self._total_bytes_used, self._max_capacity_bytes,
                                MappingProxyType({k: v for k, v in self._bytes_by_cache_salt.items() if v > 0}))

    def report_status(self):
        return {"is_healthy": True, "extra_warning": "report_status is not implemented and runs default impl"}


class L2StoreResult(int):
    """A completed store: the bytes written (>= 0) when it succeeded, -1 when it failed."""

    def __new__(cls, success, bytes_transferred):
        if bytes_transferred < 0:
            raise ValueError(f"bytes_transferred must be >= 0, got {bytes_transferred}")
        return super().__new__(cls, bytes_transferred if success else -1)

    def is_successful(self):
        return int(self) >= 0

    def bytes_transferred(self):
        return max(int(self), 0)


@dataclass(frozen=True)
class ObjectKey:
    """LMCache's ObjectKey (lmcache/v1/distributed/api.py): the fields its string form names."""
    model_name: str
    kv_rank: int
    object_group_id: int
    chunk_hash: bytes
    cache_salt: str = ""
