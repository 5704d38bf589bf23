"""Real checkpoints through the paged engine: tiny GlmMoeDsa / DeepseekV32 models written by transformers'
``save_pretrained`` give, in the exact cache mode, greedy tokens identical to ``generate()`` -- while prefix
hits, chunked prefill, eviction and preemption happen during the paged run."""

from __future__ import annotations

import json

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
from dsakv.spec.model_spec import ModelSpec  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAGE = 16
NEW = 12
# GLM with shared layers (freq 2: F F S F) and a dense first layer; DeepSeek-V3.2: every layer full.
CASES = {
    "glm_moe_dsa": dict(index_topk_freq=2, first_k_dense_replace=1),
    "deepseek_v32": dict(first_k_dense_replace=2),
}


def exact_engine(folder, num_pages: int, **sched) -> Engine:
    cfg = EngineConfig(
        num_pages=num_pages, page_size=PAGE, kv_dtype="fp32", indexer_dtype="fp32",
        scheduler=SchedulerConfig(**sched),
    )  # fmt: skip
    return Engine(cfg, checkpoint=folder)


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory):
    model = hf_model(request.param, **CASES[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, model, folder


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    shared = torch.randint(0, 256, (160,), generator=g).tolist()  # a shared prefix: 10 pages
    tails = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (140, 75, 120)]
    return [shared + t for t in tails]


def test_greedy_tokens_equal_transformers_generate_through_the_paged_engine(checkpoint):
    _, model, folder = checkpoint
    ps = prompts()
    assert all(len(p) > model.config.index_topk for p in ps)  # sparsity matters
    expected = [hf_greedy(model, p, NEW) for p in ps]
    # 30 pages for three ~300-token requests: the later ones must evict the first one's cached tail.
    eng = exact_engine(folder, num_pages=30, chunk_tokens=64, max_batched_tokens=128)
    first = eng.generate(ps[:1], NEW)[0]
    rest = eng.generate(ps[1:], NEW)
    got = [first.output_tokens] + [r.output_tokens for r in rest]
    assert got == expected
    stats = [r.stats for r in rest]
    assert any(s.hit_tokens >= 160 for s in stats)  # the shared prefix came from the radix cache
    assert eng.radix.metrics.evicted_tokens > 0


@pytest.mark.parametrize("mode", ["recompute", "offload"])
def test_preemption_during_decode_keeps_tokens_exact(checkpoint, mode):
    _, model, folder = checkpoint
    ps = prompts()[:2]
    expected = [hf_greedy(model, p, NEW) for p in ps]
    # 19 + 15 prompt pages admitted optimistically into 35 pages: decode needs 36, so one is preempted.
    sched = dict(chunk_tokens=64, max_batched_tokens=128, new_token_ratio=0.0, preemption=mode)
    eng = exact_engine(folder, num_pages=35, **sched)
    res = eng.generate(ps, NEW)
    assert [r.output_tokens for r in res] == expected
    assert sum(r.stats.preemptions for r in res) > 0


def test_config_json_schedule_equals_the_reference(checkpoint):
    _, model, folder = checkpoint
    spec = ModelSpec.from_hf_config(folder / "config.json")
    want = getattr(model.config, "indexer_types", None) or ["full"] * model.config.num_hidden_layers
    assert list(spec.indexer_types) == list(want)


def test_sharded_checkpoint_loads_the_same_weights(checkpoint, tmp_path):
    _, model, folder = checkpoint
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    a, b = DsaModel.from_checkpoint(folder), DsaModel.from_checkpoint(tmp_path)
    assert torch.equal(a.embed, b.embed) and torch.equal(a.mla[-1].w_uv, b.mla[-1].w_uv)


def test_checkpoint_too_large_is_a_one_line_error_with_the_bytes(checkpoint):
    _, _, folder = checkpoint
    with pytest.raises(DsakvError) as err:
        DsaModel.from_checkpoint(folder, available_bytes=1000)
    msg = str(err.value)
    assert "bytes" in msg and "1,000" in msg and "\n" not in msg


def test_block_fp8_weights_are_dequantized_on_load(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    _, _, folder = checkpoint
    tensors = load_file(str(folder / "model.safetensors"))
    quantized, expected = {}, {}
    for name, t in tensors.items():
        if name.endswith("proj.weight") and t.dim() == 2:
            blocks = torch.nn.functional.pad(t, (0, -t.shape[1] % 128, 0, -t.shape[0] % 128))
            tiles = blocks.unflatten(0, (-1, 128)).unflatten(2, (-1, 128))  # [R, 128, C, 128]
            scale = tiles.abs().amax(dim=(1, 3)) / 448.0
            q = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn).flatten(2).flatten(0, 1)
            q = q[: t.shape[0], : t.shape[1]].contiguous()
            quantized[name], quantized[name + "_scale_inv"] = q, scale.contiguous()
            expected[name] = dequantize_block_fp8(q, scale)
        else:
            quantized[name] = t
    save_file(quantized, str(tmp_path / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = DsaModel.from_checkpoint(tmp_path)
    assert torch.equal(model.mla[0].o, expected["model.layers.0.self_attn.o_proj.weight"])
    err = (model.mla[0].o - tensors["model.layers.0.self_attn.o_proj.weight"]).abs().max()
    assert 0 < err < 0.1 * tensors["model.layers.0.self_attn.o_proj.weight"].abs().max()


def test_cli_generate_json_prints_the_reference_tokens(checkpoint, capsys):
    from dsakv.cli import main

    _, model, folder = checkpoint
    prompt = prompts()[0][:90]
    args = ["generate", "--checkpoint", str(folder), "--prompt-ids", ",".join(map(str, prompt))]
    assert main([*args, "--max-new-tokens", "6", "--exact", "--page-size", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == hf_greedy(model, prompt, 6)
    assert out["kv_dtype"] == "fp32" and out["hit_tokens"] == 0


def test_cli_demo_on_a_checkpoint_matches_its_reference(checkpoint, capsys):
    from dsakv.cli import main

    _, _, folder = checkpoint
    assert main(["demo", "--checkpoint", str(folder), "--exact", "--conversations", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs_match"] and out["hit_tokens"] > 0


def test_dcp_group_gives_transformers_greedy_tokens(checkpoint):
    # A DCP group (main KV of token t on rank t % dcp, indexer K on every rank, partial attentions merged by
    # their log-sum-exp): prefix hits, eviction and a preemption during the run leave the tokens exact.
    arch, model, folder = checkpoint
    dcp = {"glm_moe_dsa": 4, "deepseek_v32": 2}[arch]  # DCP 4 on GLM (shared layers), DCP 2 on DeepSeek
    ps = prompts()
    expected = [hf_greedy(model, p, NEW) for p in ps]
    cfg = EngineConfig(
        num_pages=30 * 16 // (PAGE * dcp), page_size=PAGE, dcp=dcp, kv_dtype="fp32", indexer_dtype="fp32",
        scheduler=SchedulerConfig(chunk_tokens=128, max_batched_tokens=256),
    )  # fmt: skip
    eng = Engine(cfg, checkpoint=folder)
    first = eng.generate(ps[:1], NEW)[0]
    original, preempted = eng.step, []

    def step():  # one preemption mid-run, of the newest running request
        finished = original()
        sched = eng.scheduler
        if not preempted and len(sched.running) > 1:
            preempted.append(sched.preempt(sched.running[-1].id))
        return finished

    eng.step = step
    rest = eng.generate(ps[1:], NEW)
    assert [first.output_tokens] + [r.output_tokens for r in rest] == expected
    assert any(r.stats.hit_tokens >= 128 for r in rest) and eng.radix.metrics.evicted_tokens > 0
    assert preempted and eng.scheduler.stats.preemptions > 0
    eng.check_integrity()
