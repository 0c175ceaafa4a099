"""A stand-in for SGLang's HiCacheStorage, used as the base class of
kvx.integrations.sglang.KvxHiCacheStorage where SGLang is not importable.

The same methods, names, arguments and defaults as the abstract class in
sgl-project/sglang python/sglang/srt/mem_cache/hicache_storage.py (the
commit docs/ENGINES.md names): the abstract get, batch_get, set, batch_set,
exists; batch_exists as the leading count of exists; batch_get_v1 and
batch_set_v1 raising NotImplementedError (never returning None);
register_mem_pool_host; clear; get_stats. torch is not needed.
"""
from abc import ABC, abstractmethod


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        raise NotImplementedError()

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        raise NotImplementedError()

    @abstractmethod
    def get(self, key, target_location=None, target_sizes=None):
        pass

    @abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        pass

    @abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None):
        pass

    @abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        pass

    @abstractmethod
    def exists(self, key):
        pass

    def batch_exists(self, keys, extra_info=None):
        for i in range(len(keys)):
            if not self.exists(keys[i]):
                return i
        return len(keys)

    def clear(self):
        pass

    def get_stats(self):
        return None
