"""A prefill engine hands each finished prefill to a decode engine (another process, or a thread over the
same real transfer engine and control channel); the decode engine's greedy tokens and cache bytes equal one
engine's, with prompts longer than ``index_topk`` so a wrong index-K would change them."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest
import torch
from pd_support import PAGE, long_prompt, pd_config

from dsakv.engine.engine import Engine
from dsakv.engine.pd_pages import PdExporter, PoolPages
from dsakv.engine.pd_roles import PdRequest, decode, decode_process, manifest_of, prefill
from dsakv.transfer.messages import PageReport

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def one_engine(cfg, req: PdRequest):
    return Engine(cfg).generate(
        [list(req.prompt)], req.max_new_tokens, extra_key=req.extra_key, cache_salt=req.cache_salt
    )[0]


def test_decode_process_over_the_transfer_engine_matches_one_engine_tokens_and_cache_bytes(transfer_engine_installed):
    cfg = pd_config()
    reqs = [
        PdRequest("a", tuple(long_prompt(1)), 6, cache_salt="tenant-a"),
        PdRequest("b", tuple(long_prompt(1)), 6, cache_salt=b"tenant-b"),  # same prompt, other tenant
        PdRequest("c", tuple(long_prompt(2, 171)), 6, extra_key=7),
    ]
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=decode_process, args=(child, cfg, reqs, "mooncake", None, 60.0))
    proc.start()
    try:
        from dsakv.engine.pd_mooncake import TeSender

        address = parent.recv()
        pre = Engine(cfg)
        man = manifest_of(pre)
        sender = TeSender(PoolPages(pre.pool, man), man, address, timeout_s=60)
        exporter = PdExporter(pre.pool, pre.radix, man)
        for req in reqs:
            export = prefill(pre, exporter, req)
            assert sender.send(export)["outcome"] == "success"
            exporter.release(export)
        report = parent.recv()
    finally:
        proc.join(60)
    assert report["integrity"] is None
    for req, row in zip(reqs, report["rows"]):
        ref = one_engine(cfg, req)
        assert row["outcome"] == "success" and row["skipped_pages"] == 0  # no page shared across tenants
        assert row["received_pages"] == len(req.prompt) // PAGE
        assert row["tokens"] == ref.output_tokens
        assert row["cache"] == ref.cache.digest()
        assert row["hit_tokens"] == (len(req.prompt) - 1) // PAGE * PAGE
    pre.check_integrity()


@pytest.mark.parametrize("mode", ["exact", "production"])
def test_handoff_is_bit_exact_on_the_decode_side(link_factory, mode):
    kw = {"kv_dtype": "fp32", "indexer_dtype": "fp32"} if mode == "exact" else {}
    cfg = pd_config(**kw)
    link = link_factory(Engine(cfg), Engine(cfg))
    req = PdRequest("x", tuple(long_prompt(3)), 5)
    export = link.export(req)
    assert link.sender.send(export)["outcome"] == "success"
    link.exporter.release(export)
    out = decode(link.decode, req, link.receiver.results[-1])
    ref = one_engine(cfg, req)
    assert out.output_tokens == ref.output_tokens
    assert out.cache.equals(ref.cache)
    link.decode.check_integrity()
    link.prefill.check_integrity()


def test_checkpoint_model_handoff_matches_one_engine(link_factory, tmp_path: Path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
    from hf_checkpoints import TINY, hf_model, save_checkpoint

    folder = save_checkpoint(hf_model("glm_moe_dsa"), tmp_path / "ckpt")
    cfg = pd_config(kv_dtype="fp32", indexer_dtype="fp32")
    link = link_factory(Engine(cfg, checkpoint=folder), Engine(cfg, checkpoint=folder))
    prompt = tuple(t % TINY["vocab_size"] for t in long_prompt(4, 100))
    assert len(prompt) > TINY["index_topk"]
    req = PdRequest("ck", prompt, 5)
    export = link.export(req)
    assert link.sender.send(export)["outcome"] == "success"
    out = decode(link.decode, req, link.receiver.results[-1])
    ref = Engine(cfg, checkpoint=folder).generate([list(prompt)], 5)[0]
    assert out.output_tokens == ref.output_tokens
    # the handed-over pages bit for bit (the float32 model's tail rows depend on the forward's row count,
    # so the tokens computed after the hit are compared through the tokens they produce)
    n = len(prompt) // PAGE * PAGE
    assert all(torch.equal(a[:n], b[:n]) for a, b in zip(out.cache.main, ref.cache.main))
    assert all(torch.equal(a[:n], b[:n]) for a, b in zip(out.cache.indexer_keys, ref.cache.indexer_keys))
    assert all(torch.equal(a[:n], b[:n]) for a, b in zip(out.cache.indexer_scales, ref.cache.indexer_scales))


def _forge_index_k(link, export, how: str) -> list[PageReport]:
    """Overwrite the exported pages' index-K (zeros, or another page's) and digest them again, as a sender
    that lost index-K but reports consistently would: only the tokens can tell."""
    pool = link.prefill.pool
    for i, page in enumerate(export.pages):
        for layer in pool.layout.indexer_layers:
            view = pool.indexer_view(layer)
            view[page] = 0 if how == "zeroed" else view[export.pages[(i + 1) % len(export.pages)]].clone()
    pages = link.exporter.pool_pages
    return [
        PageReport(r.index, r.components, pages.digest(r.index, PAGE, export.pages[r.index])) for r in export.reports
    ]


@pytest.mark.parametrize("how", ["zeroed", "foreign"])
def test_a_wrong_index_k_changes_the_tokens_so_the_equality_tests_can_fail(link, how):
    req = PdRequest("w", tuple(long_prompt(5)), 8)
    ref = one_engine(pd_config(), req)
    export = link.export(req)
    reports = _forge_index_k(link, export, how)
    acc = link.sender.offer(export) if link.sender.peer else (link.sender.hello(), link.sender.offer(export))[1]
    link.sender.write(export, acc)
    assert link.sender.done(acc, reports)["outcome"] == "success"  # consistent lies pass the protocol...
    out = decode(link.decode, req, link.receiver.results[-1])
    assert out.output_tokens != ref.output_tokens  # ...but not the tokens: the e2e tests would catch them
    link.decode.check_integrity()


def test_store_route_matches_one_engine(redis_url):
    from dsakv.engine.pd_roles import decode_importer
    from dsakv.engine.pd_store import StoreReceiver, StoreSender
    from dsakv.store.config import StoreConfig
    from dsakv.store.redis_store import redis_client

    cfg = pd_config()
    pre, dec = Engine(cfg), Engine(cfg)
    man = manifest_of(pre)
    client = redis_client(StoreConfig(redis_url))
    sender = StoreSender(client, PoolPages(pre.pool, man), man)
    receiver = StoreReceiver(client, decode_importer(dec))
    exporter = PdExporter(pre.pool, pre.radix, man)
    req = PdRequest("s", tuple(long_prompt(6)), 6, cache_salt="t")
    export = prefill(pre, exporter, req)
    sender.put(export)
    result = receiver.take("s", timeout_s=5)
    assert result.outcome == "success" and result.received_pages == len(req.prompt) // PAGE
    out = decode(dec, req, result)
    ref = one_engine(cfg, req)
    assert out.output_tokens == ref.output_tokens and out.cache.equals(ref.cache)
    assert client.keys("dsakv-pd:*") == []  # consumed
    dec.check_integrity()


def test_a_prefix_the_decode_side_caches_is_skipped_for_both_caches(link):
    base = long_prompt(7)
    first = PdRequest("p1", tuple(base), 3)
    second = PdRequest("p2", tuple(base[:96] + long_prompt(8, 70)), 3)  # shares 6 pages with the first
    for req in (first, second):
        export = link.export(req)
        before = link.sender.bytes_written
        assert link.sender.send(export)["outcome"] == "success"
        link.exporter.release(export)
        decode(link.decode, req, link.receiver.results[-1])
    result = link.receiver.results[-1]
    assert result.skipped_pages == 6 and result.received_pages == len(second.prompt) // PAGE - 6
    assert link.sender.bytes_written - before == result.received_pages * link.decode.layout.page_bytes
    ref = one_engine(pd_config(), second)
    out = decode(link.decode, second, result)
    assert out.output_tokens == ref.output_tokens and out.cache.equals(ref.cache)
    link.decode.check_integrity()
