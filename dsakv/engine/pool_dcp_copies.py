"""The page copies of a ``DcpPool``: offload, restore and the host tier's copies move every rank's share of a
page together, as one block in the *group* layout's packed byte order::

    | main l=0: V rows in token order (row o from rank o % dcp) | ... | indexer f: V / kpool keys | scales | ...

gathered from the owners of the main rows and from any indexer replica, and scattered back to the owners and
to every replica. The block is byte for byte what a one-rank pool of ``V = page_size x dcp``-token pages holds
for the same tokens (``tests/engine/test_dcp.py``), so host copies and store values move between the two.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsakv.engine.offload import HostPages, block_spans, host_buffer
from dsakv.errors import DsakvError

__all__ = ["DcpPageCopies"]


class DcpPageCopies:
    """Mixin of ``DcpPool`` (its state: ``layout``, ``rank_layout``, ``dcp``, ``_main``, ``_index``, ``_checker``,
    ``main_shards``). Reads of the pool do not modify it; writes check every page before any byte moves."""

    def _page_block(self, page: int, out: torch.Tensor) -> None:
        """Write page ``page``'s block (the group layout's packed order, every rank's share) into ``out``."""
        for cache, layer, off, length in block_spans(self.layout):
            if cache == "main":
                ranks = range(self.main_shards(layer))
                part = torch.stack([self._main[r][layer][page] for r in ranks], dim=1)  # [rows, ranks, row]
            else:
                part = self._sub_pages(layer, page)
                cut = self.rank_layout.indexer_scale_offset  # keys of a sub-page, then its scales
                part = torch.cat([part[:, :cut].reshape(-1), part[:, cut:].reshape(-1)])
            out[off : off + length].copy_(part.reshape(-1))

    def _write_block(self, page: int, block: torch.Tensor) -> None:
        """Scatter one block into every rank's share of ``page`` (the inverse of ``_page_block``)."""
        d = self.dcp
        for cache, layer, off, length in block_spans(self.layout):
            part = block[off : off + length]
            if cache == "main":
                shards = self.main_shards(layer)
                rows = part.view(-1, shards, self.rank_layout.main_row_bytes)
                for r in range(d):
                    self._main[r][layer][page].copy_(rows[:, r % shards])
                continue
            cut = self.rank_layout.indexer_scale_offset
            keys, scales = part[: cut * d].view(d, cut), part[cut * d :].view(d, -1)
            sub = torch.cat([keys, scales], dim=1)
            for r in range(d):
                self._index[r][layer][page * d : (page + 1) * d].copy_(sub)

    def _sub_pages(self, layer: int, page: int) -> torch.Tensor:
        return self._index[0][layer][page * self.dcp : (page + 1) * self.dcp]

    def offload_pages(self, pages: Sequence[int]) -> HostPages:
        """Both caches of ``pages``, every rank's share, as host blocks of the group layout."""
        idx = self._checker.pages(pages, "pages")
        host = host_buffer(len(idx), self.layout.page_bytes, self.device)
        for row, page in enumerate(idx.tolist()):
            self._page_block(page, host[row])
        return HostPages(self.layout, tuple(idx.tolist()), host, self.fp8_scales)

    def restore_pages(self, host: HostPages, pages: Sequence[int]) -> None:
        """Write ``host`` into ``pages`` (allocated, distinct) on every rank, bit-exact."""
        if not isinstance(host, HostPages):
            raise DsakvError(f"host: got {type(host).__name__}; must be the HostPages that offload_pages returned")
        if host.layout != self.layout:
            raise DsakvError("host: HostPages were taken with a different layout; restore needs the same layout")
        host.check()
        idx = self._checker.pages(pages, "pages")
        if len(idx) != host.num_pages:
            raise DsakvError(f"pages: {len(idx)} page ids; host holds {host.num_pages} pages")
        for row, page in enumerate(idx.tolist()):
            self._write_block(page, host.blocks[row])

    def copy_pages_to_host(self, pages: Sequence[int], dest: torch.Tensor, rows: Sequence[int]) -> None:
        idx = self._checker.pages(pages, "pages")
        for row, page in zip(self._host_rows(dest, rows, len(idx)), idx.tolist()):
            self._page_block(page, dest[row])

    def copy_pages_from_host(self, src: torch.Tensor, rows: Sequence[int], pages: Sequence[int]) -> None:
        idx = self._checker.pages(pages, "pages")
        for row, page in zip(self._host_rows(src, rows, len(idx)), idx.tolist()):
            self._write_block(page, src[row])

    def _host_rows(self, buf: torch.Tensor, rows: Sequence[int], n: int) -> list[int]:
        width = self.layout.page_bytes
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 2 or buf.shape[1] != width:
            raise DsakvError(f"host buffer: must be a host uint8 tensor [n, {width}] (packed blocks of both caches)")
        r = [int(x) for x in rows]
        if len(r) != n or any(not 0 <= x < buf.shape[0] for x in r):
            raise DsakvError(f"rows: {r} must be {n} row indices in 0..{buf.shape[0] - 1}")
        return r
