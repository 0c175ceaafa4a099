"""Adapters that plug kvx into inference engines (LMCache, SGLang).

Empty for now: the next issue (the LMCache and SGLang integrations) fills
this package.
"""
