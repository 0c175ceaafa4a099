"""A driver that uses a HiCache storage backend exactly as SGLang does
(SGLang is not installed here: no PyPI, and Debian's torch is 1.13). It
reproduces, in plain Python over ctypes host memory (no numpy: the tests run
on interpreters without it), what sgl-project/sglang does at the
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
import array
import ctypes
import dataclasses
import hashlib
import importlib
import random
from typing import Optional

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
    """page_first MHA host pool in ctypes host memory: kv_buffer [2][size][layers][heads][dim] of itemsize-byte
    elements (2: fp16/bf16), as SGLang's pinned host tensor."""

    layout = "page_first"

    def __init__(self, pages=32, page_size=4, layers=2, heads=2, dim=64, itemsize=2):
        self.page_size, self.size = page_size, pages * page_size
        self.layer_num, self.head_num, self.head_dim = layers, heads, dim
        self.itemsize = itemsize
        self.parts = 2  # K and V
        self.kv_buffer = (ctypes.c_ubyte * (self.parts * self.size * self.per_token()))()
        self.base = ctypes.addressof(self.kv_buffer)

    def per_token(self):
        return self.layer_num * self.head_num * self.head_dim * self.itemsize

    def element_bytes(self):
        return self.page_size * self.per_token()

    def _span(self, part, page):
        """(offset, length) of page's buffer `part` (0: K, 1: V) in kv_buffer."""
        return part * self.size * self.per_token() + page * self.element_bytes(), self.element_bytes()

    def get_page_buffer_meta(self, indices):
        idx = list(indices)
        assert len(idx) % self.page_size == 0
        v_off = self.size * self.per_token()
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            k = self.base + idx[i] * self.per_token()
            ptrs += [k, k + v_off]
        return ptrs, [self.element_bytes()] * len(ptrs)

    def page_indices(self, page):
        return array.array("q", range(page * self.page_size, (page + 1) * self.page_size))

    def part_bytes_of(self, page, part):
        off, n = self._span(part, page)
        return ctypes.string_at(self.base + off, n)

    def page_bytes_of(self, page):
        return b"".join(self.part_bytes_of(page, j) for j in range(self.parts))

    def fill_page(self, page, seed):
        """Random bytes (fp16 bits) in every buffer of page."""
        for j in range(self.parts):
            off, n = self._span(j, page)
            ctypes.memmove(self.base + off, random.Random(seed * 2 + j).randbytes(n), n)

    def mark_pages(self, pages, byte):
        """Every buffer of each page set to byte (a marker: a buffer nothing wrote still holds it)."""
        for p in pages:
            for j in range(self.parts):
                off, n = self._span(j, p)
                ctypes.memset(self.base + off, byte, n)

    def page_is_marked(self, page, byte):
        return self.page_bytes_of(page) == bytes([byte]) * (self.parts * self.element_bytes())

    # the generic (copying) path: a flat page is K then V, as itemsize-byte elements
    def get_dummy_flat_data_page(self):
        return memoryview(bytearray(self.parts * self.element_bytes())).cast("H" if self.itemsize == 2 else "B")

    def get_data_page(self, index, flat=True):
        assert index % self.page_size == 0
        return memoryview(bytearray(self.page_bytes_of(index // self.page_size))).cast(
            "H" if self.itemsize == 2 else "B")

    def set_from_flat_data_page(self, index, data_page):
        assert index % self.page_size == 0
        data = memoryview(data_page).cast("B").tobytes()
        n = self.element_bytes()
        assert len(data) == self.parts * n
        for j in range(self.parts):
            off, _ = self._span(j, index // self.page_size)
            ctypes.memmove(self.base + off, data[j * n:(j + 1) * n], n)


class MLAHostPool(MHAHostPool):
    """MLA: one latent buffer [size][layers][1][dim], one pointer per page."""

    def __init__(self, pages=32, page_size=4, layers=2, dim=96, itemsize=2):
        super().__init__(pages, page_size, layers, 1, dim, itemsize)
        self.parts = 1
        self.kv_buffer = (ctypes.c_ubyte * (self.size * self.per_token()))()
        self.base = ctypes.addressof(self.kv_buffer)

    def get_page_buffer_meta(self, indices):
        idx = list(indices)
        ptrs = [self.base + idx[i] * self.per_token() for i in range(0, len(idx), self.page_size)]
        return ptrs, [self.element_bytes()] * len(ptrs)


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
