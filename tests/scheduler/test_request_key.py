"""A request's prefix-cache key is encoded once: the prompt at its first match, each output token once, and
every match and insert reuses it (a slice of it). The key of ``tokens[:n]`` always equals a fresh encoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_scheduler import PS, drive, make, prompt  # the metadata-only driver beside this file

import dsakv.cache.key
from dsakv.cache.key import RadixKey
from dsakv.scheduler.request import Request


@given(
    plen=st.integers(1, 30),
    as_array=st.booleans(),
    steps=st.lists(st.tuples(st.lists(st.integers(0, 999), max_size=4), st.integers(0, 40)), max_size=12),
)
def test_radix_key_of_a_prefix_equals_a_fresh_encoding_of_its_tokens(plen, as_array, steps):
    ids = [(7 * i) % 1000 for i in range(plen)]
    req = Request("r", np.asarray(ids, dtype=np.int64) if as_array else ids, 100, None, 0)
    for new_outputs, cut in steps:  # outputs grow between lookups, as they do between steps
        req.outputs.extend(new_outputs)
        n = 1 + cut % req.num_tokens
        assert req.radix_key(n).data == RadixKey(list(req.tokens(n))).data


@pytest.mark.parametrize("mode", ["finish", "allocate"])
@pytest.mark.parametrize("preemption", ["recompute", "offload"])
def test_each_token_is_encoded_once_per_request(monkeypatch, mode, preemption):
    # Allocate mode inserts once per completed page and recompute re-admits (a second match): neither may
    # encode a token the request already encoded.
    encoded = []
    real = dsakv.cache.key._encode
    monkeypatch.setattr(dsakv.cache.key, "_encode", lambda tokens: encoded.append(len(tokens)) or real(tokens))
    s = make(num_pages=10, mode=mode, new_token_ratio=0.0, preemption=preemption, chunk_tokens=PS)
    reqs = [s.add_request(prompt(3 * PS + 5 * i, base=i), 2 * PS) for i in range(5)]
    drive(s)
    assert s.stats.preemptions > 0 and all(r.key is None for r in reqs)  # done: key released with the prompt
    assert 0 < sum(encoded) <= sum(r.prompt_len + len(r.outputs) for r in reqs)
