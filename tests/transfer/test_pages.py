"""One page-count function, the position-bound digest, and the merged copy spans."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsakv.transfer.manifest import TransferError
from dsakv.transfer.pages import PageCount, check_destination, check_same_count, copy_spans, page_count, page_digest


@given(st.integers(1, 10**7), st.sampled_from([1, 16, 64, 128]))
def test_page_count_covers_the_length_with_a_valid_last_page(length, ps):
    c = page_count(length, ps)
    assert (c.pages - 1) * ps + c.last_valid == length and 1 <= c.last_valid <= ps
    assert c.valid_tokens(c.pages - 1) == c.last_valid and c.valid_tokens(0) == (ps if c.pages > 1 else length)
    with pytest.raises(TransferError):
        c.valid_tokens(c.pages)


def test_glm53_1m_request_is_16384_pages():
    assert page_count(1_048_576, 64) == PageCount(1_048_576, 64, 16_384, 64)


def test_a_one_page_drift_or_another_last_page_is_refused():
    mine = page_count(150, 16)
    with pytest.raises(TransferError, match="10 pages .* 11 pages"):
        check_same_count(mine, PageCount(150, 16, 11, 6))
    with pytest.raises(TransferError, match="6 valid in the last"):
        check_same_count(mine, PageCount(150, 16, 10, 16))
    check_same_count(mine, page_count(150, 16))


def test_empty_handoff_and_empty_destination_are_errors():
    with pytest.raises(TransferError, match="empty hand-off"):
        page_count(0, 64)
    with pytest.raises(TransferError, match="empty or short"):
        check_destination(page_count(64, 64), 0, [])
    with pytest.raises(TransferError, match="empty or short"):
        check_destination(page_count(640, 64), 2, [1, 2, 3])
    check_destination(page_count(640, 64), 10, [])  # everything cached: nothing to receive


def test_digest_golden_value_and_it_binds_position_and_bytes():
    data = bytes(range(256)) * 4
    assert (
        page_digest(0, 64, [data]) == 0x3ECA2361CAFBBA9C
    )  # xxh3_64(<QI 0, 64> + data): a change of the encoding breaks every peer
    assert page_digest(0, 64, [data[:100], data[100:]]) == page_digest(0, 64, [data])
    assert page_digest(1, 64, [data]) != page_digest(0, 64, [data])
    assert page_digest(0, 63, [data]) != page_digest(0, 64, [data])
    flipped = bytearray(data)
    flipped[500] ^= 1
    assert page_digest(0, 64, [bytes(flipped)]) != page_digest(0, 64, [data])


def test_copy_spans_merge_runs_of_contiguous_pages():
    packed = {"main:0:target": (1000, 30), "indexer:0:target": (1020, 30)}
    lengths = {"main:0:target": 20, "indexer:0:target": 10}
    assert copy_spans(packed, packed, lengths, [0, 1, 2], [4, 5, 6]) == [(1000, 1120, 90)]
    assert copy_spans(packed, packed, lengths, [0, 2], [4, 5]) == [(1000, 1120, 30), (1060, 1150, 30)]
    slot = {"main:0:target": (0, 20), "indexer:0:target": (10_000, 10)}
    spans = copy_spans(slot, slot, lengths, [3, 4], [7, 8])
    assert spans == [(60, 140, 40), (10_030, 10_070, 20)]
    with pytest.raises(TransferError, match="different components"):
        copy_spans(slot, {"main:0:target": (0, 20)}, lengths, [1], [1])
