"""What the engine adapters share: sizes given as text, the per-process
store directory, opening a keyed store (created on first use, reopened after
a restart, one writer per directory), and kvx errors raised from Python.

One store per process: a kvx store has one writer (DESIGN.md, trust rules),
and LMCache workers and SGLang ranks each build their own backend from one
shared config, so each process gets its own directory, ``<path>/<rank tag>``,
unless the config names one per rank itself. A second process that opens a
directory already held gets kvx.BusyError (KVX_EBUSY) at once (the store is
opened with nowait=True), never a wait and never a shared writer.
"""
import errno
import os
import re

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


def key_bytes(k, i):
    """A key as bytes: str (UTF-8) or bytes, 1..255 bytes (kvx.KEY_MAX); else kvx.InvalidError."""
    if isinstance(k, str):
        b = k.encode("utf-8")
    elif isinstance(k, (bytes, bytearray, memoryview)):
        b = bytes(k)
    else:
        raise_kvx(kvx.InvalidError, kvx.EINVALID, f"keys[{i}] is {type(k).__name__}, not str or bytes")
    if not 1 <= len(b) <= KEY_MAX:
        raise_kvx(kvx.InvalidError, kvx.EINVALID, f"keys[{i}] is {len(b)} bytes (a key is 1..{KEY_MAX} bytes)")
    return b


KEY_MAX = 255  # KVX_KEY_MAX
