"""``RedisPageStore`` against a plain dict model, under random puts, server-side evictions and corruption.

The invariant: ``fetch_prefix`` returns exactly the leading pages the model holds intact, byte for byte; a
damaged value ends the hit, is counted, and is gone afterwards; ``lookup_prefix`` and ``present`` agree
with the server's keys. One real ``redis-server`` serves every example (flushed at the start of each).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from dsakv.cache.events import chain_hashes, chain_seed, get_hash, token_bytes
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.store.config import StoreConfig
from dsakv.store.redis_store import RedisPageStore
from dsakv.store.value import HEADER, PageValueFormat

LAYOUT = CacheLayout(ModelSpec.preset("tiny"), page_size=4, allow_any_page_size=True)
FORMAT = PageValueFormat.for_layout(LAYOUT)
PAGES = 8


def chain(salt: str) -> list[bytes]:
    h = get_hash("xxh3_64")
    tokens = list(range(PAGES * LAYOUT.page_size))
    return chain_hashes(h, chain_seed(h, None, salt), token_bytes(tokens), 16, 16, PAGES)


CHAINS = [chain("a"), chain("b")]


def payload(chain_id: int, page: int) -> bytes:
    return bytes([chain_id * 16 + page]) * LAYOUT.page_bytes


def test_store_matches_a_dict_model(redis_server):
    url = redis_server.url
    client = redis_server.client()

    class StoreMachine(RuleBasedStateMachine):
        @initialize()
        def start(self):
            client.flushdb()
            self.store = RedisPageStore(StoreConfig(url, batch_pages=3), FORMAT)
            self.model: dict[bytes, bytes] = {}
            self.damaged: set[bytes] = set()

        @rule(c=st.integers(0, 1), first=st.sampled_from([0, 0, 0, 2, 5]), n=st.integers(1, PAGES))
        def put(self, c, first, n):
            pages = [(CHAINS[c][i], payload(c, i)) for i in range(first, min(PAGES, first + n))]
            assert self.store.put_pages(pages) == len(pages)
            for h, p in pages:
                self.model[h] = p
                self.damaged.discard(h)

        @rule(c=st.integers(0, 1), i=st.integers(0, PAGES - 1))
        def server_evicts(self, c, i):
            h = CHAINS[c][i]
            client.delete(self.store.key(h))
            self.model.pop(h, None)
            self.damaged.discard(h)

        @rule(c=st.integers(0, 1), i=st.integers(0, PAGES - 1), offset=st.integers(0, HEADER.size + 200))
        def corrupt(self, c, i, offset):
            h = CHAINS[c][i]
            if h in self.model and h not in self.damaged:  # a second flip of the same byte would undo the first
                key = self.store.key(h)
                old = client.getrange(key, offset, offset)
                client.setrange(key, offset, bytes([old[0] ^ 0x5A]))
                self.damaged.add(h)

        @rule(c=st.integers(0, 1))
        def fetch(self, c):
            expect = []
            for h in CHAINS[c]:
                if h not in self.model or h in self.damaged:
                    break
                expect.append(self.model[h])
            invalid_before = self.store.counters.invalid_total
            got = [bytes(p) for p in self.store.fetch_prefix(CHAINS[c])]
            assert got == expect
            stop = len(expect)
            if stop < PAGES and CHAINS[c][stop] in self.damaged:  # the damaged page ending the hit is deleted
                assert self.store.counters.invalid_total == invalid_before + 1
                del self.model[CHAINS[c][stop]]
                self.damaged.discard(CHAINS[c][stop])

        @invariant()
        def presence_matches_the_model(self):
            for hashes in CHAINS:
                present = self.store.present(hashes)
                assert present == [h in self.model for h in hashes]
                lead = next((i for i, h in enumerate(hashes) if h not in self.model), PAGES)
                assert self.store.lookup_prefix(hashes) == lead

    run_state_machine_as_test(StoreMachine, settings=settings(max_examples=50, stateful_step_count=15, deadline=None))
