"""``dsakv demo --host-bytes B --store redis://...``: tier hits end to end, outputs still match the reference."""

from __future__ import annotations

import json

import pytest
import torch

from dsakv.cli import main
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec

PAGE_BYTES = CacheLayout(ModelSpec.preset("tiny"), page_size=16, allow_any_page_size=True).page_bytes


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def demo(capsys, *flags: str) -> dict:
    assert main(["demo", "--json", "--conversations", "4", "--max-new-tokens", "4", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_demo_with_host_tier_and_store_reports_hits_per_tier(capsys, redis_server):
    first = demo(capsys, "--store", redis_server.url)
    assert first["outputs_match"] and first["caches_match"]
    assert first["hit_tokens_store"] > 0 and first["store_invalid_values"] == first["store_failed_calls"] == 0
    assert first["hit_tokens_device"] + first["hit_tokens_host"] + first["hit_tokens_store"] == first["hit_tokens"]
    assert first["store_bytes_written"] % PAGE_BYTES == 0 and first["store_bytes_written"] > 0
    # a second engine on the same server finds the first one's pages: more store hits, nothing written twice
    second = demo(capsys, "--store", redis_server.url, "--host-bytes", str(8 * PAGE_BYTES))
    assert second["outputs_match"] and second["caches_match"]
    assert second["host_pages"] == 8 and second["hit_tokens_store"] > first["hit_tokens_store"]
    assert second["hit_tokens_device"] + second["hit_tokens_host"] + second["hit_tokens_store"] == second["hit_tokens"]


def test_demo_with_unreachable_store_still_matches(capsys, redis_server):
    url = redis_server.url
    redis_server.stop()
    out = demo(capsys, "--store", url)
    assert out["outputs_match"] and out["caches_match"]
    assert out["hit_tokens_store"] == 0 and out["store_failed_calls"] > 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--store", "redis://localhost/0"], "store url 'redis://localhost/0': needs a host and a port"),
        (["--host-bytes", "10"], "--host-bytes = 10: below one page of both caches"),
        (["--host-bytes", "2GiB"], "--host-bytes = 2GiB: above the demo's"),
    ],
)
def test_demo_tier_flags_out_of_range_are_one_line_errors(capsys, flags, message):
    assert main(["demo", *flags]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
