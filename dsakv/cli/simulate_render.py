"""Rich tables for ``dsakv simulate``: the run summary and the sweep comparison (docs/metrics.md)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from dsakv.cli.sweep_args import TABLE_COLUMNS, row_figures
from dsakv.sim.report import SimResult
from dsakv.sim.sweep import SweepRow


def _n(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.3f}" if abs(x) < 1000 else f"{x:,.0f}"
    return f"{x:,}"


def _gb(x) -> str:
    return f"{x / 1e9:,.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _table(title: str, *cols: str) -> Table:
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right", overflow="fold")
    return t


def render_summary(result: SimResult, setup, source, console: Console) -> None:
    s = result.summary
    st = setup.setting
    console.print(
        f"[bold]{setup.spec.name}[/] on {st.num_gpus} x {st.to_dict()['gpu'] or 'custom GPU'}, TP {st.tensor_parallel}, "
        f"DCP {setup.cell.dcp}"
        + (f", DP attention {s['dp_attention']}" if s["dp_attention"] > 1 else "")
        + (f"; {s['instances']} instances" if s.get("instances", 1) > 1 else "")
        + (f", router {s['router']}" if "per_instance" in s else "")
        + f"; {source.name}; pool {s['pool_tokens']:,} tokens ({setup.pool_source}); "
        f"policy {result.config['eviction_policy']}, insert at {result.config['insert_mode']}",
        highlight=False,
    )
    t = _table("workload and prefix cache", "figure", "value")
    t.add_row(
        "requests (admitted / finished / rejected / unfinished)",
        f"{s['requests']:,} ({s['admitted']:,} / {s['finished']:,} / {s['rejected']:,} / {s['unfinished']:,})",
    )
    for reason, n in s["rejected_reasons"].items():
        t.add_row(f"  rejected: {reason}", f"{n:,}")
    if s["skipped_lines"] or s["reordered_lines"]:
        t.add_row("trace lines skipped / out of order", f"{s['skipped_lines']:,} / {s['reordered_lines']:,}")
    t.add_row("input tokens / output tokens", f"{s['input_tokens']:,} / {s['output_tokens']:,}")
    t.add_row(
        "input tokens of admitted / rejected requests",
        f"{s['admitted_input_tokens']:,} / {s['rejected_input_tokens']:,}",
    )
    t.add_row(
        "hit tokens; hit rate by tokens / by requests (of admitted)",
        f"{s['hit_tokens']:,}; {_pct(s['hit_rate_tokens'])} / {_pct(s['hit_rate_requests'])}",
    )
    if s["tier_bytes"] is not None:
        t.add_row(
            "hit tokens on device / loaded from host / from store",
            f"{s['hit_tokens_device']:,} / {s['hit_tokens_host']:,} / {s['hit_tokens_store']:,}",
        )
    t.add_row("evicted tokens (steps that evicted)", f"{s['evicted_tokens']:,} ({s['evictions']:,})")
    t.add_row("preemptions (pages offloaded)", f"{s['preemptions']:,} ({s['offloaded_pages']:,})")
    t.add_row(
        "tokens computed (pages written / saved)",
        f"{s['computed_tokens']:,} ({s['pages_written']:,} / {s['pages_saved']:,})",
    )
    t.add_row(
        "mean tail-page waste (tokens / B)", f"{s['tail_waste_tokens_mean']:.1f} / {s['tail_waste_bytes_mean']:,.0f}"
    )
    console.print(t)
    t = _table("bytes per rank and indexer work", "figure", "main KV", "indexer K")
    t.add_row("written (GB)", _gb(s["main_bytes_written"]), _gb(s["indexer_bytes_written"]))
    t.add_row("saved by prefix hits (GB)", _gb(s["main_bytes_saved"]), _gb(s["indexer_bytes_saved"]))
    t.add_row("pool (GB)", _gb(s["pool_main_bytes"]), _gb(s["pool_indexer_bytes"]))
    t.add_row("peak use (GB)", _gb(s["peak_main_bytes"]), _gb(s["peak_indexer_bytes"]))
    t.add_row("mean use (GB)", _gb(s["mean_main_bytes"]), _gb(s["mean_indexer_bytes"]))
    if s["tier_bytes"] is not None:
        for tier in ("host", "store"):
            for way in ("read", "written"):
                moved = s["tier_bytes"][tier][way]
                t.add_row(f"{tier} {way} (GB)", _gb(moved["main"]), _gb(moved["indexer"]))
    console.print(t)
    t = _table("lightning indexer (all indexer layers)", "figure", "score pairs", "FLOPs")
    t.add_row("saved (prefix-internal)", _n(s["indexer_pairs_saved"]), f"{s['indexer_flops_saved']:.3e}")
    t.add_row("still paid (cross P x S + suffix)", _n(s["indexer_pairs_paid"]), f"{s['indexer_flops_paid']:.3e}")
    t.add_row("  of which cross term P x S", _n(s["indexer_cross_pairs_paid"]), "")
    console.print(t)
    t = _table(
        f"latency and throughput ({result.config['step_model']} step time)", "figure", "p50", "p90", "p99", "mean"
    )
    for key, label in (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "end-to-end (s)")):
        d = s[key]
        t.add_row(label, *(_n(d[k]) for k in ("p50", "p90", "p99", "mean")))
    console.print(t)
    if "per_instance" in s:
        _render_instances(s, console)
    console.print(
        f"pool use peak {_pct(s['peak_pool_use'])}, mean {_pct(s['mean_pool_use'])}; {s['steps']:,} steps over "
        f"{s['makespan_s']:,.1f} simulated s; {s['output_tokens_per_s']:,.0f} output tok/s, "
        f"{s['input_tokens_per_s']:,.0f} input tok/s",
        highlight=False,
    )


def _render_instances(s: dict, console: Console) -> None:
    """The cluster's rows: one per instance (all its DP groups), then the load imbalance."""
    t = _table(
        f"per instance (router {s['router']})",
        "instance",
        "requests",
        "hit rate",
        "waiting mean / peak",
        "pool use mean / peak",
        "mean use main / indexer (GB)",
        "TTFT p50 / p99 (s)",
        "TPOT p50 (s)",
    )
    for r in s["per_instance"]:
        t.add_row(
            str(r["instance"]),
            f"{r['requests']:,}",
            _pct(r["hit_rate_tokens"]),
            f"{r['mean_waiting']:.1f} / {r['peak_waiting']:,}",
            f"{_pct(r['mean_pool_use'])} / {_pct(r['peak_pool_use'])}",
            f"{_gb(r['mean_main_bytes'])} / {_gb(r['mean_indexer_bytes'])}",
            f"{_n(r['ttft_s']['p50'])} / {_n(r['ttft_s']['p99'])}",
            _n(r["tpot_s"]["p50"]),
        )
    console.print(t)
    console.print(f"load imbalance (max / mean routed tokens): {s['load_imbalance']:.3f}", highlight=False)


