"""Cache events and chained page hashes: golden values, process independence, salts, collisions."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import HASH_FUNCTIONS, AllCleared, PagesRemoved, PagesStored, encode_namespace, token_bytes
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError

PS = 4
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]

# (seed, page 0, page 1) of PROMPT with page size 4: no namespace, then cache_salt="tenant"
GOLDEN = {
    "xxh3_64": (
        ("2bfcd6b9d84c7604", "d6ce1de1270a167b", "944adb03f43f0a5f"),
        ("897284b630e01f3e", "7eb2689cef85d71e", "2e06498ec35d07e8"),
    ),
    "blake2b": (
        (
            "7f65781166681eca788026eb4c9c70ab4f65bb872f1af879dea6849c8f87f333",
            "bb2eb262e3cb8acd1765ca7cba3c6b931877f8301a08ae6fb1b91009c9a6a545",
            "f7a9cb5365105d4a80a80f684b2965e45dd109dd2a47b0fa2e94853bb16cc39e",
        ),
        (
            "5ae26045dcdffd49e9297bff08de47788084c83a4e62a48777867588e77f791a",
            "111f315b79a5d3dda09e0e6a4964416658f42ec817c140a8b9b4a01bdfff0bcd",
            "9718887a1574d9b5c5a125e280140fb76142646173265e6d6122ad43843ef9f9",
        ),
    ),
    "sha256": (
        (
            "612b90b50e93916a25832a92b0d8719fa3dab589371d2569a3d93eb36e55d491",
            "19db018647ac325f80e3978b36f8b44a0528e24bee5a2f1b483ed8e265e9dacc",
            "36b7eae2e05aabbd5d00ce8b4c7450a0d4e7524b1d222a9a8bf28a297c4c0047",
        ),
        (
            "3d22dbfb3c3cfce7a529867d8ae68699a0cf7ee54bac3f35d718c6cd9cb444af",
            "1426881a765126bb61f984bb62618a7f3c1411d673ce595a9ff98ae2eb0b5633",
            "fe0ac1b559fea332e862b96703fdf6e009bc26f5fa099f32b21a876e22d63346",
        ),
    ),
}


def stored_hashes(hash_name: str, salt=None) -> tuple[str, ...]:
    events: list = []
    alloc = PageAllocator(8, PS)
    cache = RadixCache(alloc, hash_name=hash_name, event_sink=events.append)
    cache.insert(PROMPT, alloc.alloc(2), cache_salt=salt)
    (ev,) = events
    return (ev.parent_hash.hex(), *(h.hex() for h in ev.hashes))


@pytest.mark.parametrize("hash_name", list(HASH_FUNCTIONS))
def test_page_hashes_match_the_golden_values(hash_name: str) -> None:
    plain, salted = GOLDEN[hash_name]
    assert stored_hashes(hash_name) == plain
    assert stored_hashes(hash_name, "tenant") == salted


def test_page_hash_encoding_is_the_documented_bytes() -> None:
    """sha256 recomputed from the spec: domain || namespace, then parent || uint32-LE tokens."""
    ns = b"n" + struct.pack("<I", 0) + b"s" + struct.pack("<I", 6) + b"tenant"
    assert encode_namespace(None, "tenant") == ns
    seed = hashlib.sha256(b"dsakv.page-chain.v1" + ns).digest()
    h0 = hashlib.sha256(seed + struct.pack("<4I", 1, 2, 3, 4)).digest()
    h1 = hashlib.sha256(h0 + (5).to_bytes(4, "little") + b"".join(t.to_bytes(4, "little") for t in (6, 7, 8))).digest()
    assert (seed.hex(), h0.hex(), h1.hex()) == stored_hashes("sha256", "tenant")
    assert token_bytes([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"


def test_page_hashes_are_identical_across_processes_and_hash_seeds() -> None:
    code = "from tests.cache.test_events import stored_hashes; print(stored_hashes('xxh3_64', 'tenant'))"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outs = set()
    for seed in ("0", "1", "12345", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=root)
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
            ).stdout
        )
    assert outs == {str(GOLDEN["xxh3_64"][1]) + "\n"}


def test_salt_and_extra_key_change_every_hash_of_the_chain() -> None:
    plain = stored_hashes("xxh3_64")
    salted = stored_hashes("xxh3_64", "tenant")
    assert not set(plain) & set(salted)
    events: list = []
    alloc = PageAllocator(8, PS)
    cache = RadixCache(alloc, event_sink=events.append)
    cache.insert(PROMPT, alloc.alloc(2), extra_key="lora-1")
    assert not {h.hex() for h in events[0].hashes} & set(plain)


def test_events_track_the_cache_content_exactly() -> None:
    """A consumer that applies the events holds exactly the pages the tree holds."""
    events: list = []
    alloc = PageAllocator(16, PS)
    cache = RadixCache(alloc, event_sink=events.append)
    for toks in (list(range(1, 13)), list(range(1, 9)) + [40, 41, 42, 43], list(range(60, 69))):
        m = cache.match(toks)
        cache.lock(m.node)
        pages = m.pages + alloc.alloc(-(-len(toks) // PS) - len(m.pages))
        r = cache.insert(toks, pages)
        alloc.free(r.duplicate_pages + pages[len(toks) // PS :])
        cache.unlock(m.node)
    cache.evict(2 * PS)
    alloc.check_integrity()
    cache.check_integrity()
    assert alloc.num_free + cache.total_tokens // PS == alloc.num_pages  # no request holds a page
    live: dict[bytes, int] = {}
    for ev in events:
        if isinstance(ev, PagesStored):
            live.update(zip(ev.hashes, ev.pages))
        elif isinstance(ev, PagesRemoved):
            for h, p in zip(ev.hashes, ev.pages):
                assert live.pop(h) == p
    tree = {h: p for n in cache._iter_nodes() for h, p in zip(n.hashes, n.pages)}
    assert live == tree and len(tree) == cache.total_tokens // PS
    cache.reset()
    assert isinstance(events[-1], AllCleared)


def test_a_colliding_hash_never_causes_a_wrong_hit(monkeypatch) -> None:
    """The tree keys on token bytes; a hash that maps everything to one value changes no lookup."""
    monkeypatch.setitem(HASH_FUNCTIONS, "collide", lambda data: b"\x00" * 8)
    events: list = []
    alloc = PageAllocator(16, PS)
    cache = RadixCache(alloc, hash_name="collide", event_sink=events.append)
    a, b = list(range(1, 10)), list(range(100, 109))
    cache.insert(a, alloc.alloc(2))
    assert events[0].hashes == (b"\x00" * 8,) * 2
    assert cache.match(b).matched_tokens == 0
    assert cache.match(a).matched_tokens == 8
    assert cache.match(a, cache_salt="x").matched_tokens == 0
    pages_b = alloc.alloc(2)
    r = cache.insert(b, pages_b)
    assert r.cached_tokens == 0 and not r.duplicate_pages
    assert cache.match(b).pages == pages_b


def test_unknown_hash_name_lists_the_valid_ones() -> None:
    with pytest.raises(DsakvError, match="xxh3_64, blake2b, sha256"):
        RadixCache(PageAllocator(4, PS), hash_name="crc32")


# ----- what a consumer gets (issue 11, contract gap 6) ---------------------------------------------
def test_stored_events_carry_tokens_namespace_position_and_medium() -> None:
    """A consumer indexes pages from the event alone: tokens, page size, the run's place in its key, its
    namespace, the medium, and a parent hash that chains from the previous run's last page."""
    events: list = []
    alloc = PageAllocator(16, PS)
    cache = RadixCache(alloc, event_sink=events.append)
    cache.insert(PROMPT, alloc.alloc(2), extra_key="lora-1", cache_salt=b"s")
    longer = PROMPT + [9, 10, 11, 12, 13]
    pages = cache.match(longer, extra_key="lora-1", cache_salt=b"s").pages + alloc.alloc(1)
    cache.insert(longer, pages, extra_key="lora-1", cache_salt=b"s")
    first, second = events
    assert (first.first_page, first.token_ids, first.page_size) == (0, tuple(PROMPT), PS)
    assert (second.first_page, second.token_ids, second.pages) == (2, (9, 10, 11, 12), (pages[2],))
    assert second.parent_hash == first.hashes[-1]
    for ev in events:
        assert (ev.extra_key, ev.cache_salt, ev.medium) == ("lora-1", b"s", "GPU")
        assert len(ev.token_ids) == len(ev.pages) * ev.page_size == len(ev.hashes) * PS
        # the chain is recomputable from the event: parent, then each page's tokens (uint32 LE)
        h, chain = ev.parent_hash, []
        for i in range(len(ev.pages)):
            h = HASH_FUNCTIONS["xxh3_64"](h + token_bytes(list(ev.token_ids[i * PS : (i + 1) * PS])))
            chain.append(h)
        assert tuple(chain) == ev.hashes
    cache.evict(PS)
    removed = events[-1]
    assert isinstance(removed, PagesRemoved) and removed.medium == "GPU" and removed.hashes == second.hashes


