"""Issue 11 on the engine layer: ``TwinPool`` and ``Engine`` entry points documented as raising ``DsakvError``
do so for wrong types and out-of-range values -- never a silent truncation (``store_main(0, [16.9], ...)``
used to write slot 16) -- and leave ``check_integrity()`` passing, the free-page count and every byte of the
pool unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.engine.engine import Engine, EngineConfig
from dsakv.engine.pool import TwinPool
from dsakv.errors import DsakvError
from dsakv.scheduler import SchedulerConfig
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BIG = 2**63
WRONG_IDS = {"float": 16.9, "integral float": 16.0, "bool": True, "None": None, "big": BIG, "str": "16"}


def per_value(label: str, call, values: dict) -> dict:
    """One case per wrong value: ``{f"{label} {name}": c -> call(c, value)}``."""

    def bind(value):
        return lambda c: call(c, value)

    return {f"{label} {name}": bind(value) for name, value in values.items()}


def rand(n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def pool_state() -> SimpleNamespace:
    layout = CacheLayout(ModelSpec.preset("tiny"))
    pool = TwinPool(layout, PageAllocator(4, layout.page_size, first_page=1), "slot")
    pages = pool.allocator.alloc(3)
    slots = torch.tensor([p * 64 + o for p in pages for o in (0, 1, 16, 17)])
    spec = layout.spec
    for layer in range(layout.num_attention_layers):
        pool.store_main(layer, slots, rand(len(slots), spec.kv_lora_rank, layer), rand(len(slots), 64, 9 + layer))
        if layout.layer_has_indexer(layer):
            pool.store_indexer(layer, slots, rand(len(slots), spec.index_head_dim, 5 + layer))
    return SimpleNamespace(pool=pool, pages=pages, host=pool.offload_pages(pages[:1]))


def pool_bytes(pool: TwinPool) -> list[torch.Tensor]:
    n = pool.layout.num_attention_layers
    return [pool.main_view(i).clone() for i in range(n)] + [pool.indexer_view(i).clone() for i in range(n)]


def latent(n: int = 1) -> torch.Tensor:
    return rand(n, 512)


def rope(n: int = 1) -> torch.Tensor:
    return rand(n, 64)


POOL_CALLS = {
    **per_value("store_main slot", lambda c, v: c.pool.store_main(0, [v], latent(), rope()), WRONG_IDS),
    **per_value("store_indexer slot", lambda c, v: c.pool.store_indexer(0, [v], rand(1, 128)), WRONG_IDS),
    **per_value("read_main slot", lambda c, v: c.pool.read_main(0, [c.pages[0] * 64, v]), WRONG_IDS),
    **per_value("read_indexer slot", lambda c, v: c.pool.read_indexer(0, [v]), WRONG_IDS),
    **per_value("move_slots src", lambda c, v: c.pool.move_slots([v], [c.pages[1] * 64]), WRONG_IDS),
    **per_value("move_slots dst", lambda c, v: c.pool.move_slots([c.pages[0] * 64], [v]), WRONG_IDS),
    **per_value("offload_pages", lambda c, v: c.pool.offload_pages([c.pages[0], v]), WRONG_IDS),
    **per_value("restore_pages", lambda c, v: c.pool.restore_pages(c.host, [v]), WRONG_IDS),
    **per_value("layer", lambda c, v: c.pool.store_main(v, [c.pages[0] * 64], latent(), rope()), WRONG_IDS),
    "slots None": lambda c: c.pool.store_main(0, None, latent(), rope()),
    "slots int": lambda c: c.pool.read_main(0, 64),
    "slots str": lambda c: c.pool.read_main(0, "64"),
    "slots nested": lambda c: c.pool.read_main(0, [[c.pages[0] * 64]]),
    "slots float array": lambda c: c.pool.read_main(0, np.array([64.5])),
    "slots uint64 past int64": lambda c: c.pool.read_main(0, np.array([BIG], dtype=np.uint64)),
    "slots object array": lambda c: c.pool.read_main(0, np.array([64, None])),
    "slots negative": lambda c: c.pool.read_main(0, [-1]),
    "restore host None": lambda c: c.pool.restore_pages(None, [c.pages[2]]),
    "restore pages None": lambda c: c.pool.restore_pages(c.host, None),
    "main_view bool": lambda c: c.pool.main_view(True),
    "indexer_view float": lambda c: c.pool.indexer_view(0.0),
    "page_is_writable float": lambda c: c.pool.page_is_writable(0.5),
    "page_is_writable None": lambda c: c.pool.page_is_writable(None),
}


@pytest.mark.parametrize("name", sorted(POOL_CALLS))
def test_pool_bad_ids_raise_and_change_nothing(name: str) -> None:
    c = pool_state()
    before, free = pool_bytes(c.pool), c.pool.allocator.num_free
    with pytest.raises(DsakvError):
        POOL_CALLS[name](c)
    assert all(torch.equal(a, b) for a, b in zip(before, pool_bytes(c.pool)))
    assert c.pool.allocator.num_free == free
    c.pool.check_integrity()


def test_a_float_slot_is_never_truncated() -> None:
    """Issue 11, defect 10: ``store_main(0, [16.9], ...)`` wrote slot 16; ``[True]`` wrote slot 1."""
    c = pool_state()
    slot = c.pages[0] * 64 + 40
    before = pool_bytes(c.pool)
    for bad in (slot + 0.9, float(slot), True):
        with pytest.raises(DsakvError, match=r"slots\[0\]"):
            c.pool.store_main(0, [bad], latent(), rope())
    assert all(torch.equal(a, b) for a, b in zip(before, pool_bytes(c.pool)))
    c.pool.store_main(0, [slot], latent(), rope())  # an int slot (or numpy int) still works
    c.pool.store_main(0, [np.int64(slot + 1)], latent(), rope())


def test_allocator_free_refuses_bools() -> None:
    """Issue 11, defect 10: ``allocator.free([True])`` freed page 1."""
    alloc = PageAllocator(4, 4)
    alloc.alloc(4)
    with pytest.raises(DsakvError, match="not an integer page id"):
        alloc.free([True])
    assert alloc.num_free == 0 and alloc.is_allocated(1)
    alloc.free([1])
    alloc.check_integrity()


# ----- Engine --------------------------------------------------------------------------------------
def engine_state() -> SimpleNamespace:
    cfg = EngineConfig(num_pages=16, page_size=16, scheduler=SchedulerConfig(max_batched_tokens=64, chunk_tokens=32))
    e = Engine(cfg)
    e.add_request(list(range(40)), 4, request_id="r")
    e.step()
    return SimpleNamespace(e=e)


ENGINE_CALLS = {
    "add_request prompt None": lambda c: c.e.add_request(None, 3),
    "add_request prompt float": lambda c: c.e.add_request([1, 2.5], 3),
    "add_request prompt bool": lambda c: c.e.add_request([5, True], 3),
    "add_request prompt past vocab": lambda c: c.e.add_request([1, 512], 3),
    "add_request prompt negative": lambda c: c.e.add_request([-1], 3),
    "add_request max_new_tokens float": lambda c: c.e.add_request([1, 2], 2.5),
    "add_request max_new_tokens bool": lambda c: c.e.add_request([1, 2], True),
    "add_request eos float": lambda c: c.e.add_request([1, 2], 3, eos_token_id=1.5),
    "add_request eos bool": lambda c: c.e.add_request([1, 2], 3, eos_token_id=True),
    "add_request eos str": lambda c: c.e.add_request([1, 2], 3, eos_token_id="x"),
    "add_request unhashable id": lambda c: c.e.add_request([1, 2], 3, request_id=[1]),
    "add_request live id": lambda c: c.e.add_request([1, 2], 3, request_id="r"),
    "generate prompts None": lambda c: c.e.generate(None, 3),
    "generate prompts int": lambda c: c.e.generate(5, 3),
    "generate a prompt None": lambda c: c.e.generate([[1, 2], None], 3),
    "generate max_new_tokens None": lambda c: c.e.generate([[1, 2]], None),
    "generate eos big": lambda c: c.e.generate([[1, 2]], 3, eos_token_id=BIG),
    "abort unknown": lambda c: c.e.abort("nope"),
    "abort unhashable": lambda c: c.e.abort(["r"]),
    "run_until_idle max_steps float": lambda c: c.e.run_until_idle(1.5),
    "run_until_idle max_steps zero": lambda c: c.e.run_until_idle(0),
}


@pytest.mark.parametrize("name", sorted(ENGINE_CALLS))
def test_engine_bad_input_raises_and_changes_nothing(name: str) -> None:
    c = engine_state()
    s = c.e.scheduler
    before = (c.e.allocator.num_free, [r.id for r in s.running], [r.id for r in s.waiting], s.stats.arrived)
    with pytest.raises(DsakvError):
        ENGINE_CALLS[name](c)
    assert (c.e.allocator.num_free, [r.id for r in s.running], [r.id for r in s.waiting], s.stats.arrived) == before
    c.e.check_integrity()
    c.e.run_until_idle()
    assert s.done["r"].value == "finished"
    c.e.check_integrity()


def test_engine_refuses_a_config_of_the_wrong_type() -> None:
    with pytest.raises(DsakvError, match="EngineConfig"):
        Engine({"num_pages": 4})


@pytest.mark.parametrize("value", [-1, 1.5, True, None, "8"])
@pytest.mark.parametrize("prompts", [[], [[1, 2, 3]]], ids=["no prompts", "one prompt"])
def test_generate_refuses_a_bad_max_new_tokens_even_with_no_prompt(prompts, value) -> None:
    """``max_new_tokens`` is checked once, up front: also when there is no prompt to queue, and nothing queues."""
    engine = Engine(EngineConfig(num_pages=8, page_size=16))
    free = engine.allocator.num_free
    with pytest.raises(DsakvError, match="max_new_tokens"):
        engine.generate(prompts, value)
    assert engine.scheduler.is_idle and engine.allocator.num_free == free
    engine.check_integrity()