def _point(label: str) -> str:
    """One override per line, byte sizes in GB, so the point column stays narrow."""
    parts = []
    for part in label.split(", "):
        key, _, value = part.partition("=")
        if key == "gpu_memory_bytes" and value.isdigit():
            v = int(value)
            part = f"gpu_memory={v // 2**30} GiB" if v % 2**30 == 0 else f"gpu_memory={v / 1e9:g} GB"
        parts.append(part)
    return "\n".join(parts)


def render_sweep(rows: list[SweepRow], source, console: Console) -> None:
    t = _table(f"sweep over {source.name}", "point", *(label for _, label in TABLE_COLUMNS))
    impossible = []
    for row in rows:
        if row.error:
            impossible.append(row)
            t.add_row(_point(row.label), "[red]impossible[/]", *(["-"] * (len(TABLE_COLUMNS) - 1)))
            continue
        f = row_figures(row)
        cells = []
        for key, _ in TABLE_COLUMNS:
            v = f[key]
            cells.append(
                _pct(v)
                if key.startswith(("hit_rate", "peak_pool"))
                else f"{v:.3e}"
                if key == "indexer_flops_saved"
                else _n(v)
            )
        t.add_row(_point(row.label), *cells)
    t.columns[0].min_width = min(60, max((len(x) for r in rows for x in _point(r.label).split("\n")), default=5))
    console.print(t)
    for row in impossible:
        console.print(f"[red]impossible[/] {row.label}: {row.error}", highlight=False)