def test_speculative_stored_events_carry_each_pages_own_tokens() -> None:
    events: list = []
    alloc = PageAllocator(8, PS)
    cache = RadixCache(alloc, speculative=True, event_sink=events.append)
    cache.insert(list(range(1, 11)), alloc.alloc(3))  # bigram pages (1..5), (5..9): two full pages
    (ev,) = events
    assert ev.token_ids == tuple(range(1, 9)) and len(ev.pages) == 2


def to_vllm(ev) -> tuple[str, dict]:
    """The mapping a vLLM-wire publisher applies (docs/prefix_cache.md): one event to one vLLM event."""
    if isinstance(ev, PagesStored):
        return "BlockStored", {
            "block_hashes": list(ev.hashes),
            "parent_block_hash": None if ev.first_page == 0 else ev.parent_hash,
            "token_ids": list(ev.token_ids),
            "block_size": ev.page_size,
            "lora_id": ev.extra_key if isinstance(ev.extra_key, int) else None,
            "medium": ev.medium,
            "lora_name": ev.extra_key if isinstance(ev.extra_key, str) else None,
            "extra_keys": [(ev.extra_key, ev.cache_salt)] * len(ev.hashes),
        }
    if isinstance(ev, PagesRemoved):
        return "BlockRemoved", {"block_hashes": list(ev.hashes), "medium": ev.medium}
    assert isinstance(ev, AllCleared)
    return "AllBlocksCleared", {}


