"""A PD hand-off between engines that run the MTP layer (``speculative = "mtp"``, ``num_speculative_tokens = 3``): the draft
layer's two caches travel with the target's (SGLang #23539 left the MTP layer's index-K / KV behind, and the
decode side's speculative results went wrong). Prompts are longer than ``index_topk``, so the MTP layer's
indexer really selects: a wrong draft index-K changes its top-k and so its drafts."""

from __future__ import annotations

import pytest
import torch
from pd_support import PAGE, long_prompt, pd_config

from dsakv.engine.engine import Engine
from dsakv.engine.pd_pages import PdExporter, PoolPages
from dsakv.engine.pd_roles import PdRequest, decode, decode_importer, manifest_of, prefill
from dsakv.spec.layout import CacheLayout
from dsakv.transfer.manifest import Manifest, TransferError
from dsakv.transfer.messages import PageReport

pytestmark = pytest.mark.usefixtures("one_torch_thread")

K = 3  # the draft chain length


def mtp_config(**kw):
    return pd_config(speculative="mtp", num_speculative_tokens=K, **kw)


class Drafts:
    """A greedy ``draft_choice`` that records every draft it makes (request id, predicted index, token)."""

    def __init__(self) -> None:
        self.made: list[tuple[object, int, int]] = []

    def __call__(self, request, index: int, logits: torch.Tensor) -> int:
        token = int(logits.argmax())
        self.made.append((request.id, index, token))
        return token

    def tokens(self) -> list[tuple[int, int]]:
        return [(i, t) for _, i, t in self.made]


def draft_layers(engine: Engine) -> tuple[int, ...]:
    n = engine.layout.spec.num_hidden_layers
    return tuple(range(n, n + engine.layout.mtp_layers))


def hand_off(link, export):
    """hello / offer / write / done by hand, so the test knows the decode side's pages; the done reply."""
    if link.sender.peer is None:
        assert link.sender.hello()["ok"]
    acc = link.sender.offer(export)
    link.sender.write(export, acc)
    return acc, link.sender.done(acc, export.reports[acc.skip :])


def test_the_manifest_names_the_draft_layers_main_kv_and_index_k_with_their_item_lengths():
    engine = Engine(mtp_config())
    layout = engine.layout
    man = manifest_of(engine)
    (draft,) = draft_layers(engine)
    assert man.mtp_layers == layout.mtp_layers == 1
    got = {c.name: c.item_bytes for c in man.components if c.role == "draft"}
    assert got == {
        f"main:{draft}:draft": layout.main_page_bytes_per_layer,
        f"indexer:{draft}:draft": layout.indexer_page_bytes_per_layer,
    }
    assert man.page_bytes == layout.page_bytes == sum(c.item_bytes for c in man.components)  # nothing unnamed
    plain = manifest_of(Engine(pd_config()))
    assert man.page_bytes - plain.page_bytes == sum(got.values())


def test_the_draft_layers_rows_arrive_bit_for_bit_and_decode_matches_one_mtp_engine_and_a_plain_one(link_factory):
    cfg = mtp_config()
    drafts = Drafts()
    link = link_factory(Engine(cfg), Engine(cfg, draft_choice=drafts))
    req = PdRequest("m", tuple(long_prompt(3)), 8)
    export = link.export(req)
    acc, reply = hand_off(link, export)
    assert reply["outcome"] == "success" and acc.skip == 0 and len(acc.dest_pages) == len(export.pages) > 0
    src, dst = link.prefill.pool, link.decode.pool
    for layer in draft_layers(link.prefill):
        for view in ("main_view", "indexer_view"):
            a, b = getattr(src, view)(layer), getattr(dst, view)(layer)
            for page, dest in zip(export.pages, acc.dest_pages):
                assert a[page].any() and torch.equal(a[page], b[dest]), (view, layer, page)
    pages_src, pages_dst = PoolPages(src, manifest_of(link.prefill)), PoolPages(dst, manifest_of(link.decode))
    assert all(pages_src.read_block(p) == pages_dst.read_block(d) for p, d in zip(export.pages, acc.dest_pages))
    link.exporter.release(export)

    out = decode(link.decode, req, link.receiver.results[-1])
    assert out.stats.hit_tokens > link.decode.layout.spec.index_topk  # the MTP layer reads handed rows past its top-k
    ref_drafts = Drafts()
    ref = Engine(cfg, draft_choice=ref_drafts).generate([list(req.prompt)], req.max_new_tokens)[0]
    plain = Engine(pd_config()).generate([list(req.prompt)], req.max_new_tokens)[0]
    assert out.output_tokens == ref.output_tokens == plain.output_tokens
    # the decode side's MTP layer drafts exactly what one MTP engine's does (its handed rows are that engine's);
    # the untrained tiny MTP layer's drafts are rarely accepted, so the drafts themselves are compared
    assert drafts.tokens() and drafts.tokens() == ref_drafts.tokens()
    link.decode.check_integrity()
    link.prefill.check_integrity()


