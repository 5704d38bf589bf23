"""``bench/gpu_check.py``: its byte comparison (torch reference vs Triton, both caches, every main-KV format the
kernels serve, slot and packed pools, index_kpool 1 and 4) and kernel checks pass on tiny shapes under the
Triton CPU interpreter, catch a corrupted byte, and the script exits 2 with one line when there is no CUDA."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

import importlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from dsakv.kernels import cache_ops_triton, indexer_triton, sparse_mla_triton  # noqa: E402
from dsakv.spec.model_spec import ModelSpec  # noqa: E402

for _mod, _fn in ((cache_ops_triton, "_store_main_kernel"), (indexer_triton, "indexer_logits_kernel"),
                  (sparse_mla_triton, "sparse_mla_decode_kernel")):  # fmt: skip
    if type(getattr(_mod, _fn)).__name__ != "InterpretedFunction":
        importlib.reload(_mod)  # imported earlier without the interpreter

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = ModelSpec.preset("tiny")


@pytest.fixture(scope="module")
def gpu_check(load_file_module, repo_dir):
    return load_file_module(repo_dir / "bench" / "gpu_check.py", "gpu_check")


def test_byte_and_kernel_checks_pass_on_the_cpu_interpreter(gpu_check):
    checks = gpu_check.byte_checks("cpu", TINY, tokens=10) + gpu_check.kernel_checks("cpu", TINY, cols=40)
    names = {c.name.split()[2] for c in checks if c.name.startswith("store")}
    assert names == {"fp8_ds_mla", "bf16", "fp8"}
    assert len(checks) == 3 * 2 * 2 * 2 + 2
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]


def test_a_wrong_byte_is_reported(gpu_check, monkeypatch):
    plain = cache_ops_triton.store_indexer_triton

    def corrupt(index, slots, key, page_size, kpool=1):
        plain(index, slots, key, page_size, kpool)
        index.view(-1)[int(slots[0]) % 7] ^= 1  # one flipped bit

    monkeypatch.setattr(cache_ops_triton, "store_indexer_triton", corrupt)
    monkeypatch.setattr(gpu_check, "TRITON_KV_DTYPES", ("fp8_ds_mla",))
    monkeypatch.setattr(gpu_check, "KINDS", ("slot",))
    monkeypatch.setattr(gpu_check, "KPOOLS", (1,))
    bad = [c for c in gpu_check.byte_checks("cpu", TINY, tokens=4) if not c.ok]
    assert bad and "indexer L0" in bad[0].detail and "1 bytes differ" in bad[0].detail


def test_without_cuda_one_line_and_exit_2(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA device" in out
