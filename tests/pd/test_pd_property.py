"""The commit rule as a property: over random hand-offs (some sharing a prefix with what the decode side
caches) and random faults, a hand-off commits exactly when every page it needs arrived whole and unchanged;
a committed prefix reads back bit for bit as the prefill side's; both engines stay consistent throughout.

The bytes move by a plain copy between the two pools (``PoolPages``): the transports have their own tests."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from pd_support import PAGE, pd_config

from dsakv.engine.engine import Engine
from dsakv.engine.pd_pages import PdExporter, PoolPages
from dsakv.engine.pd_roles import PdRequest, decode_importer, manifest_of, prefill
from dsakv.transfer.messages import PageReport

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAULTS = ("none", "duplicate_report", "drop_bytes", "flip_bit", "swap_pages", "drop_index_k_report", "drop_report")
HARMLESS = ("none", "duplicate_report")


class HandoffMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pre, self.dec = Engine(pd_config(num_pages=40)), Engine(pd_config(num_pages=40))
        man = manifest_of(self.pre)
        self.exporter = PdExporter(self.pre.pool, self.pre.radix, man)
        self.importer = decode_importer(self.dec)
        self.src, self.dst = PoolPages(self.pre.pool, man), self.importer.pool_pages
        self.n = 0

    @rule(stem=st.integers(0, 2), tail=st.integers(0, 3), pages=st.integers(1, 4), fault=st.sampled_from(FAULTS))
    def handoff(self, stem, tail, pages, fault):
        rng = random.Random(stem)
        prompt = [rng.randrange(512) for _ in range(2 * PAGE)] + [
            random.Random(100 + tail).randrange(512) for _ in range(pages * PAGE)
        ]
        self.n += 1
        export = prefill(self.pre, self.exporter, PdRequest(f"h{self.n}", tuple(prompt), 1))
        try:
            _, acc = self.importer.offer(export.offer)
            todo = list(range(acc.skip, export.offer.count.pages))
            if fault in ("swap_pages",) and len(todo) < 2 or fault != "none" and not todo:
                fault = "none"
            for i, page in zip(todo, acc.dest_pages):
                if not (fault == "drop_bytes" and i == todo[-1]):
                    self.dst.write_block(page, self.src.read_block(export.pages[i]))
            # a dropped write leaves the page's old bytes: when a freed page of the very same content is reused, they
            # are the right bytes, and committing them is right (the rule is about the bytes, not the transfer)
            whole = fault in HARMLESS or (
                fault == "drop_bytes"
                and self.dst.read_block(acc.dest_pages[len(todo) - 1]) == self.src.read_block(export.pages[todo[-1]])
            )
            if fault == "flip_bit":
                self.dst.parts(acc.dest_pages[0])[-1][7] ^= 0x10
            if fault == "swap_pages":
                a, b = acc.dest_pages[0], acc.dest_pages[1]
                block = self.dst.read_block(a)
                self.dst.write_block(a, self.dst.read_block(b))
                self.dst.write_block(b, block)
            reports = list(export.reports[acc.skip :])
            if fault == "duplicate_report":
                reports += reports[:1]
            if fault == "drop_report":
                reports = reports[1:]
            if fault == "drop_index_k_report":
                r = reports[0]
                reports[0] = PageReport(r.index, tuple(c for c in r.components if c.startswith("main")), r.digest)
            self.importer.report(acc.epoch, reports)
            result = self.importer.finish(acc.epoch)
            assert (result.outcome == "success") == whole, (fault, result)
            if result.outcome == "success":
                radix = self.dec.radix
                got = radix.match(radix.key(list(export.offer.tokens)), leave_one=False).pages
                assert len(got) == export.offer.count.pages
                for i, page in enumerate(got):
                    assert self.dst.read_block(page) == self.src.read_block(export.pages[i])
        finally:
            self.exporter.release(export)

    @invariant()
    def both_consistent(self):
        self.pre.check_integrity()
        self.dec.check_integrity()
        assert self.importer.held_pages() == 0


HandoffMachine.TestCase.settings = settings(max_examples=4, stateful_step_count=8, deadline=None)
test_commit_exactly_when_every_page_arrived_whole = HandoffMachine.TestCase
