"""KV events on the wire in vLLM's schema (msgspec msgpack over ZMQ), and the prefix index a router builds
from them. No torch here: events carry page hashes and token ids only.
"""
