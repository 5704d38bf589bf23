"""Every fault of a hand-off ends in a clear error or a recompute — never a decode on wrong bytes — and leaves
both engines consistent (their integrity checks pass; no page leaked). Each test fails if its check goes."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
from pd_support import PAGE, long_prompt, pd_config

from dsakv.engine.engine import Engine
from dsakv.engine.pd_pages import PoolPages
from dsakv.engine.pd_roles import PdRequest, decode, decode_importer, manifest_of
from dsakv.spec.model_spec import ModelSpec
from dsakv.transfer.manifest import TransferError
from dsakv.transfer.messages import Offer, PageReport
from dsakv.transfer.pages import PageCount, check_destination, page_count

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REQ = PdRequest("f", tuple(long_prompt(11)), 4)


def begin(link, req=REQ):
    export = link.export(req)
    assert link.sender.hello()["ok"]
    acc = link.sender.offer(export)
    return export, acc


def finish_checks(link, export, reason: str, req=REQ) -> None:
    """The hand-off ended by the policy with ``reason``; the decode side recomputes right; both consistent."""
    result = link.receiver.results[-1]
    assert (result.outcome, result.reason) == ("recompute", reason), result
    assert link.decode.radix.total_tokens == 0  # nothing of the failed hand-off is visible
    link.decode.check_integrity()
    out = decode(link.decode, req, result)
    ref = Engine(pd_config()).generate([list(req.prompt)], req.max_new_tokens)[0]
    assert out.output_tokens == ref.output_tokens and out.stats.hit_tokens == 0
    link.exporter.release(export)
    link.prefill.check_integrity()
    link.decode.check_integrity()


def test_dropped_page_bytes_fail_the_digest(link):
    export, acc = begin(link)
    link.sender.write(export, acc, indices=range(1, export.offer.count.pages))  # page 0 never written
    reply = link.sender.done(acc, export.reports)
    assert reply["outcome"] == "recompute" and "page 0" in reply["error"]
    finish_checks(link, export, "digest")


def test_dropped_page_report_leaves_the_page_missing(link):
    export, acc = begin(link)
    link.sender.write(export, acc)
    reply = link.sender.done(acc, export.reports[:3] + export.reports[4:])
    assert "page 3: never arrived" in reply["error"]
    finish_checks(link, export, "missing")


def test_a_page_without_its_index_k_never_commits(link):
    """SGLang #24878 / #23773: main KV sent, index-K not: the page is incomplete, not silently stale."""
    export, acc = begin(link)
    link.sender.write(export, acc)
    main_only = tuple(n for n in export.reports[2].components if n.startswith("main"))
    reports = list(export.reports)
    reports[2] = PageReport(2, main_only, reports[2].digest)
    reply = link.sender.done(acc, reports)
    assert "page 2: indexer:0:target, indexer:2:target never arrived" in reply["error"]
    finish_checks(link, export, "missing")


def test_duplicated_reports_are_harmless_but_a_duplicated_write_is_caught(link):
    export, acc = begin(link)
    link.sender.write(export, acc)
    assert link.sender.done(acc, export.reports + export.reports[:2])["outcome"] == "success"
    assert link.receiver.importer.book.ended[acc.epoch].duplicates == 2
    link.exporter.release(export)
    link.decode.check_integrity()
    req = PdRequest("f2", tuple(long_prompt(12)), 4)
    export, acc = begin(link, req)
    link.sender.write(export, acc)
    link.sender.write(export, acc, indices=[0], to=[1])  # page 0's bytes land on page 1 too
    assert link.sender.done(acc, export.reports)["outcome"] == "recompute"
    assert link.receiver.results[-1].reason == "digest"
    link.exporter.release(export)
    link.decode.check_integrity()


def test_reordered_pages_fail_the_digest_which_binds_the_position(link):
    export, acc = begin(link)
    n = export.offer.count.pages
    link.sender.write(export, acc, indices=range(n), to=reversed(range(n)))
    assert "digest" in link.sender.done(acc, export.reports)["error"]
    finish_checks(link, export, "digest")


def test_a_truncated_handoff_is_missing_its_last_pages(link):
    export, acc = begin(link)
    n = export.offer.count.pages
    link.sender.write(export, acc, indices=range(n - 2))
    reply = link.sender.done(acc, export.reports[: n - 2])
    assert f"page {n - 2}: never arrived" in reply["error"]
    finish_checks(link, export, "missing")


def test_a_flipped_bit_fails_the_digest(link):
    export, acc = begin(link)
    link.sender.write(export, acc)
    view = link.decode.pool.indexer_view(2)
    view[acc.dest_pages[5], 100] ^= 0x01  # one bit of one index-K byte, after the write
    assert "page 5" in link.sender.done(acc, export.reports)["error"]
    finish_checks(link, export, "digest")


