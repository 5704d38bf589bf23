"""The page value format: every check of ``decode`` turns a bad value into a named miss, never a load."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.store.value import HEADER, MAGIC, PageValueFormat, layout_fingerprint


def tiny_layout(**kw) -> CacheLayout:
    return CacheLayout(ModelSpec.preset("tiny"), page_size=kw.pop("page_size", 16), allow_any_page_size=True, **kw)


def payload_for(layout: CacheLayout, seed: int = 1) -> bytes:
    return bytes((seed * 31 + 7 * i) % 251 for i in range(layout.page_bytes))


def test_glm_page_value_is_header_plus_both_caches_of_one_page():
    layout = CacheLayout(ModelSpec.preset("glm-5.3"))
    fmt = PageValueFormat.for_layout(layout)
    assert fmt.page_bytes == layout.main_page_bytes + layout.indexer_page_bytes == 64 * layout.cell_bytes
    assert fmt.value_bytes == HEADER.size + layout.page_bytes


def test_round_trip_returns_the_payload_bytes():
    layout = tiny_layout()
    fmt = PageValueFormat.for_layout(layout)
    page = fmt.decode(fmt.encode(payload_for(layout)))
    assert page.ok and page.miss_reason is None
    assert bytes(page.payload) == payload_for(layout)


def test_fingerprint_names_spec_layout_and_scales():
    base = layout_fingerprint(tiny_layout())
    assert base == layout_fingerprint(tiny_layout())
    assert (
        len({base, layout_fingerprint(tiny_layout(kv_dtype="bf16")), layout_fingerprint(tiny_layout(page_size=32))})
        == 3
    )
    assert layout_fingerprint(tiny_layout(), [1.0] * 4) != layout_fingerprint(tiny_layout(), [0.5] * 4)


def test_value_with_main_kv_and_without_indexer_pages_is_never_loaded():
    """SGLang #30057: even a self-consistent value (its header and checksum describe its own, shorter
    payload) is a size miss when it lacks the indexer pages."""
    layout = tiny_layout()
    fmt = PageValueFormat.for_layout(layout)
    main_only = payload_for(layout)[: layout.main_page_bytes]
    forged = PageValueFormat(fmt.fingerprint, fmt.page_size, layout.main_page_bytes).encode(main_only)
    assert fmt.decode(forged).miss_reason == "size"
    cut = fmt.encode(payload_for(layout))[: HEADER.size + layout.main_page_bytes]
    assert fmt.decode(cut).miss_reason == "size"


def test_each_header_field_has_its_own_miss_reason():
    layout = tiny_layout()
    fmt = PageValueFormat.for_layout(layout)
    good = fmt.encode(payload_for(layout))
    assert fmt.decode(good[:10]).miss_reason == "truncated"
    assert fmt.decode(b"X" + good[1:]).miss_reason == "magic"
    assert fmt.decode(good[:8] + struct.pack("<H", 2) + good[10:]).miss_reason == "version"
    other = PageValueFormat.for_layout(tiny_layout(kv_dtype="bf16"))
    assert other.decode(good).miss_reason == "fingerprint"
    assert PageValueFormat(fmt.fingerprint, 32, fmt.page_bytes).decode(good).miss_reason == "page_size"
    assert fmt.decode(good + b"\0").miss_reason == "size"


@settings(max_examples=200, deadline=None)
@given(offset=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_any_flipped_byte_is_a_miss(offset, flip):
    layout = tiny_layout()
    fmt = PageValueFormat.for_layout(layout)
    value = bytearray(fmt.encode(payload_for(layout)))
    offset %= len(value)
    value[offset] ^= flip
    page = fmt.decode(bytes(value))
    assert not page.ok and page.miss_reason in ("magic", "version", "fingerprint", "page_size", "size", "checksum")


def test_payload_of_the_wrong_size_is_refused_at_encode():
    layout = tiny_layout()
    fmt = PageValueFormat.for_layout(layout)
    with pytest.raises(DsakvError, match="both caches of one page"):
        fmt.encode(payload_for(layout)[: layout.main_page_bytes])


def test_magic_is_at_offset_zero():
    fmt = PageValueFormat.for_layout(tiny_layout())
    assert fmt.encode(bytes(fmt.page_bytes)).startswith(MAGIC)
