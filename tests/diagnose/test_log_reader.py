"""The log readers: every engine line parsed, bad input a count or one DsakvError, memory bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsakv.cli import main
from dsakv.errors import DsakvError
from dsakv.telemetry.log_lines import MALFORMED, DecodeLine, PoolLine, StatsLine, parse_line
from dsakv.telemetry.log_reader import BoundedSample, read_log
from dsakv.telemetry.metrics_text import read_metrics


def test_sglang_and_vllm_lines_parse_to_their_figures():
    d = parse_line(
        b"[2026-08-20 01:37:23 TP0] Decode batch, #running-req: 4, #token: 9,000, token usage: 0.02, "
        b"cuda graph: True, gen throughput (token/s): 300.12, #queue-req: 1, "
    )
    assert d == DecodeLine(4, 9000, 0.02, 300.12, 1)
    old = parse_line(
        b"Decode batch. #running-req: 1, #token: 27, token usage: 0.00, gen throughput (token/s): 5.89, #queue-req: 0, "
    )
    assert old == DecodeLine(1, 27, 0.0, 5.89, 0)
    pool = parse_line(b"KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 580096, KV size: 29.14 GB")
    assert pool.tokens == 580096 and pool.kv_bytes == 29.14 * 2**30 and not pool.mha
    assert parse_line(
        b"KV Cache is allocated. dtype: torch.bfloat16, #tokens: 10, K size: 1.00 GB, V size: 1.00 GB"
    ).mha
    merged = parse_line(b"GPU KV cache size: 569,600 tokens, Maximum concurrency for 202,752 tokens per request: 2.81x")
    assert merged[0] == PoolLine("vllm", 569600) and merged[1].concurrency == 2.81
    stats = parse_line(
        b"Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 200.5 tokens/s, "
        b"Running: 3 reqs, Waiting: 2 reqs, GPU KV cache usage: 5.1%, Prefix cache hit rate: 40.0%"
    )
    assert stats == StatsLine(10.0, 200.5, 3, 2, pytest.approx(0.051), pytest.approx(0.4))


def test_truncated_lines_and_numbers_past_int64_are_counted_not_raised(tmp_path):
    assert parse_line(b"Decode batch, #running-req: 4, #tok") == MALFORMED
    assert parse_line(b"Decode batch, #running-req: 99999999999999999999, #token: 1, token usage: 0.1, "
                      b"gen throughput (token/s): 1.0, #queue-req: 0") == MALFORMED  # fmt: skip
    assert parse_line(b"GPU KV cache size: 9223372036854775808 tokens") == MALFORMED
    assert parse_line(b"an unrelated line") is None
    log = tmp_path / "x.log"
    log.write_bytes(b"hello\nDecode batch, #running-req: 4, #tok\n\xff\xfe not utf-8\nDecode batch, #running")
    facts = read_log(str(log))
    assert (facts.lines, facts.ignored_lines, facts.malformed_lines, facts.malformed_at) == (4, 2, 2, [2, 4])


def test_binary_file_is_one_error(tmp_path, capsys):
    log = tmp_path / "core"
    log.write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    with pytest.raises(DsakvError, match="binary file"):
        read_log(str(log))
    assert main(["diagnose", "--log", str(log)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "binary file" in err


def test_a_log_with_no_engine_line_and_a_missing_file_are_one_line_errors(tmp_path, capsys):
    log = tmp_path / "nginx.log"
    log.write_text("GET / 200\n" * 10)
    assert main(["diagnose", "--log", str(log)]) == 1
    assert "no SGLang or vLLM line in 10 lines (10 ignored" in capsys.readouterr().err
    assert main(["diagnose", "--log", str(tmp_path / "absent.log")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_a_log_of_another_model_is_one_error(write_log, sglang, capsys):
    mha = write_log([sglang.pool(100000, 1.0)[1], "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 100000, "
                     "K size: 5.00 GB, V size: 5.00 GB"])  # fmt: skip
    assert main(["diagnose", "--log", mha]) == 1
    assert "MHA" in capsys.readouterr().err
    llama_like = write_log(sglang.pool(580096, 580096 * 160 * 1024 / 2**30), "other.log")  # 160 KiB a token
    assert main(["diagnose", "--log", llama_like]) == 1
    assert "another model" in capsys.readouterr().err


def test_bounded_sample_keeps_an_even_spread_in_bounded_memory():
    s = BoundedSample(size=8)
    for i in range(10_000):
        s.offer(i)
    assert len(s.items) < 16 and s.seen == 10_000
    gaps = {b - a for a, b in zip(s.items, s.items[1:])}
    assert gaps == {s.stride}


def test_prometheus_text_of_both_engines(tmp_path):
    text = tmp_path / "metrics.txt"
    text.write_text(
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 2.0\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 4\n'
        "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total 1000\n"
        "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 250\n"
        "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens 580096\n"
    )
    m = read_metrics(str(text))
    assert (m.ttft_mean_s, m.hit_rate, m.pool_tokens) == (0.5, 0.25, 580096)
    bad = tmp_path / "bad.txt"
    bad.write_text("vllm:x{le= 1 2 3\n")
    with pytest.raises(DsakvError, match="not Prometheus text"):
        read_metrics(str(bad))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**64),
            st.integers(0, 2**64),
            st.integers(0, 100),
            st.integers(0, 10**7),
            st.integers(0, 2**64),
            st.booleans(),
            st.sampled_from(["Decode batch, ", "Decode batch. ", "Prefill "]),
            st.sampled_from(
                ["", "cuda graph: True, ", "cuda graph: False, gen throughput (token/s): 1,000.00, #queue-req: 7, "]
            ),
        ),
        max_size=30,
    )
)
def test_fast_decode_path_reads_what_the_line_parser_reads(tmp_path_factory, rows):
    """The reader's fast paths for decode lines (SGLang's common form, and the general one) give the same figures as
    ``parse_line`` of every line, also where a line holds two throughputs (the first is the line's)."""
    lines = []
    for running, tokens, usage, tput, queued, grouped, head, middle in rows:  # middle: SGLang's own, or a trap
        tok = f"{tokens:,}" if grouped else str(tokens)
        lines.append(f"[x] {head}#running-req: {running}, #token: {tok}, token usage: {usage / 100:.2f}, {middle}"
                     f"gen throughput (token/s): {tput / 100:.2f}, #queue-req: {queued}, ")  # fmt: skip
    path = tmp_path_factory.mktemp("logs") / "p.log"
    path.write_text("".join(line + "\n" for line in lines))
    fast = read_log(str(path))
    slow = read_log(str(path), fast=False)
    assert fast.counts() == slow.counts() and fast.decode.items == slow.decode.items
    assert fast.gaps.items == slow.gaps.items
    assert (fast.queued_lines, fast.queued_free_lines, fast.queued_min_usage) == (
        slow.queued_lines, slow.queued_free_lines, slow.queued_min_usage)  # fmt: skip


PIECES = [b"Decode batch, ", b"Prefill batch, ", b"#running-req: ", b"#token: ", b"token usage: ", b"#queue-req: ",
          b"gen throughput (token/s): ", b"KV Cache is allocated. ", b"#tokens: ", b"KV size: ", b" GB", b"GPU KV cache size: ",
          b"Avg prompt throughput: ", b"max_total_num_tokens=", b"9" * 25, b"1,024", b"0.5", b", ", b"\xff", b"x"]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES) | st.binary(max_size=8), max_size=24))
def test_no_line_raises(pieces):
    """Whatever a line holds (engine words in any order, huge numbers, bad UTF-8), it parses to a record, None or
    MALFORMED: never an exception."""
    line = b"".join(pieces).replace(b"\n", b" ")
    result = parse_line(line)
    assert result is None or result == MALFORMED or isinstance(result, (tuple, list))  # records are named tuples
