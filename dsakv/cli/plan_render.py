"""Rich tables for ``dsakv plan``. Exact bytes everywhere; a decimal (GB) or binary (MiB/GiB) figure
beside them carries its unit in the column header or the row label, never an unlabelled one."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from dsakv.planner.pd import PdPlan
from dsakv.planner.plan import Plan


def b(n: float | int) -> str:
    return f"{n:,}" if isinstance(n, int) else f"{n:,.2f}"


def gb(n: float | int) -> str:
    return f"{n / 1e9:,.2f}"


def pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _table(title: str, *columns: str, caption: str | None = None) -> Table:
    t = Table(title=title, caption=caption, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    return t


def cell_table(p: Plan) -> Table:
    s, lay, cell = p.spec, p.layout, p.cell
    t = _table(f"{s.name}: bytes per token and per page ({lay.kv_dtype}, page {lay.page_size})", "quantity", "value")
    t.add_row("attention layers (decoder + MTP)", f"{s.num_hidden_layers} + {lay.mtp_layers}")
    t.add_row("indexer layers (full + MTP) / shared", f"{lay.num_indexer_layers} / {s.num_shared_indexer_layers}")
    t.add_row("main KV row (B per token per layer)", b(lay.main_row_bytes))
    t.add_row("indexer K row (B per state per layer)", b(lay.indexer_row_bytes))
    t.add_row("index_kpool / DCP size", f"{lay.index_kpool} / {cell.dcp}")
    t.add_row("main KV (B per token)", b(cell.main_bytes_per_token))
    t.add_row("indexer K (B per token)", b(cell.indexer_bytes_per_token))
    t.add_row("cell = main + indexer (B per token)", b(cell.cell_bytes))
    t.add_row("tokens per page (per rank page)", b(cell.group_page_tokens))
    t.add_row("page: main + indexer (B)", f"{b(cell.main_page_bytes)} + {b(cell.indexer_page_bytes)}")
    t.add_row("page, both caches (B) [MiB]", f"{b(cell.page_bytes)} [{cell.page_bytes / 2**20:,.2f}]")
    return t


def memory_table(p: Plan) -> Table:
    st, pool, mem = p.setting, p.pool, p.pool.memory
    gpu = st.to_dict()["gpu"] or "custom"
    title = (
        f"memory per rank: {st.num_gpus} x {gpu}, TP {st.tensor_parallel}, DP-attention {st.dp_attention}, "
        f"DCP {st.dcp}, mem_fraction_static {st.mem_fraction_static}"
    )
    t = _table(title, "quantity", "bytes (B)", "GB")
    if mem is not None:
        t.add_row("GPU memory (driver-reported total)", b(mem.total_bytes), gb(mem.total_bytes))
        t.add_row("static part (total x mem_fraction_static)", b(mem.static_bytes), gb(mem.static_bytes))
        src = "computed from the config" if mem.weights_computed else "given"
        t.add_row(f"- weights per rank ({src})", b(mem.weights_bytes), gb(mem.weights_bytes))
        t.add_row("- activation reserve (assumption)", b(mem.activation_bytes), gb(mem.activation_bytes))
        t.add_row("- top-k index buffer", b(mem.topk_buffer_bytes), gb(mem.topk_buffer_bytes))
    t.add_row(f"= available for the pool ({p.pool_source})", b(pool.available_bytes), gb(pool.available_bytes))
    t.add_row("pool: whole pages x page bytes", b(pool.pool_bytes), gb(pool.pool_bytes))
    t.add_row("pool pages (whole pages - 1 scratch page)", b(pool.num_pages), "")
    t.add_row("pool tokens per rank", b(pool.pool_tokens), "")
    t.add_row(f"system tokens ({st.pools} independent pools)", b(p.system_tokens), "")
    return t  # a plan always has a pool page: planner.budget.require_pool refuses the settings that leave none


def context_table(p: Plan) -> Table:
    t = _table(
        "requests: bytes of each cache on one rank (whole pages reserved)",
        "context (tokens)",
        "main KV (B)",
        "indexer K (B)",
        "total (B)",
        "total (GB)",
        "pages",
        "indexer / main",
        "tail waste (B)",
        "fits",
        "concurrent",
    )
    for f in p.contexts:
        r = f.row
        t.add_row(
            b(r.tokens),
            b(r.main_bytes),
            b(r.indexer_bytes),
            b(r.total_bytes),
            gb(r.total_bytes),
            b(r.pages),
            f"{r.indexer_main_ratio * 100:.2f}%",
            b(r.tail_waste_bytes),
            "yes" if f.fits else "no",
            b(f.concurrent),
        )
    return t


def workspace_table(p: Plan) -> Table:
    w, lg = p.workspaces, p.workspaces.logits
    t = _table("workspaces and page tables (outside the pages)", "quantity", "bytes (B)", "MiB")
    mib = lambda n: f"{n / 2**20:,.2f}"  # noqa: E731
    t.add_row(
        f"top-k index buffer ({p.setting.max_batched_tokens:,} tokens x {p.spec.index_topk:,} x 4)",
        b(w.topk_buffer_bytes),
        mib(w.topk_buffer_bytes),
    )
    t.add_row(
        "indexer logits budget (min of 0.3 total, 0.2 outside static, 0.2 free)",
        b(w.logits_budget_bytes),
        mib(w.logits_budget_bytes),
    )
    t.add_row("one logits row at 1,048,576 columns (fp32)", b(w.logits_row_bytes_1m), mib(w.logits_row_bytes_1m))
    rows = f"{lg.rows:,} rows x {lg.cols:,} cols: " + (
        "below 8M elements, no check" if not lg.checked else f"{lg.chunk_rows:,} rows per chunk, {lg.chunks:,} chunks"
    )
    t.add_row(f"logits of a full batch ({rows})", b(lg.bytes), mib(lg.bytes))
    t.add_row("mean tail waste per request (half a page)", b(w.mean_tail_waste_bytes), mib(w.mean_tail_waste_bytes))
    t.add_row("slot table at 1,048,576 tokens (int32 per token)", b(w.slot_table_bytes_1m), mib(w.slot_table_bytes_1m))
    t.add_row(
        "block table at 1,048,576 tokens (int32 per page)", b(w.block_table_bytes_1m), mib(w.block_table_bytes_1m)
    )
    return t


def what_if_table(p: Plan) -> Table:
    t = _table(
        "what-if: capacity in the same memory (base cell / variant cell - 1)",
        "variant",
        "knob",
        "cell (B/token)",
        "change (B/token)",
        "capacity change",
        "pool tokens",
    )
    for r in p.what_if:
        tokens = "" if r.pool_tokens is None else b(r.pool_tokens)
        t.add_row(r.label, r.knob, b(r.cell_bytes), f"{r.delta_cell_bytes:+,}", pct(r.capacity_change), tokens)
    return t


def savings_table(p: Plan) -> Table:
    s = p.savings
    t = _table(
        f"prefix hit: {s.cached_tokens:,} of {s.total_tokens:,} tokens cached (whole pages)", "quantity", "value"
    )
    t.add_row("cached pages (both caches not written)", b(s.cached_pages))
    t.add_row("main KV not written (B)", b(s.main_bytes_saved))
    t.add_row("indexer K not written (B)", b(s.indexer_bytes_saved))
    t.add_row("indexer pairs saved: prefix-internal P(P+1)/2", b(s.pairs_saved))
    t.add_row("indexer pairs still paid: cross P x S", b(s.cross_pairs_paid))
    t.add_row("indexer pairs still paid: suffix-internal S(S+1)/2", b(s.suffix_pairs_paid))
    t.add_row("indexer FLOPs saved (all indexer layers)", b(s.flops_saved))
    t.add_row("indexer FLOPs still paid (all indexer layers)", b(s.flops_paid))
    return t


def explain_table(p: Plan) -> Table:
    e = p.explanation
    t = _table("explain-tokens: " + e.verdict, "candidate", "cell (B/token)", "pool tokens", "minus logged")
    for c in e.candidates:
        t.add_row(c.label + (" (exact)" if c.exact else ""), b(c.cell_bytes), b(c.pool_tokens), f"{c.diff_tokens:+,}")
    return t


def tiers_table(p: Plan) -> Table:
    t = p.tiers
    table = _table(
        f"Lower tiers (one entry = {b(t.entry_bytes)} B of both caches, {t.group_page_tokens} tokens)",
        "tier",
        "GB",
        "pages",
        "tokens",
        "as",
    )
    if t.host_bytes is not None:
        table.add_row(
            "host",
            gb(t.host_bytes),
            f"{t.host_pages:,}",
            f"{t.host_tokens:,}",
            f"one copy per attention group and node ({t.groups_per_node} per node)",
        )
        table.add_row(
            "host",
            gb(t.host_bytes),
            f"{t.host_pages_per_rank_pools:,}",
            f"{t.host_tokens_per_rank_pools:,}",
            f"a pool per rank ({t.gpus_per_node} copies per node)",
        )
    if t.store_bytes is not None:
        table.add_row("store", gb(t.store_bytes), f"{t.store_pages:,}", f"{t.store_tokens:,}", "one value per page")
    return table


def pd_table(pd: PdPlan) -> Table:
    links = list(pd.links)
    mtp = any(r.pd_bytes_mtp for r in pd.rows)
    t = _table(
        "PD hand-off per request (both caches) and seconds over one GPU's link; without index-K the decode side "
        "prefills the whole prompt again",
        "context (tokens)",
        "pages",
        "main KV (B)",
        "indexer K (B)",
        *(["of which MTP (B)"] if mtp else []),
        "total (B)",
        *(f"{k} (s)" for k in links),
        f"indexer alone, {links[0]} (s)",
    )
    for r in pd.rows:
        t.add_row(
            b(r.context),
            b(r.pages),
            b(r.pd_bytes_main),
            b(r.pd_bytes_indexer),
            *([b(r.pd_bytes_mtp)] if mtp else []),
            b(r.pd_bytes_total),
            *(f"{r.transfer_s[k]:.3f}" for k in links),
            f"{r.skip_indexer_saves_s[links[0]]:.4f}",
        )
    return t


def render(p: Plan, console: Console, caption: str, pd: PdPlan | None = None) -> None:
    console.print(cell_table(p))
    console.print(memory_table(p))
    console.print(context_table(p))
    console.print(workspace_table(p))
    console.print(what_if_table(p))
    if p.savings is not None:
        console.print(savings_table(p))
    if p.explanation is not None:
        console.print(explain_table(p))
    if p.tiers is not None:
        console.print(tiers_table(p))
    if pd is not None:
        console.print(pd_table(pd))
    console.print(caption)
