"""What the engine adapters share: sizes given as text, the per-process
store directory, opening a keyed store (created on first use, reopened after
a restart, one writer per directory), and kvx errors raised from Python.

One store per process: a kvx store has one writer (DESIGN.md, trust rules),
and LMCache workers and SGLang ranks each build their own backend from one
shared config, so each process gets its own directory, ``<path>/<rank tag>``,
unless the config names one per rank itself. A second process that opens a
directory already held gets kvx.BusyError (KVX_EBUSY) at once (the store is
opened with nowait=True), never a wait and never a shared writer.

Namespaces: a store holds one layout's pages only. namespace() digests what
makes a page's bytes (model and revision, dtype, page size, layout, the
parallel ranks that split the pages); the adapters name the store's
directory after it and record it in the store (record_namespace), so a
changed layout opens another store instead of reading this one's pages as
its own.
"""
import errno
import hashlib
import json
import logging
import os
import re
import threading

import kvx

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000 ** 2,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000 ** 4,
          "tib": 1 << 40}


def parse_size(v, what="capacity"):
    """64GiB, "512 MiB", "1.5G" (binary: K/M/G/T and KiB.. are powers of 1024, KB.. of 1000) or an int
    of bytes -> bytes."""
    if isinstance(v, bool):
        raise TypeError(f"kvx: {what}: a size such as 64GiB or a number of bytes, not {v!r}")
    if isinstance(v, int):
        if v < 0:
            raise ValueError(f"kvx: {what}: {v} is negative")
        return v
    if isinstance(v, float):
        if v < 0 or v != v:
            raise ValueError(f"kvx: {what}: {v} is not a size")
        return int(v)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(v))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"kvx: {what}: {v!r} is not a size (64GiB, 512MiB, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def raise_kvx(cls, code, message):
    """Raise kvx error class cls carrying .code/.name/.message as the binding's do."""
    name = kvx.err_name(code)
    e = cls(f"{name}: {message}")
    e.code, e.name, e.message = code, name, message
    raise e


def tag_safe(s):
    """A directory-name-safe form of s (model names hold '/')."""
    return re.sub(r"[^A-Za-z0-9._=+-]", "-", str(s)).strip("-.") or "x"


def store_dir(path, tag, per_rank_path=False):
    """The process's own directory: path with "{rank}" replaced by tag when it names one, path itself when
    per_rank_path (the config already names one directory per rank), else path/tag."""
    if not path or not isinstance(path, (str, os.PathLike)):
        raise ValueError("kvx: the store path is required (adapter param / extra_config key \"path\")")
    path = os.fspath(path)
    if "{rank}" in path:
        return path.replace("{rank}", tag)
    if per_rank_path:
        return path
    return os.path.join(path, tag)


def open_keyed_store(d, page_bytes, capacity, nosync=False, verify=False):
    """The keyed store at d for this process's writer: reopened when d exists, created (with its parents)
    when it does not. A directory held by another process: kvx.BusyError at once. A store of another page
    size: kvx.ShapeError (nothing touched). page_bytes None: whatever the existing store has (creating one
    then needs it)."""
    flags = dict(nowait=True, nosync=nosync, verify=verify)
    st = None
    if not os.path.exists(d):
        if not page_bytes:
            raise ValueError(f"kvx: {d} holds no store yet: page_bytes is needed to create one")
        os.makedirs(os.path.dirname(os.path.abspath(d)), exist_ok=True)
        try:
            st = kvx.Store.create(d, page_bytes=int(page_bytes), capacity=parse_size(capacity), **flags)
        except kvx.Error as e:
            if e.code != -errno.EEXIST:  # another process created it first: open it below
                raise
    if st is None:
        st = kvx.Store.open(d, **flags)
    if not st.keyed:
        st.close()
        raise_kvx(kvx.ShapeError, kvx.ESHAPE, f"{d} is a block store (a geometry), not a keyed store")
    if page_bytes and st.page_bytes != int(page_bytes):
        have = st.page_bytes
        st.close()
        raise_kvx(kvx.ShapeError, kvx.ESHAPE,
                  f"{d} is a keyed store of {have}-byte pages, not {int(page_bytes)} (give its page size, or "
                  "another path)")
    return st


def key_bytes(k, i, max_len=None):
    """A key as bytes: str (UTF-8) or bytes, 1..255 bytes (kvx.KEY_MAX; max_len: another bound, for an adapter
    that stores longer keys under a digest); else kvx.InvalidError naming keys[i] (a str that is not UTF-8, such
    as one holding a lone surrogate, too)."""
    if isinstance(k, str):
        try:
            b = k.encode("utf-8")
        except UnicodeEncodeError as e:
            b, why = None, f"{e.reason} at character {e.start}: {k[e.start:e.end]!r}"
        if b is None:
            raise_kvx(kvx.InvalidError, kvx.EINVALID, f"keys[{i}] is not UTF-8 text ({why})")
    elif isinstance(k, (bytes, bytearray, memoryview)):
        b = bytes(k)
    else:
        raise_kvx(kvx.InvalidError, kvx.EINVALID, f"keys[{i}] is {type(k).__name__}, not str or bytes")
    top = KEY_MAX if max_len is None else max_len
    if not 1 <= len(b) <= top:
        raise_kvx(kvx.InvalidError, kvx.EINVALID, f"keys[{i}] is {len(b)} bytes (a key is 1..{top} bytes)")
    return b