def test_events_map_one_to_one_onto_vllm_kv_events() -> None:
    """Each event becomes exactly one vLLM event; a consumer following the vLLM events alone (parent None =
    a key's first block) rebuilds every cached page's token prefix."""
    events: list = []
    alloc = PageAllocator(16, PS)
    cache = RadixCache(alloc, event_sink=events.append)
    prompts = (list(range(1, 13)), list(range(1, 9)) + [40, 41, 42, 43], [7] * 9)
    for toks in prompts:
        m = cache.match(toks, extra_key=3)
        pages = m.pages + alloc.alloc(-(-len(toks) // PS) - len(m.pages))
        r = cache.insert(toks, pages, extra_key=3)
        alloc.free(r.duplicate_pages + pages[len(toks) // PS :])
    cache.evict(PS)
    cache.reset()
    mapped = [to_vllm(ev) for ev in events]
    assert [name for name, _ in mapped] == ["BlockStored"] * 3 + ["BlockRemoved", "AllBlocksCleared"]
    prefix: dict[bytes, tuple] = {}
    for _, f in mapped[:3]:
        assert f["lora_id"] == 3 and f["medium"] == "GPU" and len(f["token_ids"]) == len(f["block_hashes"]) * PS
        before = () if f["parent_block_hash"] is None else prefix[f["parent_block_hash"]]
        for i, h in enumerate(f["block_hashes"]):
            prefix[h] = before + tuple(f["token_ids"][: (i + 1) * PS])
    expected = {tuple(toks[: k * PS]) for toks in prompts for k in range(1, len(toks) // PS + 1)}
    assert set(prefix.values()) == expected and len(prefix) == len(expected)


# ----- a sink that raises (issue 11, defect 4) -----------------------------------------------------
class Boom(RuntimeError):
    pass


def raising_sink(kind: type) -> tuple[list, object]:
    """A sink that raises on the first event of ``kind`` (and records every event it is handed)."""
    seen: list = []

    def sink(ev) -> None:
        seen.append(ev)
        if isinstance(ev, kind) and sum(isinstance(e, kind) for e in seen) == 1:
            raise Boom(type(ev).__name__)

    return seen, sink


@pytest.mark.parametrize("op", ["insert", "evict", "reset"])
def test_a_sink_that_raises_never_corrupts_the_tree(op: str) -> None:
    """The sink runs after the operation is complete; its exception is recorded (``sink_failures``) and
    warned about, the operation's result stands, the tree passes its check and stays usable."""
    kind = {"insert": PagesStored, "evict": PagesRemoved, "reset": AllCleared}[op]
    seen, sink = raising_sink(kind)
    alloc = PageAllocator(16, PS)
    cache = RadixCache(alloc, event_sink=sink)
    with pytest.warns(RuntimeWarning, match="event_sink raised"):
        r = cache.insert(PROMPT, alloc.alloc(2)) if op == "insert" else None
        if op != "insert":
            cache.insert(PROMPT, alloc.alloc(2))
            out = cache.evict(PS) if op == "evict" else cache.reset()
    alloc.check_integrity()
    cache.check_integrity()
    (failure,) = cache.sink_failures
    assert failure.event is seen[-1] and isinstance(failure.error, Boom) and cache.sink_failure_count == 1
    if op == "insert":
        assert r.cached_tokens == 0 and cache.total_tokens == 8
        assert cache.evict(8).evicted_tokens == 8  # the new leaf is evictable: it reached the heap
    elif op == "evict":
        assert out.evicted_tokens == PS and cache.total_tokens == 4 and alloc.num_free == 15
    else:
        assert cache.total_tokens == 0 and alloc.num_free == 16
    # still usable: insert, match, evict, reset all work and the check keeps passing
    pages = alloc.alloc(3)
    cache.insert(list(range(100, 112)), pages)
    assert cache.match(list(range(100, 113))).pages == pages
    cache.check_integrity()
    cache.evict(10**6)
    cache.check_integrity()
    alloc.check_integrity()