def test_another_tenants_cached_prefix_is_never_a_hit(link):
    a = PdRequest("ta", REQ.prompt, 3, cache_salt="tenant-a")
    b = PdRequest("tb", REQ.prompt, 3, cache_salt="tenant-b")
    for req in (a, b):
        export = link.export(req)
        assert link.sender.send(export)["outcome"] == "success"
        link.exporter.release(export)
    ra, rb = link.receiver.results[-2:]
    assert ra.skipped_pages == rb.skipped_pages == 0  # b's identical prompt moved all its pages again
    radix = link.decode.radix
    pa = radix.match(radix.key(list(REQ.prompt), None, "tenant-a"), leave_one=False).pages
    pb = radix.match(radix.key(list(REQ.prompt), None, "tenant-b"), leave_one=False).pages
    assert len(pa) == len(pb) == len(REQ.prompt) // PAGE and not set(pa) & set(pb)
    none = radix.match(radix.key(list(REQ.prompt), None, "tenant-c"), leave_one=False)
    assert none.pages == []
    link.decode.check_integrity()


def _killed_sender(address: str) -> None:
    """A prefill process that offers, writes half the pages and dies without a word."""
    import torch

    from dsakv.engine.pd_mooncake import TeSender
    from dsakv.engine.pd_pages import PdExporter
    from dsakv.engine.pd_roles import prefill

    torch.set_num_threads(1)
    pre = Engine(pd_config())
    man = manifest_of(pre)
    sender = TeSender(PoolPages(pre.pool, man), man, address, timeout_s=10)
    export = prefill(pre, PdExporter(pre.pool, pre.radix, man), REQ)
    sender.hello()
    acc = sender.offer(export)
    sender.write(export, acc, indices=range(acc.skip, export.offer.count.pages // 2))
    os._exit(1)


def test_a_sender_killed_mid_transfer_times_out_into_a_recompute(transfer_engine_installed):
    from dsakv.engine.pd_mooncake import TeReceiver

    dec = Engine(pd_config())
    receiver = TeReceiver(decode_importer(dec, timeout_s=3.0))
    proc = mp.get_context("spawn").Process(target=_killed_sender, args=(receiver.address,))
    proc.start()
    try:
        results = receiver.serve(1, timeout_s=60)
    finally:
        proc.join(30)
        receiver.close()
    assert proc.exitcode == 1
    assert [(r.outcome, r.reason) for r in results] == [("recompute", "timeout")]
    dec.check_integrity()
    assert dec.allocator.num_free == dec.allocator.num_pages  # the allocated pages came back
    out = decode(dec, REQ, results[0])
    assert out.output_tokens == Engine(pd_config()).generate([list(REQ.prompt)], REQ.max_new_tokens)[0].output_tokens


def test_a_late_report_after_an_abort_is_rejected(link):
    export, acc = begin(link)
    link.sender.write(export, acc)
    ack = link.sender.abort(acc.epoch)
    assert ack["ok"] and ack["ack"] == acc.epoch and ack["freed"] == len(acc.dest_pages)
    link.decode.check_integrity()
    late = link.sender.done(acc, export.reports)
    assert not late["ok"] and late["reason"] == "epoch" and "aborted" in late["error"]
    assert link.decode.radix.total_tokens == 0 and link.decode.allocator.num_allocated == 0
    second = link.sender.offer(export)  # a new allocation: new epoch, the old one stays closed
    assert second.epoch > acc.epoch
    link.sender.write(export, second)
    assert link.sender.done(second, export.reports)["outcome"] == "success"
    assert not link.sender.done(acc, export.reports)["ok"]
    link.exporter.release(export)
    link.decode.check_integrity()


@pytest.mark.parametrize("field", ["indexer_types", "page_size"])
def test_a_manifest_mismatch_refuses_before_any_page_moves(link_factory, field):
    spec = ModelSpec.preset("tiny")
    if field == "indexer_types":
        dec = Engine(pd_config(), spec=spec.with_indexer_pattern("FFFF"))
    else:
        dec = Engine(pd_config(page_size=32))
    link = link_factory(Engine(pd_config()), dec)
    reply = link.sender.hello()
    assert not reply["ok"] and reply["reason"] == "manifest" and field in reply["error"]
    export = link.export(REQ)
    offer = link.sender.call({"op": "offer", "offer": export.offer.to_json()})
    assert not offer["ok"] and "before a matching hello" in offer["error"]
    assert dec.allocator.num_allocated == 0
    link.exporter.release(export)
    dec.check_integrity()


def test_a_one_page_drift_in_the_announced_count_is_refused(link):
    export = link.export(REQ)
    c = export.offer.count
    drifted = Offer(
        export.offer.handoff_id, export.offer.tokens, None, None, PageCount(c.length, PAGE, c.pages + 1, c.last_valid)
    )
    assert link.sender.hello()["ok"]
    reply = link.sender.call({"op": "offer", "offer": drifted.to_json()})
    assert not reply["ok"] and reply["reason"] == "page_count" and f"{c.pages + 1} pages" in reply["error"]
    assert link.decode.allocator.num_allocated == 0
    link.exporter.release(export)
    link.decode.check_integrity()


def test_a_partial_last_page_is_counted_received_verified_and_not_cached(link):
    pre, dec = link.prefill, link.decode
    pre.generate([list(REQ.prompt)], 1)
    src = pre.radix.match(pre.radix.key(list(REQ.prompt)), leave_one=False).pages
    length = len(src) * PAGE - 5  # the last page holds 11 of 16 tokens
    count = page_count(length, PAGE)
    assert (count.pages, count.last_valid) == (len(src), PAGE - 5)
    importer = link.receiver.importer
    src_pages, dst_pages = PoolPages(pre.pool, importer.manifest), importer.pool_pages
    offer = Offer("part", REQ.prompt, None, None, count)
    _, acc = importer.offer(offer)
    for i, page in enumerate(acc.dest_pages):
        dst_pages.write_block(page, src_pages.read_block(src[i]))
    reports = [
        PageReport(i, dst_pages.names, src_pages.digest(i, count.valid_tokens(i), src[i])) for i in range(count.pages)
    ]
    importer.report(acc.epoch, reports)
    assert importer.finish(acc.epoch).outcome == "success"
    assert dec.radix.total_tokens == (count.pages - 1) * PAGE  # the tree keeps whole pages; the tail page is freed
    dec.check_integrity()
    wrong_last = Offer("part2", REQ.prompt, None, None, PageCount(length, PAGE, count.pages, PAGE))
    with pytest.raises(TransferError, match="valid in the last"):
        importer.offer(wrong_last)
    dec.check_integrity()


def test_an_empty_handoff_or_destination_is_an_error_never_a_silent_no_op(link):
    with pytest.raises(TransferError, match="empty hand-off"):
        page_count(0, PAGE)
    with pytest.raises(TransferError, match="empty or short"):
        check_destination(page_count(40, PAGE), 0, [])
    with pytest.raises(TransferError, match="empty hand-off"):
        link.exporter.export("none", long_prompt(99))  # nothing cached on the prefill side
    link.prefill.check_integrity()


@pytest.mark.parametrize("fault", ["truncated", "missing"])
def test_store_route_truncated_or_missing_page_recomputes(redis_url, fault):
    from dsakv.engine.pd_pages import PdExporter
    from dsakv.engine.pd_roles import prefill
    from dsakv.engine.pd_store import StoreReceiver, StoreSender
    from dsakv.store.config import StoreConfig
    from dsakv.store.redis_store import redis_client

    pre, dec = Engine(pd_config()), Engine(pd_config())
    man = manifest_of(pre)
    client = redis_client(StoreConfig(redis_url))
    export = prefill(pre, PdExporter(pre.pool, pre.radix, man), REQ)
    StoreSender(client, PoolPages(pre.pool, man), man).put(export)
    key = b"dsakv-pd:f:page:4"
    if fault == "truncated":
        client.set(key, client.get(key)[:-7])
    else:
        client.delete(key)
    result = StoreReceiver(client, decode_importer(dec)).take("f", timeout_s=5)
    assert (result.outcome, result.reason) == ("recompute", fault)
    assert dec.radix.total_tokens == 0
    dec.check_integrity()
    assert client.keys("dsakv-pd:*") == []


def test_a_decode_side_abort_keeps_the_pages_until_the_sender_acknowledges(link):
    """A remote writer cannot be fenced: pages of a decode-side abort are reused only after the sender's
    next message of that epoch (refused with reason ``aborted``) shows it stopped."""
    export, acc = begin(link)
    link.receiver.abort(acc.epoch)
    held = len(acc.dest_pages)
    assert link.receiver.importer.held_pages() == held
    assert link.decode.allocator.num_allocated == held  # quarantined, not free for another request
    link.sender.write(export, acc)  # the late bytes land in quarantined pages only
    reply = link.sender.done(acc, export.reports)
    assert not reply["ok"] and reply["reason"] == "aborted" and f"{held} pages released" in reply["error"]
    assert link.decode.allocator.num_allocated == 0 and link.decode.radix.total_tokens == 0
    again = link.sender.done(acc, export.reports)
    assert not again["ok"] and again["reason"] == "epoch"  # acknowledged once; the epoch stays closed
    link.exporter.release(export)
    link.decode.check_integrity()
