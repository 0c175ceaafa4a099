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
  pointer per page), and a hybrid model's other pools (a Mamba-like state
  pool, a DSA-indexer-like pool: SidecarHostPool);
- managers/cache_controller.py: backup_thread_func and prefetch_io_aux_func
  (loops that catch only queue.Empty: an exception ends the thread, never
  restarted: StorageThreads), backup_skip (MLA: TP rank 0 backs up), the
  MIN all-reduce of the ranks' hit counts (sglang_ranks.py runs the ranks
  as processes), _page_transfer_kv_batch (the KV pages, then batch_get_v2
  of the KV-derived sidecar pools, the minimum of their counts).
"""
import array
import ctypes
import dataclasses
import hashlib
import importlib
import queue
import random
import threading
import time
from typing import Optional

try:  # the v2 types as the controller builds them
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
except Exception:
    from kvx.integrations._hicache_standin import PoolHitPolicy, PoolName, PoolTransfer

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


def storage_config(extra, tp_rank=0, tp_size=1, model="Qwen/Qwen3-8B", mla=False, metrics=False, **kw):
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
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

    def __init__(self, pages=32, page_size=4, layers=2, heads=2, dim=64, itemsize=2, dtype="torch.bfloat16"):
        self.dtype = dtype
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
        idx = indices.tolist()  # as upstream's pools (a torch tensor of indices)
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

    def __init__(self, pages=32, page_size=4, layers=2, dim=96, itemsize=2, dtype="torch.bfloat16"):
        super().__init__(pages, page_size, layers, 1, dim, itemsize, dtype)
        self.parts = 1
        self.kv_buffer = (ctypes.c_ubyte * (self.size * self.per_token()))()
        self.base = ctypes.addressof(self.kv_buffer)

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()  # as upstream's pools (a torch tensor of indices)
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


class SidecarHostPool:
    """A hybrid model's other host pool in ctypes memory, indexed by the KV pool's host indices (as SGLang's
    KV-derived sidecar pools are): per page `parts` buffers of `part_bytes` each (a Mamba-like pool: the
    temporal state and a conv state; a DSA-indexer-like pool: one buffer)."""

    layout = "page_first"
    dtype = "torch.float32"

    def __init__(self, pages=32, page_size=4, parts=2, part_bytes=3072):
        self.page_size, self.pages, self.parts, self.part_bytes = page_size, pages, parts, part_bytes
        self.buf = (ctypes.c_ubyte * (pages * parts * part_bytes))()
        self.base = ctypes.addressof(self.buf)

    def _off(self, page, part):
        return (page * self.parts + part) * self.part_bytes

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()  # as upstream's pools (a torch tensor of indices)
        assert len(idx) % self.page_size == 0
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            page = idx[i] // self.page_size
            ptrs += [self.base + self._off(page, j) for j in range(self.parts)]
        return ptrs, [self.part_bytes] * len(ptrs)

    def fill_page(self, page, seed):
        for j in range(self.parts):
            ctypes.memmove(self.base + self._off(page, j), random.Random(seed * 7 + j).randbytes(self.part_bytes),
                           self.part_bytes)

    def page_bytes_of(self, page):
        return ctypes.string_at(self.base + self._off(page, 0), self.parts * self.part_bytes)

    def mark_pages(self, pages, byte):
        for p in pages:
            ctypes.memset(self.base + self._off(p, 0), byte, self.parts * self.part_bytes)


def count_pool_hits(results):
    """{pool: leading True count} of batch_get_v2's results (hicache_storage.count_pool_hits)."""
    return {name: (rs.index(False) if False in rs else len(rs)) for name, rs in results.items()}


def page_transfer_kv_batch(backend, hashes, host_indices, sidecar_names, zero_copy=True, pool=None):
    """_page_transfer_kv_batch: the KV pages (page_get), then batch_get_v2 of the KV-derived sidecar pools with
    the KV's host indices and keys; the minimum of the hit counts."""
    kv = page_get_zero_copy(backend, hashes, host_indices) if zero_copy else \
        generic_page_get(backend, pool, hashes, host_indices)
    side = {}
    if sidecar_names:
        side = count_pool_hits(backend.batch_get_v2([PoolTransfer(name=n, host_indices=host_indices, keys=hashes)
                                                     for n in sidecar_names]))
    return min([kv, *side.values()])


class StorageThreads:
    """The controller's backup thread (backup_thread_func / _page_backup: batch by batch, stop at the first
    failed batch) and prefetch I/O thread (prefetch_io_aux_func / _page_transfer: page_get per batch), each a
    loop that catches only queue.Empty, as upstream's: whatever else the backend raises ends the thread, and
    nothing restarts it. backup(hashes, host_indices) and prefetch(hashes, host_indices) queue an operation and
    wait for its answer (completed pages), or return None when the thread died."""

    def __init__(self, backend, page_size, zero_copy=True, pool=None, backup_skip=False):
        self.backend, self.page_size, self.zero_copy, self.pool = backend, page_size, zero_copy, pool
        self.backup_skip = backup_skip
        self.backup_queue, self.prefetch_queue = queue.Queue(), queue.Queue()
        self.stop = threading.Event()
        self.errors = []
        self.backup_thread = threading.Thread(target=self._run, args=(self.backup_queue, self._page_backup),
                                              daemon=True)
        self.prefetch_thread = threading.Thread(target=self._run, args=(self.prefetch_queue, self._page_transfer),
                                                daemon=True)
        self.backup_thread.start()
        self.prefetch_thread.start()

    def _run(self, q, fn):
        try:
            while not self.stop.is_set():
                try:
                    op = q.get(block=True, timeout=0.2)
                    if op is None:
                        continue
                    hashes, host_indices, answer = op
                    answer.put(fn(hashes, host_indices))
                except queue.Empty:
                    continue
        except BaseException as e:  # what ends upstream's thread (recorded for the test's message)
            self.errors.append(e)

    def _page_backup(self, hashes, host_indices):
        if self.backup_skip:
            return 0
        done = 0
        for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[i:i + STORAGE_BATCH_SIZE]
            idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            ok = page_set_zero_copy(self.backend, batch, idx) if self.zero_copy else \
                generic_page_set(self.backend, self.pool, batch, idx)
            if not ok:
                break
            done += len(batch)
        return done

    def _page_transfer(self, hashes, host_indices):
        done = 0
        for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[i:i + STORAGE_BATCH_SIZE]
            idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            n = page_get_zero_copy(self.backend, batch, idx) if self.zero_copy else \
                generic_page_get(self.backend, self.pool, batch, idx)
            done += n
            if n != len(batch):
                break
        return done

    def _call(self, q, thread, hashes, host_indices, timeout=30):
        if not thread.is_alive():
            return None
        answer = queue.Queue()
        q.put((hashes, host_indices, answer))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return answer.get(timeout=0.05)
            except queue.Empty:
                if not thread.is_alive():
                    return None
        return None

    def backup(self, hashes, host_indices):
        """Pages backed up, or None when the backup thread is dead."""
        return self._call(self.backup_queue, self.backup_thread, hashes, host_indices)

    def prefetch(self, hashes, host_indices):
        """Pages prefetched, or None when the prefetch thread is dead."""
        return self._call(self.prefetch_queue, self.prefetch_thread, hashes, host_indices)

    def alive(self):
        return self.backup_thread.is_alive() and self.prefetch_thread.is_alive()

    def close(self):
        self.stop.set()
        self.backup_thread.join(5)
        self.prefetch_thread.join(5)