KEY_MAX = 255  # KVX_KEY_MAX


# ---- namespaces ---------------------------------------------------------------

NAMESPACE_KEY = b"\x00kvx-namespace"  # the namespace a store's pages belong to (JSON), a keyed page of the store
_NS_VERSION = 1
# the files of a local model directory that say what its weights are (no weights: reading them would take minutes)
CONFIG_FILES = ("config.json", "generation_config.json", "params.json", "model.safetensors.index.json",
                "pytorch_model.bin.index.json", "quantize_config.json", "hf_quant_config.json",
                "quant_config.json", "adapter_config.json")

log = logging.getLogger("kvx.integrations")
_once_mu = threading.Lock()
_once_seen = set()


def log_once(key, level, msg, *args, logger=None):
    """Log msg once per process for key (the same warning from every call of a hot path would drown the log)."""
    with _once_mu:
        if key in _once_seen:
            return False
        _once_seen.add(key)
    (logger or log).log(level, msg, *args)
    return True


def config_digest(model_path):
    """SHA-256 (hex) of a local model directory's config files (CONFIG_FILES that exist: names and bytes), or None
    when model_path is not a directory holding config.json or params.json."""
    if not model_path or not isinstance(model_path, (str, os.PathLike)):
        return None
    d = os.fspath(model_path)
    try:
        if not os.path.isdir(d) or not any(os.path.isfile(os.path.join(d, f)) for f in ("config.json", "params.json")):
            return None
        h = hashlib.sha256(b"kvx-model-config-1\0")
        for name in CONFIG_FILES:
            f = os.path.join(d, name)
            if os.path.isfile(f):
                with open(f, "rb") as fh:
                    data = fh.read(64 << 20)
                h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        return h.hexdigest()
    except OSError:
        return None


def model_revision(model, revision=None, model_path=None, adapter="kvx"):
    """The revision a namespace records for model: the given one (a hub commit, a tag, any text), else
    "config:<digest>" of the local model directory's config files (model_path, else model when it is a path),
    else None, said once in the log: the namespace then trusts the model name alone, and weights changed under
    the same name would be read as the old ones' pages (give the revision, or clear the store)."""
    if revision not in (None, ""):
        return str(revision)
    for p in (model_path, model):
        dg = config_digest(p)
        if dg:
            return "config:" + dg
    log_once(("no-revision", adapter, str(model)), logging.WARNING,
             "kvx %s: no model revision for %r (no \"revision\" given and no local config.json to digest): its "
             "store is named by the model name alone, so weights changed under that name would read the old "
             "pages; give \"revision\" (extra config) or clear the store after a weight update", adapter, model)
    return None


def namespace(fields):
    """(digest, record): the namespace of a store holding pages made under fields (a dict of JSON values: model,
    revision, dtype, page size, layout, the parallel ranks that change the bytes...). digest: 16 hex digits for
    the directory name; record: the canonical JSON bytes the store keeps under NAMESPACE_KEY."""
    rec = json.dumps({"kvx_namespace": _NS_VERSION, **fields}, sort_keys=True, separators=(",", ":"),
                     default=str).encode()
    return hashlib.sha256(b"kvx-namespace\0" + rec).hexdigest()[:16], rec


def read_namespace(st):
    """The namespace record (bytes) a store holds, or None."""
    (v,) = st.keyed_get([NAMESPACE_KEY])
    if v is None:
        return None
    with v:
        return bytes(v.page)


def keep_namespace(st, record, logger=None):
    """After a writer's flush: the namespace record put again when that flush's eviction took it (eviction
    drops the oldest shards whole, and the record, written once, sits in the oldest). A store whose pages
    outlive their record would be taken at its next open for one written before namespaces, and a hand-named
    directory opened under another namespace would then adopt its pages: wrong KV. A failure is logged once,
    never raised (the flush before it stands)."""
    try:
        if read_namespace(st) is None:
            with st.batch() as b:
                b.keyed_put([NAMESPACE_KEY], [record])
    except Exception as e:  # noqa: BLE001
        log_once(("keep-namespace", id(st)), logging.WARNING, "kvx: the namespace record could not be put again "
                 "after an eviction took it: %s", e, logger=logger)


def dir_bytes(d):
    """Bytes of the files under d (what an operator frees by removing it)."""
    n = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                n += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return n
