"""A stand-in for SGLang's HiCache storage interface, used by
kvx.integrations.sglang where SGLang is not importable (no torch needed).

Pinned upstream: sgl-project/sglang at commit
001067fffe33427bee0ed2f007fb7551a1d76b44 (docs/ENGINES.md, "SGLang"):
python/sglang/srt/mem_cache/hicache_storage.py. HiCacheStorage here has
every method of that commit's abstract class, with the same names,
parameters, defaults and abstract set: the generic get, batch_get, set,
batch_set, exists (abstract) and batch_exists (the leading count of
exists); the zero-copy batch_get_v1 / batch_set_v1 and the hybrid-pool
batch_exists_v2 / batch_get_v2 / batch_set_v2, which raise
NotImplementedError (never return None); register_mem_pool_host and
register_mem_host_pool_v2; clear; get_stats. The data types the v2
interface and the stats pass around come with it: HiCacheStorageConfig,
HiCacheStorageExtraInfo, PoolName, PoolHitPolicy, PoolTransfer,
PoolTransferResult (that file), StorageMetrics (SGLang's metrics collector:
the four lists its histograms read).

bindings/python/tests/test_sglang_standin.py compares these methods with a
list recorded from the pinned commit (data, not upstream code), and, where
SGLang is installed, the methods the adapter implements or relies on with
the installed class.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class PoolName(str, Enum):
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"
    DEEPSEEK_V4_C4 = "deepseek_v4_c4"
    DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
    DEEPSEEK_V4_C128 = "deepseek_v4_c128"
    DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
    DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
    DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
    DRAFT = "draft"
    DRAFT_INDEXER = "draft_indexer"
    DRAFT_SWA = "draft_swa"

    def __str__(self):
        return self.value


class PoolHitPolicy(str, Enum):
    ALL_PAGES = "all_pages"  # every page of the KV prefix needs this pool's page
    TRAILING_PAGES = "trailing_pages"  # only the last len(transfer.keys) pages do (Mamba, SWA states)


@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Any = None
    device_indices: Any = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict


@dataclass
class StorageMetrics:
    """What SGLang's StorageMetricsCollector.log_storage_metrics reads: pages per prefetch and backup batch, and
    their bandwidths (GB/s), each a list of samples since the last get_stats()."""
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        raise NotImplementedError()

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

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
