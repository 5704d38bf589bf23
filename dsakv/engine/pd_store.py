"""PD through the store: the hand-off over a Redis server both engines reach (as LMCache / Mooncake-store
deployments do), with the same manifest, page count, digests and commit rule as the transfer engine.

The prefill side writes every page of an export as one value (both caches: every named component in the
manifest's order) under ``{prefix}:{handoff}:page:{i}``, then — last, so a reader never sees a hand-off
whose pages are not all written — the hand-off's meta value ``{prefix}:{handoff}:meta`` (manifest, offer,
page reports). The decode side reads the meta value, compares the manifests, offers to its importer
(skipping the prefix it caches in the request's namespace, both caches), reads the pages it needs, writes
each one of the right length into its allocated page, and finishes: commit into the radix tree, or the
policy's outcome. The keys expire (``ttl_s``) and the reader deletes them once the hand-off has ended.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from dsakv.engine.pd_pages import Export, ImportResult, PdImporter, PoolPages
from dsakv.transfer.manifest import Manifest, TransferError
from dsakv.transfer.messages import Offer, PageReport


def _keys(prefix: str, handoff_id: str) -> tuple[bytes, str]:
    return f"{prefix}:{handoff_id}:meta".encode(), f"{prefix}:{handoff_id}:page:"


class StoreSender:
    """Writes exports into the store (redis-py client ``client``)."""

    def __init__(
        self, client, pool_pages: PoolPages, manifest: Manifest, prefix: str = "dsakv-pd", ttl_s: int = 600
    ) -> None:
        self.client, self.pool_pages, self.manifest, self.prefix, self.ttl_s = (
            client,
            pool_pages,
            manifest,
            prefix,
            ttl_s,
        )
        self.bytes_written = 0

    def put(
        self, export: Export, indices: Sequence[int] | None = None, reports: Sequence[PageReport] | None = None
    ) -> None:
        """Every page of ``export`` (or ``indices``), then the meta value with ``reports`` (default: all)."""
        meta, page_key = _keys(self.prefix, export.offer.handoff_id)
        indices = range(export.offer.count.pages) if indices is None else indices
        reports = export.reports if reports is None else reports
        pipe = self.client.pipeline(transaction=False)
        for i in indices:
            value = self.pool_pages.read_block(export.pages[i])
            pipe.set(f"{page_key}{i}".encode(), value, ex=self.ttl_s)
            self.bytes_written += len(value)
        body = {
            "manifest": self.manifest.to_json(),
            "offer": export.offer.to_json(),
            "pages": [r.to_json() for r in reports],
        }
        pipe.set(meta, json.dumps(body, separators=(",", ":")).encode(), ex=self.ttl_s)
        pipe.execute()


class StoreReceiver:
    """Takes hand-offs out of the store into a decode engine's pool and radix tree."""

    def __init__(self, client, importer: PdImporter, prefix: str = "dsakv-pd", poll_s: float = 0.01) -> None:
        self.client, self.importer, self.prefix, self.poll_s = client, importer, prefix, poll_s
        self.pool_pages = importer.pool_pages
        self.page_bytes = sum(c.item_bytes for c in importer.manifest.components)

    def take(self, handoff_id: str, timeout_s: float = 30.0) -> ImportResult:
        """Wait for the hand-off's meta value (up to ``timeout_s``), then import it.

        Raises ``TransferError`` when nothing was offered (timeout, a refused manifest, a page-count
        mismatch): this side then holds nothing. Once pages are allocated every error ends the transfer by
        its policy and comes back as the result."""
        meta_key, page_key = _keys(self.prefix, handoff_id)
        deadline = time.monotonic() + timeout_s
        while (raw := self.client.get(meta_key)) is None:
            if time.monotonic() > deadline:
                raise TransferError("timeout", f"hand-off {handoff_id}: no meta value in the store after {timeout_s} s")
            time.sleep(self.poll_s)
        try:
            body = json.loads(raw)
            peer, offer = Manifest.from_json(body["manifest"]), Offer.from_json(body["offer"])
            reports = [PageReport.from_json(r) for r in body["pages"]]
        except (ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, TransferError):
                raise
            raise TransferError("state", f"hand-off {handoff_id}: malformed meta value ({exc})") from None
        self.importer.manifest.check_matches(peer)
        if offer.handoff_id != str(handoff_id):
            raise TransferError("state", f"meta value of {handoff_id} names hand-off {offer.handoff_id}")
        _, acc = self.importer.offer(offer)
        try:
            wanted = list(range(acc.skip, offer.count.pages))
            values = self.client.mget([f"{page_key}{i}".encode() for i in wanted]) if wanted else []
            present = []
            for i, page, value in zip(wanted, acc.dest_pages, values):
                if value is None:
                    continue  # missing in the store: never reported as arrived
                if len(value) != self.page_bytes:
                    raise TransferError(
                        "truncated", f"page {i}: {len(value)} B in the store; a page is {self.page_bytes} B"
                    )
                self.pool_pages.write_block(page, value)
                present.append(i)
            self.importer.report(acc.epoch, [r for r in reports if r.index in present])
        except TransferError as exc:
            result = self.importer.fail(acc.epoch, exc)
        except Exception as exc:  # the store went away mid-transfer: the pages are freed, the policy decides
            result = self.importer.fail(acc.epoch, TransferError("sender", f"store: {exc}"))
        else:
            result = self.importer.finish(acc.epoch)
        self.client.delete(meta_key, *[f"{page_key}{i}".encode() for i in range(offer.count.pages)])
        return result


__all__ = ["StoreReceiver", "StoreSender"]
