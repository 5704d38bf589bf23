"""Mooncake trace reader: validation with line numbers, --skip-bad counting, order, token ids."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsakv.errors import DsakvError
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import (
    DIRECT_HASH_IDS,
    MOONCAKE_BLOCK,
    PROMPT_TOKEN_LIMIT,
    WIDE_TOKEN_LIMIT,
    MooncakePrompt,
    MooncakeTrace,
    TraceOrderWarning,
    TraceRequest,
    block_token,
    check_wide_page_size,
    mooncake_tokens,
    read_mooncake,
    write_mooncake,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _row(ts=0, n=600, out=10, ids=(0, 1)):
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": list(ids)}


def test_tokens_are_block_ranges_cut_at_input_length():
    toks = mooncake_tokens([3, 5], 600)
    assert isinstance(toks, np.ndarray) and toks.dtype == np.int64
    assert toks.size == 600
    assert toks[0] == 3 * 512 and toks[511] == 3 * 512 + 511
    assert toks[512] == 5 * 512 and toks[-1] == 5 * 512 + 87


def test_shared_hash_prefix_gives_shared_tokens():
    a = mooncake_tokens([7, 8, 9], 1300)
    b = mooncake_tokens([7, 8, 10], 1100)
    assert np.array_equal(a[:1024], b[:1024])
    assert not np.array_equal(a[1024:1100], b[1024:1100])


def test_tokens_reject_too_few_hash_ids():
    with pytest.raises(DsakvError, match="input_length"):
        mooncake_tokens([1], 513)


@pytest.mark.parametrize(
    "bad, field",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"input_length": 10, "output_length": 1, "hash_ids": [0]}), "'timestamp'"),
        (json.dumps({"timestamp": 0, "output_length": 1, "hash_ids": [0]}), "'input_length'"),
        (json.dumps(_row(out=-1)), "'output_length'"),
        (json.dumps(_row(ts=-5)), "'timestamp'"),
        (json.dumps(_row(n=600, ids=[0])), "hash_ids"),
        (json.dumps(_row(ids=[0, -1])), "hash_ids"),
        (json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1}), "'hash_ids'"),
    ],
)
def test_malformed_line_error_names_line_number(tmp_path, bad, field):
    path = _write(tmp_path / "t.jsonl", [_row(), _row(ts=1), bad])
    with pytest.raises(DsakvError, match="line 3") as info:
        list(read_mooncake(path))
    assert field in str(info.value)


def test_skip_bad_counts_skipped_lines_and_keeps_good_ones(tmp_path):
    path = _write(tmp_path / "t.jsonl", [_row(), "{oops", _row(ts=2, n=10, ids=[4]), json.dumps(_row(out=-3))])
    trace = MooncakeTrace(path, skip_bad=True)
    reqs = list(trace)
    assert trace.skipped == 2 and len(reqs) == 2 and len(trace) == 2
    assert "line 2" in trace.first_error
    assert [r.line for r in reqs] == [1, 3]


def test_bad_line_raises_before_anything_is_yielded(tmp_path):
    path = _write(tmp_path / "t.jsonl", [_row(), _row(ts=1), "{oops"])
    with pytest.raises(DsakvError):
        read_mooncake(path)  # validation happens before the iterator is handed out


def test_out_of_order_timestamps_are_sorted_with_warning(tmp_path):
    path = _write(tmp_path / "t.jsonl", [_row(ts=5), _row(ts=1, ids=[2, 3]), _row(ts=5, ids=[4, 5]), _row(ts=3)])
    with pytest.warns(TraceOrderWarning, match="out of order"):
        trace = MooncakeTrace(path)
    ts = [r.timestamp_ms for r in trace]
    assert ts == sorted(ts) == [1, 3, 5, 5]
    assert [r.line for r in trace if r.timestamp_ms == 5] == [1, 3]  # stable


@pytest.mark.filterwarnings("ignore::dsakv.workloads.traces.TraceOrderWarning")
@pytest.mark.parametrize("stamps", [[0, 2, 2, 7], [5, 1, 5, 3]])
def test_a_held_trace_gives_the_streamed_requests_without_reading_the_file_again(tmp_path, stamps):
    rows = [_row(ts=t, ids=[2 * i, 2 * i + 1]) for i, t in enumerate(stamps)] + ["not json"]
    path = _write(tmp_path / "t.jsonl", rows)
    streamed = list(MooncakeTrace(path, skip_bad=True))
    held = MooncakeTrace(path, skip_bad=True, hold=True)
    path.unlink()  # iterating a held trace reads nothing
    assert list(held) == list(held) == streamed and (held.skipped, len(held)) == (1, 4)


def test_ordered_trace_gives_no_warning(tmp_path):
    path = _write(tmp_path / "t.jsonl", [_row(ts=0), _row(ts=0), _row(ts=2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(read_mooncake(path))) == 3


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DsakvError, match="cannot read"):
        MooncakeTrace(tmp_path / "absent.jsonl")


def test_write_then_read_round_trips_a_generated_trace(tmp_path):
    reqs = generate_scenario("chat", seed=3, scale=0.2)
    path = tmp_path / "chat.jsonl"
    assert write_mooncake(path, reqs) == len(reqs)
    back = list(read_mooncake(path))
    assert [(r.timestamp_ms, r.input_length, r.output_length, r.hash_ids) for r in back] == [
        (r.timestamp_ms, r.input_length, r.output_length, r.hash_ids) for r in reqs
    ]


def test_trace_request_is_immutable():
    r = TraceRequest(0, 1, 1, (0,))
    with pytest.raises(AttributeError):
        r.input_length = 2  # type: ignore[misc]


@pytest.mark.skipif(not DATA.exists(), reason=f"Mooncake trace not present at {DATA} (shared data absent)")
def test_mooncake_conversation_trace_counts():
    trace = MooncakeTrace(DATA)
    assert len(trace) == 12031
    assert trace.input_tokens == 144_793_823
    assert trace.skipped == 0 and trace.out_of_order == 0


def test_direct_hash_ids_end_at_2_to_the_31_and_wide_ones_stay_below_outputs(tmp_path):
    # Block h < 2**22 holds ids h*512 .. h*512+511 (as always); from 2**22 up an id is spread over its tokens'
    # digits, in [2**31, 2**31 + 2**30), so the simulator's output ids (counted down from 2**32 - 1) never meet one.
    last = DIRECT_HASH_IDS - 1
    trace = MooncakeTrace(
        _write(tmp_path / "ok.jsonl", [_row(n=512, ids=[last]), _row(n=1024, ids=[last + 1, 2**63 - 1])])
    )
    direct, wide = (mooncake_tokens(r.hash_ids, r.input_length) for r in trace)
    assert int(direct[-1]) == 2**31 - 1 and int(direct[0]) == 2**31 - 512
    assert 2**31 <= int(wide.min()) and int(wide.max()) < WIDE_TOKEN_LIMIT == 2**31 + 2**30
    assert wide[:3].tolist() == [2**31, 2**31 + 1, 2**31 + 2]  # v = 0: every digit 0, the position beside it
    with pytest.raises(
        DsakvError, match=r"trace line 2: field 'hash_ids' contains -1: must be integers in 0..2\*\*63-1"
    ):
        MooncakeTrace(_write(tmp_path / "neg.jsonl", [_row(), _row(n=512, ids=[-1])]))


@settings(max_examples=300, deadline=None)
@given(
    a=st.integers(0, 2**63 - 1),
    b=st.integers(0, 2**63 - 1),
    page=st.sampled_from([4, 8, 64, 512]),
    offset=st.integers(0, 7),
)
def test_different_hash_ids_never_share_a_page(a, b, page, offset):
    """Any two blocks differ on every page of a size the simulator accepts (at least 3 tokens, dividing 512)."""
    assert check_wide_page_size(page) is None
    start = (offset * page) % MOONCAKE_BLOCK
    ta, tb = (mooncake_tokens([h], MOONCAKE_BLOCK)[start : start + page] for h in (a, b))
    assert (ta.tolist() == tb.tolist()) == (a == b)
    assert int(ta[-1]) == MooncakePrompt((a,), MOONCAKE_BLOCK)[start + page - 1]


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(
        st.one_of(st.integers(0, DIRECT_HASH_IDS - 1), st.integers(DIRECT_HASH_IDS, 2**63 - 1)), min_size=1, max_size=4
    ),
    cut=st.integers(0, MOONCAKE_BLOCK - 1),
)
def test_expanded_prompt_is_each_token_of_its_blocks_in_both_dtypes(ids, cut):
    """Direct, wide and mixed rows expand (int64 ``mooncake_tokens``, uint32 ``np.asarray``) to ``block_token``
    of every position."""
    length = len(ids) * MOONCAKE_BLOCK - cut
    expected = [block_token(h, i, MOONCAKE_BLOCK) for h in ids for i in range(MOONCAKE_BLOCK)][:length]
    as_int64, as_uint32 = mooncake_tokens(ids, length), np.asarray(MooncakePrompt(tuple(ids), length))
    assert as_int64.dtype == np.int64 and as_uint32.dtype == np.uint32
    assert as_int64.tolist() == as_uint32.tolist() == expected


@settings(max_examples=100, deadline=None)
@given(
    block=st.sampled_from([3, 64, 96, 100]),
    ids=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=3),
    data=st.data(),
)
def test_expanded_prompt_is_each_token_of_its_blocks_for_any_block_size(block, ids, data):
    """Blocks whose size the digit count divides (3, 96) or does not (64, 100) expand to ``block_token`` of
    every position, with direct ids below 2**31 // block mixed in."""
    ids = [h % (PROMPT_TOKEN_LIMIT // block) if i % 2 else h for i, h in enumerate(ids)]
    length = len(ids) * block - data.draw(st.integers(0, block - 1))
    expected = [block_token(h, i, block) for h in ids for i in range(block)][:length]
    as_int64 = mooncake_tokens(ids, length, block)
    as_uint32 = np.asarray(MooncakePrompt(tuple(ids), length, block))
    assert as_int64.tolist() == as_uint32.tolist() == expected


def test_pages_too_small_or_straddling_blocks_are_refused_for_wide_ids():
    assert "at least 3 tokens dividing 512; page_size = 2" in check_wide_page_size(2)
    assert "page_size = 192" in check_wide_page_size(192)


def test_tenant_and_cache_salt_fields_are_read_and_written_back(tmp_path):
    rows = [
        _row(0) | {"tenant": "acme"},
        _row(1) | {"cache_salt": 12345},
        _row(2) | {"tenant": 7, "cache_salt": "s3cret"},
        _row(3) | {"tenant": None, "cache_salt": None},
        _row(4),
    ]
    reqs = list(read_mooncake(_write(tmp_path / "t.jsonl", rows)))
    namespaces = [(r.tenant, r.cache_salt) for r in reqs]
    assert namespaces == [("acme", None), (None, 12345), (7, "s3cret"), (None, None), (None, None)]
    write_mooncake(tmp_path / "out.jsonl", reqs)
    again = list(read_mooncake(tmp_path / "out.jsonl"))
    assert [(r.tenant, r.cache_salt, r.hash_ids) for r in again] == [(r.tenant, r.cache_salt, r.hash_ids) for r in reqs]
    assert "tenant" not in (tmp_path / "out.jsonl").read_text().splitlines()[1]  # absent stays absent


@pytest.mark.parametrize("field", ["tenant", "cache_salt"])
@pytest.mark.parametrize("value", [1.5, True, [1], {"a": 1}, 2**63])
def test_bad_tenant_or_cache_salt_names_the_line_and_field(tmp_path, field, value):
    path = _write(tmp_path / "t.jsonl", [_row(0), _row(1) | {field: value}])
    with pytest.raises(DsakvError, match=f"trace line 2: field '{field}'"):
        MooncakeTrace(path)
    trace = MooncakeTrace(path, skip_bad=True)
    assert trace.skipped == 1 and len(trace) == 1


def test_scenario_tenants_deal_prompts_out_without_changing_the_requests():
    plain = generate_scenario("mixed", seed=1, scale=0.2)
    dealt = generate_scenario("mixed", seed=1, scale=0.2, tenants=3)
    assert [(r.timestamp_ms, r.hash_ids, r.output_length) for r in dealt] == [
        (r.timestamp_ms, r.hash_ids, r.output_length) for r in plain
    ]
    assert {r.tenant for r in plain} == {None} and {r.tenant for r in dealt} == {"tenant-0", "tenant-1", "tenant-2"}
    with pytest.raises(DsakvError, match="tenants"):
        generate_scenario("chat", tenants=-1)
