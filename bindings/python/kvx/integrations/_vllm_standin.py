"""A stand-in for vLLM's secondary-tier interface, used by
kvx.integrations.vllm where vLLM is not importable (no torch, no CUDA).

Pinned upstream, vllm-project/vllm (docs/ENGINES.md, "vLLM"):
- vllm/v1/kv_offload/tiering/base.py at
  061245c7e1e7bb485a53ec8b7b75362faff2fcfb: SecondaryTierManager (its
  constructor, abstract set and hooks), TransferJob, JobResult;
- vllm/v1/kv_offload/base.py at 0105e232b7fa4e1b59ec87531f167c0443a5095d:
  OffloadKey and make_offload_key / get_offload_block_hash /
  get_offload_group_idx, Medium, Locality, LookupResult, OffloadPolicy,
  RequestOffloadingContext, ReqContext, ScheduleEndContext, OffloadingEvent,
  OffloadingKVEventsConfig;
- vllm/v1/kv_offload/file_mapper.py at
  0078e9d2b020be709d7d756877106fd1015ea4f4: the run-config fields FileMapper
  hashes (FILE_MAPPER_FIELDS), read from the spec's OffloadingConfig
  (vllm/v1/kv_offload/config.py: the index holds it at 006f89ac only, not at
  the pin; its fields are the ones file_mapper.py reads).

The data types keep upstream's field names, order and defaults; numpy
arrays (TransferJob.chunk_ids) may be any sequence of ints here.
bindings/python/tests/test_vllm_standin.py compares these classes with a
list recorded from the pinned commits (data, not upstream code), and, where
vLLM is installed, the installed classes with the same list.
"""
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, ClassVar, Collection, Iterable, NamedTuple, Optional

PINNED_TIERING = "061245c7e1e7bb485a53ec8b7b75362faff2fcfb"
PINNED_BASE = "0105e232b7fa4e1b59ec87531f167c0443a5095d"
PINNED_FILE_MAPPER = "0078e9d2b020be709d7d756877106fd1015ea4f4"

OffloadKey = bytes  # NewType("OffloadKey", bytes) upstream: block hash + 4-byte big-endian group index


def make_offload_key(block_hash, group_idx):
    return OffloadKey(block_hash + group_idx.to_bytes(4, "big", signed=False))


def get_offload_block_hash(key):
    return key[:-4]


def get_offload_group_idx(key):
    return int.from_bytes(key[-4:], "big", signed=False)


