"""MTP speculative decoding on real-architecture checkpoints: tiny GlmMoeDsa / DeepseekV32 models written by
transformers' ``save_pretrained``, with an MTP layer written beside them by ``safetensors`` in the published
tensor names (``model.layers.{num_hidden_layers}.enorm`` / ``hnorm`` / ``eh_proj`` / decoder layer /
``shared_head``; transformers has no MTP module, so it neither writes nor reads them).

In the exact cache mode the greedy tokens with MTP on equal transformers' ``generate()`` (lossless
verification), and every finished request's caches -- the MTP layer's included -- read back equal to a run
that runs the MTP layer without drafting: bit-identical up to the first MoE layer, and within fp32 rounding
after it (the fp32 checkpoint model is not bit-invariant to how rows are chunked -- the same holds between
two non-speculative runs whose prefix hits differ; the tiny fp64 model's tests prove bit-exactness). The MTP layer's random weights draft almost nothing
right, so an oracle draft choice (the reference's tokens, wrong at every third index) makes accepted
prefixes and rejects happen; one test keeps the greedy drafts.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_checkpoints import hf_greedy, hf_model  # noqa: E402

from dsakv.engine.engine import Engine, EngineConfig  # noqa: E402
from dsakv.errors import DsakvError  # noqa: E402
from dsakv.model.checkpoint import dequantize_block_fp8  # noqa: E402
from dsakv.model.dsa_model import DsaModel  # noqa: E402
from dsakv.scheduler.config import SchedulerConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAGE = 16
NEW = 10
CASES = {
    "glm_moe_dsa": dict(index_topk_freq=2, first_k_dense_replace=1),
    "deepseek_v32": dict(first_k_dense_replace=2),
}


def mtp_tensors(model, seed: int = 5) -> dict[str, torch.Tensor]:
    """An MTP layer in the published names: a full, sparse decoder layer of the model, perturbed (so it is
    its own), per-expert tensors as the public checkpoints store them, random norms and ``eh_proj``."""
    cfg, sd = model.config, model.state_dict()
    n, h = cfg.num_hidden_layers, cfg.hidden_size
    types = getattr(cfg, "indexer_types", None) or ["full"] * n
    src = next(i for i in range(n) if types[i] == "full" and cfg.mlp_layer_types[i] == "sparse")
    gen = torch.Generator().manual_seed(seed)
    src_prefix, p = f"model.layers.{src}.", f"model.layers.{n}."
    out = {}
    for name, t in sd.items():
        if not name.startswith(src_prefix):
            continue
        t = t.detach().float()
        t = t + 0.1 * t.std() * torch.randn(t.shape, generator=gen)
        rest = name[len(src_prefix) :]
        if rest == "mlp.experts.gate_up_proj":
            for e, both in enumerate(t.unbind(0)):
                gate, up = both.chunk(2, dim=0)
                out[f"{p}mlp.experts.{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{p}mlp.experts.{e}.up_proj.weight"] = up.contiguous()
        elif rest == "mlp.experts.down_proj":
            for e, down in enumerate(t.unbind(0)):
                out[f"{p}mlp.experts.{e}.down_proj.weight"] = down.contiguous()
        else:
            out[p + rest] = t.contiguous()
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        out[f"{p}{norm}.weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
    out[p + "eh_proj.weight"] = torch.randn(h, 2 * h, generator=gen) / math.sqrt(2 * h)
    out[p + "shared_head.head.weight"] = sd["lm_head.weight"].detach().clone()
    out[p + "embed_tokens.weight"] = sd["model.embed_tokens.weight"].detach().clone()
    return out


def write_mtp(folder, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(folder / "mtp.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory):
    model = hf_model(request.param, **CASES[request.param])
    folder = tmp_path_factory.mktemp(request.param + "_mtp")
    model.save_pretrained(folder)
    write_mtp(folder, mtp_tensors(model))
    ps = prompts()
    return request.param, model, folder, [hf_greedy(model, p, NEW) for p in ps]


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    shared = torch.randint(0, 256, (48,), generator=g).tolist()  # 3 pages shared
    return [shared + torch.randint(0, 256, (n,), generator=g).tolist() for n in (40, 21, 33)]


def engine(folder, num_pages: int = 40, steps: int | None = None, choice=None, **sched) -> Engine:
    spec = {} if steps is None else dict(speculative="mtp", num_speculative_tokens=steps)
    cfg = EngineConfig(
        num_pages=num_pages, page_size=PAGE, kv_dtype="fp32", indexer_dtype="fp32", capture_cache=True,
        scheduler=SchedulerConfig(chunk_tokens=32, max_batched_tokens=64, **sched), **spec,
    )  # fmt: skip
    return Engine(cfg, checkpoint=folder, draft_choice=choice)


def oracle(expected: list[list[int]], reject_every: int = 3):
    by_prompt = {tuple(p): p + e for p, e in zip(prompts(), expected)}

    def choose(req, index, logits):
        seq = by_prompt[tuple(req.prompt)]
        if index >= len(seq):
            return int(logits.argmax())
        return (seq[index] + 1) % 256 if index % reject_every == 0 else seq[index]

    return choose


def caches_close(a, b) -> bool:
    """Every layer's main rows and (fp32) indexer keys and scales within fp32 rounding."""
    if a.num_tokens != b.num_tokens or len(a.main) != len(b.main) or len(a.indexer_keys) != len(b.indexer_keys):
        return False
    pairs = [*zip(a.main, b.main), *zip(a.indexer_scales, b.indexer_scales)]
    pairs += [(x.view(torch.float32), y.view(torch.float32)) for x, y in zip(a.indexer_keys, b.indexer_keys)]
    return all(torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in pairs)


