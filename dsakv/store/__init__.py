"""The shared page store: one value per page holding both caches' bytes, on a Redis / Valkey server.

No torch here: values are bytes, keys are the pages' chained hashes (namespace included).
"""
