"""A driver that uses a HiCache storage backend exactly as SGLang does
(SGLang is not installed here: no PyPI, and Debian's torch is 1.13). It
reproduces, in plain Python over numpy, what sgl-project/sglang does at the
commit docs/ENGINES.md names (001067ff):

- python/sglang/srt/mem_cache/hicache_storage.py: HiCacheStorageConfig (the
  fields, in order), get_hash_str (the SHA-256 page-key chain: the prior
  hash's bytes, then each token id as 4 little-endian bytes), STORAGE_BATCH_SIZE;
- python/sglang/srt/mem_cache/storage/backend_factory.py,
  StorageBackendFactory._create_dynamic_backend: "dynamic" with extra_config
  keys backend_name, module_path, class_name required, the class imported
  and checked to subclass HiCacheStorage, constructed as
  backend_class(storage_config, kwargs);
- the cache controller's storage paths: the hit query (page hashes chained
  per page of tokens, batch_exists per STORAGE_BATCH_SIZE pages, stop at
  the first short batch), _page_get_zero_copy (batch_get_v1, count pages up
  to the first False), _page_set_zero_copy (all(batch_set_v1)), and the
  generic page get/set over get_dummy_flat_data_page / get_data_page /
  set_from_flat_data_page;
- the host pool's get_page_buffer_meta for MHA page_first (kv_buffer
  [2][tokens][layers][heads][dim]: per page a K pointer and a V pointer,
  element size page_size * layers * heads * dim * itemsize) and for MLA (one
  pointer per page).
"""
import dataclasses
import hashlib
import importlib
from typing import Optional

import numpy as np

STORAGE_BATCH_SIZE = 128


@dataclasses.dataclass
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


def storage_config(extra, tp_rank=0, tp_size=1, model="Qwen/Qwen3-8B", mla=False, **kw):
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name=model, extra_config=extra, **kw)


def get_hash_str(token_ids, prior_hash=None):
    h = hashlib.sha256()
    if prior_hash:
        h.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        h.update(int(t).to_bytes(4, byteorder="little", signed=False))
    return h.hexdigest()


def base_class():
    """SGLang's HiCacheStorage where importable, else kvx's stand-in (what the backend subclasses)."""
    try:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
        return HiCacheStorage
    except Exception:
        from kvx.integrations._hicache_standin import HiCacheStorage
        return HiCacheStorage


def create_dynamic_backend(cfg, mem_pool_host, **kwargs):
    """StorageBackendFactory.create_backend("dynamic", cfg, mem_pool_host); then the controller registers the
    host pool with the backend."""
    extra = cfg.extra_config
    for field in ("backend_name", "module_path", "class_name"):
        if field not in extra:
            raise ValueError(f"Missing required field '{field}' in backend config for 'dynamic' backend")
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    if not issubclass(cls, base_class()):
        raise TypeError(f"Backend class {extra['class_name']} must inherit from HiCacheStorage")
    backend = cls(cfg, kwargs)
    backend.register_mem_pool_host(mem_pool_host)
    return backend


