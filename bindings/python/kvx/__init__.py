"""kvx: a storage engine for LLM KV-cache shards, from Python.

A zero-copy binding of libkvx's store (include/kvx.h)::

    import kvx, numpy as np
    with kvx.Store.create("/tmp/cache", num_layers=32, kv_heads=8, head_dim=128,
                          block_tokens=16, quant="fp16") as st:
        st.put(tokens, pages)          # tokens: uint32 ids; pages: any C-contiguous buffer
        st.flush()                     # durable and visible
        for v in st.prefix(prompt):    # one C call for the whole prompt
            kv = np.frombuffer(v, dtype=np.float16)   # no copy
            ...
            v.release()                # or `with v:`, or let it be collected

A View's page stays mapped until the view and every buffer taken from it are
released, even after the store is closed. Failures raise kvx.Error (or a
subclass: NotFoundError, ShapeError, BusyError, ...) carrying .code,
.name and .message. Calls that do I/O or loop over blocks release the GIL.
"""
from ._kvx import (  # noqa: F401
    Store, Batch, View,
    Error, NotFoundError, ShapeError, ModelError, BusyError, CapacityError, FullError,
    InvalidError, QuantError, CorruptError, AmbiguousError, UnverifiedError, StaleError,
    DroppedError,
    version, quant_names, block_hashes, strerror, err_name,
)
from . import _kvx

# The kvx codes as module constants: kvx.ENOTFOUND, kvx.EPAGECRC, ...
globals().update({k: getattr(_kvx, k) for k in dir(_kvx) if k.startswith("E") and k.isupper()})

__version__ = version()
