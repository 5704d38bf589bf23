"""Synthetic SGLang log lines in the engine's format (dsakv/telemetry/log_lines.py) for the verdict tests."""

from __future__ import annotations

import pytest

STAMP = "[2026-01-01 00:00:00 TP0] "


class SglangLines:
    @staticmethod
    def pool(tokens: int, kv_gb: float, context: int = 1048576) -> list[str]:
        return [
            STAMP + f"KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: {tokens}, KV size: {kv_gb:.2f} GB",
            STAMP + f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=2048, "
            f"max_running_requests=256, context_len={context}, available_gpu_mem=10.00 GB",
        ]

    @staticmethod
    def prefill(new_seq: int, new: int, cached: int, usage: float = 0.1, queue: int = 0, tput: float = 9e3) -> str:
        return STAMP + (
            f"Prefill batch, #new-seq: {new_seq}, #new-token: {new}, #cached-token: {cached}, token usage: "
            f"{usage:.2f}, #running-req: 1, #queue-req: {queue}, #pending-token: 0, cuda graph: False, "
            f"input throughput (token/s): {tput:.2f}"
        )

    @staticmethod
    def decode(running: int, tokens: int, tput: float, usage: float = 0.1, queue: int = 0) -> str:
        return STAMP + (
            f"Decode batch, #running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, cuda graph: True, "
            f"gen throughput (token/s): {tput:.2f}, #queue-req: {queue}, "
        )

    @staticmethod
    def interval(k: int) -> str:
        return STAMP + f"server_args=ServerArgs(page_size=64, decode_log_interval={k})"


@pytest.fixture
def sglang() -> SglangLines:
    return SglangLines()


@pytest.fixture
def write_log(tmp_path):
    def write(lines: list[str], name: str = "server.log") -> str:
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    return write
