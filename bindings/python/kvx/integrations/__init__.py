"""Adapters that plug kvx into inference engines as their KV-cache store
(docs/ENGINES.md): import the one you use, each needs only the kvx binding.

- kvx.integrations.lmcache.KvxConnector: LMCache's L2 "native_plugin"
  connector (event_fd, submit_batch_get/set/exists/delete,
  drain_completions, close).
- kvx.integrations.sglang.KvxHiCacheStorage: SGLang HiCache's storage
  backend (--hicache-storage-backend dynamic), zero-copy over the host pool.
- kvx.integrations.vllm.KvxSecondaryTier: a secondary tier of vLLM's
  TieringOffloadingSpec (out-of-tree, "module_path"), over the primary
  tier's host slots.

Each keeps its pages in a kvx keyed store (Store.create(dir,
page_bytes=N)), one directory per process.
"""
