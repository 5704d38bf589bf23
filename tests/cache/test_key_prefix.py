"""``RadixKey.prefix`` and ``RadixKey.extended``: a key of a prefix or of a longer token list without encoding
the shared tokens again. Each must equal a key built from scratch, in the same namespace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.key import MAX_TOKEN_ID, RadixKey
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError

token_lists = st.lists(st.integers(0, MAX_TOKEN_ID), min_size=1, max_size=40)


@given(tokens=token_lists, more=st.lists(st.integers(0, MAX_TOKEN_ID), max_size=20), data=st.data())
def test_prefix_and_extended_equal_a_key_built_from_scratch(tokens, more, data):
    key = RadixKey(tokens, extra_key="lora-a", cache_salt=7)
    longer = key.extended(more)
    assert longer.data == RadixKey(tokens + more).data and longer.num_tokens == len(tokens) + len(more)
    n = data.draw(st.integers(1, len(tokens) + len(more)))
    short = longer.prefix(n)
    assert short.data == RadixKey((tokens + more)[:n]).data and len(short) == n
    assert short.namespace == longer.namespace == key.namespace == ("lora-a", 7)
    assert key.data == RadixKey(tokens).data  # the original key is unchanged


def test_a_prefix_key_hits_what_its_full_key_inserted():
    alloc = PageAllocator(8, 4)
    cache = RadixCache(alloc)
    key = RadixKey(list(range(13)), cache_salt="s")
    pages = alloc.alloc(3)
    cache.insert(key, pages)
    assert cache.match(key.prefix(9)).pages == pages[:2]
    assert cache.match(RadixKey(list(range(9)))).pages == []  # another namespace shares nothing


@pytest.mark.parametrize("n", [0, -1, 6])
def test_prefix_outside_the_key_raises_naming_the_length(n):
    with pytest.raises(DsakvError, match=f"num_tokens = {n}: must lie in 1..5"):
        RadixKey([1, 2, 3, 4, 5]).prefix(n)


@pytest.mark.parametrize("bad", [[-1], [MAX_TOKEN_ID + 1], np.array([[1]])], ids=repr)
def test_extended_checks_only_the_new_tokens_and_refuses_bad_ones(bad):
    with pytest.raises(DsakvError, match="tokens"):
        RadixKey([1, 2]).extended(bad)