def run(eng: Engine) -> list:
    ps = prompts()
    out = eng.generate(ps[:1], NEW) + eng.generate(ps[1:], NEW)
    eng.check_integrity()
    return out


@pytest.fixture(scope="module")
def mtp_reference(checkpoint):
    _, _, folder, expected = checkpoint
    res = run(engine(folder, steps=0))
    assert [r.output_tokens for r in res] == expected
    return res


@pytest.mark.parametrize("k", [1, 3, 5])
def test_mtp_on_a_checkpoint_keeps_the_reference_tokens_and_every_cache(checkpoint, mtp_reference, k):
    _, _, folder, expected = checkpoint
    # 9 pages: the later requests evict the first one's cached tail; 32-token chunks
    eng = engine(folder, num_pages=9, steps=k, choice=oracle(expected))
    res = run(eng)
    assert [r.output_tokens for r in res] == expected
    assert all(caches_close(a.cache, b.cache) for a, b in zip(res, mtp_reference))
    assert torch.equal(res[0].cache.main[0], mtp_reference[0].cache.main[0])  # the first (dense) layer: exact
    assert sum(r.stats.accepted_draft_tokens for r in res) > 0
    assert any(r.stats.hit_tokens > 0 for r in res)
    assert eng.radix.metrics.evicted_tokens > 0


@pytest.mark.parametrize("mode", ["recompute", "offload"])
def test_mtp_on_a_checkpoint_survives_preemption(checkpoint, mode):
    _, _, folder, expected = checkpoint
    # prompts of 6 + 5 + 6 pages admitted optimistically into 17; decoding needs 18
    eng = engine(folder, num_pages=17, steps=3, new_token_ratio=0.0, preemption=mode)
    res = eng.generate(prompts(), NEW)
    eng.check_integrity()
    assert [r.output_tokens for r in res] == expected
    assert sum(r.stats.preemptions for r in res) > 0


def test_block_fp8_mtp_weights_are_dequantized_on_load(checkpoint, tmp_path):
    from safetensors.torch import load_file

    _, model, folder, _ = checkpoint
    model.save_pretrained(tmp_path)
    tensors = load_file(str(folder / "mtp.safetensors"))
    n = model.config.num_hidden_layers
    name = f"model.layers.{n}.eh_proj.weight"
    t = tensors[name]
    tiles = torch.nn.functional.pad(t, (0, -t.shape[1] % 128, 0, -t.shape[0] % 128))
    tiles = tiles.unflatten(0, (-1, 128)).unflatten(2, (-1, 128))
    scale = tiles.abs().amax(dim=(1, 3)) / 448.0
    q = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn).flatten(2).flatten(0, 1)
    tensors[name] = q[: t.shape[0], : t.shape[1]].contiguous()
    tensors[name + "_scale_inv"] = scale.contiguous()
    write_mtp(tmp_path, tensors)
    loaded = DsaModel.from_checkpoint(tmp_path, mtp=True)
    assert torch.equal(loaded.mtp.eh_proj, dequantize_block_fp8(tensors[name], scale))
    assert 0 < (loaded.mtp.eh_proj - t).abs().max() < 0.1 * t.abs().max()