def test_store_route_carries_the_draft_layer(redis_url):
    from dsakv.engine.pd_store import StoreReceiver, StoreSender
    from dsakv.store.config import StoreConfig
    from dsakv.store.redis_store import redis_client

    cfg = mtp_config()
    pre, dec = Engine(cfg), Engine(cfg)
    man = manifest_of(pre)
    client = redis_client(StoreConfig(redis_url))
    sender = StoreSender(client, PoolPages(pre.pool, man), man)
    receiver = StoreReceiver(client, decode_importer(dec))
    req = PdRequest("s", tuple(long_prompt(6)), 6, cache_salt="t")
    export = prefill(pre, PdExporter(pre.pool, pre.radix, man), req)
    sender.put(export)
    result = receiver.take("s", timeout_s=5)
    assert result.outcome == "success" and result.received_pages == len(export.pages)
    out = decode(dec, req, result)
    assert out.stats.hit_tokens > 0
    assert out.output_tokens == Engine(pd_config()).generate([list(req.prompt)], 6)[0].output_tokens
    dec.check_integrity()


@pytest.mark.parametrize("decode_side", ["no MTP", "two MTP layers"])
def test_a_decode_side_with_another_mtp_layer_count_refuses_at_the_manifest(link_factory, decode_side):
    pre = Engine(mtp_config())
    mine = manifest_of(pre)
    if decode_side == "no MTP":  # over the link: the hello is refused, nothing is offered or written
        link = link_factory(pre, Engine(pd_config()))
        export = link.export(PdRequest("r", tuple(long_prompt(9)), 2))
        reply = link.sender.send(export)
        assert reply["ok"] is False and reply["reason"] == "manifest"
        message = reply["error"]
        assert link.sender.bytes_written == 0 and link.receiver.results == []
        link.decode.check_integrity()
    else:
        cfg = pre.layout
        layout = CacheLayout(
            cfg.spec,
            kv_dtype=cfg.kv_dtype,
            page_size=cfg.page_size,
            index_kpool=cfg.index_kpool,
            allow_any_page_size=True,
            indexer_dtype=cfg.indexer_dtype,
            mtp_layers=2,
        )
        with pytest.raises(TransferError) as err:
            Manifest.of(layout, pre.pool.fp8_scales + (1.0,)).check_matches(mine)
        assert err.value.reason == "manifest"
        message = str(err.value)
    assert "\n" not in message and message.startswith("manifest field mtp_layers:"), message


def _zero_draft_index_k(link, export) -> None:
    for layer in draft_layers(link.prefill):
        view = link.prefill.pool.indexer_view(layer)
        for page in export.pages:
            view[page] = 0


def test_a_draft_index_k_zeroed_on_the_wire_is_caught_by_the_page_digest(link_factory):
    """Zeroed after the digests were taken (what a sender that drops the draft layer's index-K writes): the
    decode side's digest of the received bytes differs, the hand-off fails and the request is recomputed."""
    link = link_factory(Engine(mtp_config()), Engine(mtp_config()))
    req = PdRequest("z", tuple(long_prompt(5)), 6)
    export = link.export(req)
    _zero_draft_index_k(link, export)
    _, reply = hand_off(link, export)
    assert reply["outcome"] == "recompute" and reply["reason"] == "digest", reply
    out = decode(link.decode, req, link.receiver.results[-1])
    assert out.stats.hit_tokens == 0
    assert out.output_tokens == Engine(pd_config()).generate([list(req.prompt)], 6)[0].output_tokens
    link.decode.check_integrity()


def test_a_forged_draft_index_k_passes_the_protocol_keeps_the_tokens_but_changes_the_drafts(link_factory):
    """Zeroed and digested again (a consistent liar): the protocol cannot tell, and neither can the output
    tokens — the target verifies every draft, so speculation is lossless — but the MTP layer's top-k over the
    handed positions changes, so its drafts do: only a draft-level comparison catches a lost draft index-K."""
    cfg = mtp_config()
    good, bad = Drafts(), Drafts()
    req = PdRequest("f", tuple(long_prompt(5)), 8)
    outs = {}
    for name, drafts in (("good", good), ("bad", bad)):
        link = link_factory(Engine(cfg), Engine(cfg, draft_choice=drafts))
        export = link.export(req)
        if name == "bad":
            _zero_draft_index_k(link, export)
            pages = link.exporter.pool_pages
            export.reports[:] = [
                PageReport(r.index, r.components, pages.digest(r.index, PAGE, export.pages[r.index]))
                for r in export.reports
            ]
        _, reply = hand_off(link, export)
        assert reply["outcome"] == "success"  # consistent lies pass the protocol
        outs[name] = decode(link.decode, req, link.receiver.results[-1])
        link.decode.check_integrity()
    assert outs["good"].output_tokens == outs["bad"].output_tokens  # lossless verification hides it here...
    assert good.tokens() != bad.tokens()  # ...but the drafts differ