class MHAHostPool:
    """page_first MHA host pool over numpy: kv_buffer [2][size][layers][heads][dim]."""

    layout = "page_first"

    def __init__(self, pages=32, page_size=4, layers=2, heads=2, dim=64, dtype=np.float16):
        self.page_size, self.size = page_size, pages * page_size
        self.layer_num, self.head_num, self.head_dim = layers, heads, dim
        self.dtype = np.dtype(dtype)
        self.kv_buffer = np.zeros((2, self.size, layers, heads, dim), dtype=self.dtype)

    def per_token(self):
        return self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize

    def element_bytes(self):
        return self.page_size * self.per_token()

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        assert len(idx) % self.page_size == 0
        base, v_off = self.kv_buffer.ctypes.data, self.size * self.per_token()
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            k = base + idx[i] * self.per_token()
            ptrs += [k, k + v_off]
        return ptrs, [self.element_bytes()] * len(ptrs)

    def page_indices(self, page):
        return np.arange(page * self.page_size, (page + 1) * self.page_size, dtype=np.int64)

    def fill_page(self, page, seed):
        sl = slice(page * self.page_size, (page + 1) * self.page_size)
        self.kv_buffer[:, sl] = np.random.default_rng(seed).standard_normal(self.kv_buffer[:, sl].shape)

    def page_bytes_of(self, page):
        sl = slice(page * self.page_size, (page + 1) * self.page_size)
        return self.kv_buffer[0, sl].tobytes() + self.kv_buffer[1, sl].tobytes()

    # the generic (copying) path
    def get_dummy_flat_data_page(self):
        return np.zeros(2 * self.element_bytes() // self.dtype.itemsize, dtype=self.dtype)

    def get_data_page(self, index, flat=True):
        sl = slice(index, index + self.page_size)
        return np.concatenate([self.kv_buffer[0, sl].ravel(), self.kv_buffer[1, sl].ravel()])

    def set_from_flat_data_page(self, index, data_page):
        sl = slice(index, index + self.page_size)
        half = data_page.size // 2
        self.kv_buffer[0, sl] = data_page[:half].reshape(self.kv_buffer[0, sl].shape)
        self.kv_buffer[1, sl] = data_page[half:].reshape(self.kv_buffer[1, sl].shape)


class MLAHostPool(MHAHostPool):
    """MLA: one latent buffer, one pointer per page."""

    def __init__(self, pages=32, page_size=4, layers=2, dim=96, dtype=np.float16):
        super().__init__(pages, page_size, layers, 1, dim, dtype)
        self.kv_buffer = np.zeros((self.size, layers, 1, dim), dtype=self.dtype)

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        base = self.kv_buffer.ctypes.data
        ptrs = [base + idx[i] * self.per_token() for i in range(0, len(idx), self.page_size)]
        return ptrs, [self.element_bytes()] * len(ptrs)

    def fill_page(self, page, seed):
        sl = slice(page * self.page_size, (page + 1) * self.page_size)
        self.kv_buffer[sl] = np.random.default_rng(seed).standard_normal(self.kv_buffer[sl].shape)

    def page_bytes_of(self, page):
        return self.kv_buffer[page * self.page_size:(page + 1) * self.page_size].tobytes()


def page_hashes(tokens, page_size, last_hash=None):
    out = []
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        last_hash = get_hash_str(tokens[i:i + page_size], last_hash)
        out.append(last_hash)
    return out


def storage_hit_query(backend, tokens, page_size):
    """The controller's hit query: (hashes of the leading pages held, tokens they cover)."""
    hashes, last = [], None
    n = len(tokens) - len(tokens) % page_size
    for start in range(0, n, page_size * STORAGE_BATCH_SIZE):
        batch = page_hashes(tokens[start:min(n, start + page_size * STORAGE_BATCH_SIZE)], page_size, last)
        last = batch[-1]
        hit = backend.batch_exists(batch)
        assert isinstance(hit, int) and 0 <= hit <= len(batch)
        hashes += batch[:hit]
        if hit < len(batch):
            break
    return hashes, len(hashes) * page_size


def page_get_zero_copy(backend, hashes, host_indices):
    """_page_get_zero_copy: pages got, counted up to the first False."""
    results = backend.batch_get_v1(hashes, host_indices)
    inc = 0
    for i in range(len(hashes)):
        if not results[i]:
            break
        inc += 1
    return inc


def page_set_zero_copy(backend, hashes, host_indices):
    return all(backend.batch_set_v1(hashes, host_indices))


def generic_page_get(backend, pool, hashes, host_indices):
    dst = [pool.get_dummy_flat_data_page() for _ in hashes]
    data = backend.batch_get(hashes, dst)
    if data is None:
        return 0
    n = 0
    for i in range(len(hashes)):
        if data[i] is None:
            break
        pool.set_from_flat_data_page(int(host_indices[i * pool.page_size]), data[i])
        n += 1
    return n


def generic_page_set(backend, pool, hashes, host_indices):
    data = [pool.get_data_page(int(host_indices[i * pool.page_size]), flat=True) for i in range(len(hashes))]
    return backend.batch_set(hashes, data)