class Medium(Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(Enum):
    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


class CacheHitSource(Enum):
    """vllm/v1/metrics/cache_hit_source.py: only the members the base class maps media to."""
    HOST = "host"
    DISK = "disk"
    EXTERNAL_UNSPECIFIED = "external_unspecified"


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class OffloadPolicy(Enum):
    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Optional[dict] = None
    kv_hints: Any = None
    load_tier_filter: Any = None  # TierFilter.ALL upstream


class ScheduleEndContext(NamedTuple):
    new_req_ids: Collection[str]
    preempted_req_ids: Collection[str]


@dataclass
class OffloadingEvent:
    keys: list
    medium: Medium
    removed: bool  # True if blocks are removed, False if stored
    locality: Optional[Locality] = None
    ownership: Optional[str] = None
    removal_expected: bool = False


@dataclass(frozen=True)
class OffloadingKVEventsConfig:
    enable_kv_cache_events: bool
    self_describing_kv_events: bool


JobId = int


@dataclass
class TransferJob:
    job_id: JobId
    _keys: Collection[OffloadKey]
    _chunk_ids: Any  # np.ndarray upstream
    is_promotion: bool
    req_context: ReqContext
    submit_time: float = field(default_factory=time.monotonic)

    @property
    def keys(self):
        return self._keys

    @property
    def chunk_ids(self):
        return self._chunk_ids

    def is_materialized(self):
        return True


@dataclass
class JobResult:
    job_id: JobId
    success: bool  # True if all keys succeeded; False if all or some failed
    successful_keys: Optional[Collection[OffloadKey]] = None  # promotions: the keys loaded on a partial failure
    transfer_time: Optional[float] = None
    transfer_bytes: Optional[int] = None


class SecondaryTierManager(ABC):
    medium: ClassVar[Optional[Medium]] = None
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "cache_hit_source" not in cls.__dict__ and cls.medium is not None:
            cls.cache_hit_source = {Medium.CPU: CacheHitSource.HOST, Medium.STORAGE: CacheHitSource.DISK}[cls.medium]

    def __init__(self, offloading_spec, primary_kv_view, tier_type, backpressure_detector=None):
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        assert primary_kv_view.strides is not None, "primary_kv_view.strides cannot be None"
        self._block_size_bytes = primary_kv_view.strides[0]
        self.tier_type = tier_type
        self.locality = None
        self._bp_detector = backpressure_detector

    @property
    def block_size_bytes(self):
        return self._block_size_bytes

    @property
    def bp_detector(self):
        return self._bp_detector

    @abstractmethod
    def lookup(self, key, req_context):
        pass

    @abstractmethod
    def submit_store(self, job_metadata):
        pass

    @abstractmethod
    def submit_load(self, job_metadata):
        pass

    @abstractmethod
    def get_finished_jobs(self) -> Iterable[JobResult]:
        pass

    def supports_lazy_promotion_allocation(self):
        return False

    def has_pending_work(self):
        return False

    def take_events(self):
        return ()

    def touch(self, keys, req_context):
        return

    @abstractmethod
    def on_new_request(self, req_context):
        pass

    def on_request_finished(self, req_context):
        return

    def serve_external_requests(self, parent):
        return

    def on_schedule_end(self, context):
        return

    @abstractmethod
    def drain_jobs(self):
        pass

    def shutdown(self):
        return

    @classmethod
    def build_metric_definitions(cls, extra_config):
        return {}

    def get_stats(self):
        return None


# ---- the spec's configuration (what FileMapper.from_offloading_spec reads) ----------------------------------------

@dataclass(frozen=True)
class OffloadingGroupConfig:
    tokens_per_block: int
    layer_names: tuple


@dataclass(frozen=True)
class OffloadingModelConfig:
    name: str
    dtype: str


@dataclass(frozen=True)
class OffloadingCacheConfig:
    tokens_per_hash: int
    blocks_per_chunk: int


@dataclass(frozen=True)
class OffloadingParallelConfig:
    rank: int
    world_size: int
    tp_size: int
    pp_size: int
    pcp_size: int
    dcp_size: int
    data_parallel_index: int
    is_parallelism_agnostic: bool


@dataclass(frozen=True)
class OffloadingConfig:
    groups: tuple
    worker_kv_bytes_per_block: int
    enable_kv_cache_events: bool
    extra_config: dict
    engine_id: str
    model: OffloadingModelConfig
    cache: OffloadingCacheConfig
    parallel: OffloadingParallelConfig
    replicated_layout: bool = False
    num_cpu_blocks: Optional[int] = None
    # read by file_mapper.py at the pin (config.canonical_layout, config.kv_cache_layout), absent from the
    # stored config.py: kept here with neutral defaults
    canonical_layout: bool = False
    kv_cache_layout: Optional[str] = None


class OffloadingSpec:
    """The parts of vllm.v1.kv_offload.base.OffloadingSpec a secondary tier reads: config, extra_config,
    kv_events_config, tokens_per_hash, blocks_per_chunk (and storage_format, which FileMapper reads from the
    concrete spec)."""

    def __init__(self, config):
        self.config = config
        self.extra_config = config.extra_config
        self.kv_events_config = OffloadingKVEventsConfig(
            enable_kv_cache_events=config.enable_kv_cache_events,
            self_describing_kv_events=bool(self.extra_config.get("self_describing_kv_events", False)))
        self.tokens_per_block = tuple(g.tokens_per_block for g in config.groups)
        self.tokens_per_hash = config.cache.tokens_per_hash
        self.blocks_per_chunk = config.cache.blocks_per_chunk
        self.storage_format = None