def test_plain_loading_skips_the_mtp_layer_and_a_missing_tensor_is_named(checkpoint, tmp_path):
    from safetensors.torch import load_file

    _, model, folder, _ = checkpoint
    assert DsaModel.from_checkpoint(folder).mtp is None
    model.save_pretrained(tmp_path)
    tensors = load_file(str(folder / "mtp.safetensors"))
    name = f"model.layers.{model.config.num_hidden_layers}.enorm.weight"
    del tensors[name]
    write_mtp(tmp_path, tensors)
    with pytest.raises(DsakvError) as err:
        DsaModel.from_checkpoint(tmp_path, mtp=True)
    assert name in str(err.value) and "\n" not in str(err.value)


def test_speculative_mtp_needs_num_nextn_predict_layers(checkpoint, tmp_path):
    _, model, _, _ = checkpoint
    model.save_pretrained(tmp_path)  # no MTP layer in the config
    with pytest.raises(DsakvError) as err:
        Engine(EngineConfig(speculative="mtp", num_speculative_tokens=1), checkpoint=tmp_path)
    assert "num_nextn_predict_layers" in str(err.value)


def test_cli_generate_mtp_json_reports_acceptance_and_the_same_tokens(checkpoint, capsys):
    from dsakv.cli import main

    _, model, folder, _ = checkpoint
    prompt = prompts()[0]
    args = ["generate", "--checkpoint", str(folder), "--prompt-ids", ",".join(map(str, prompt))]
    assert (
        main(
            [*args, "--max-new-tokens", "6", "--exact", "--page-size", "16", "--num-speculative-tokens", "3", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == hf_greedy(model, prompt, 6)
    assert out["draft_tokens"] > 0 and 0 <= out["accepted_tokens"] <= out["draft_tokens"]
    assert out["acceptance_rate"] == out["accepted_tokens"] / out["draft_tokens"]


def test_cli_demo_mtp_on_a_checkpoint_matches_its_reference(checkpoint, capsys):
    from dsakv.cli import main

    _, _, folder, _ = checkpoint
    args = [
        "demo",
        "--checkpoint",
        str(folder),
        "--exact",
        "--conversations",
        "2",
        "--num-speculative-tokens",
        "2",
        "--json",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs_match"] and out["mtp_steps"] == 2 and out["draft_tokens"] > 0


@pytest.mark.parametrize("context", [30, 100])
def test_draft_pass_flops_are_the_mtp_layers_counted_flops(checkpoint, context):
    """``planner.draft.draft_row_flops`` (derived from the spec) equals what torch counts in one MTP row."""
    from torch.utils.flop_counter import FlopCounterMode

    from dsakv.engine.pool import TwinPool
    from dsakv.model.inputs import SeqInput, request_slots
    from dsakv.planner.draft import draft_row_flops
    from dsakv.spec.layout import CacheLayout

    _, _, folder, _ = checkpoint
    model = DsaModel.from_checkpoint(folder, mtp=True)
    lay = CacheLayout(
        model.spec, kv_dtype="fp32", indexer_dtype="fp32", page_size=PAGE, allow_any_page_size=True, mtp_layers=1
    )
    pool = TwinPool.for_pages(lay, 8, padding_slots=PAGE)
    slots = request_slots(pool.allocator.alloc(7), context, PAGE)
    seq = SeqInput(token_ids=[5], positions=[context - 1], slots=slots[-1:], context_slots=slots)
    with FlopCounterMode(display=False) as counter:
        model.mtp.forward_paged(pool, [seq], torch.randn(1, model.cfg.hidden_size))
    assert counter.get_total_flops() == draft_row_flops(lay, context)
