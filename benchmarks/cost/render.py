"""Renderer of the cost page's label-space table: ``benchmarks/cost/multiclass_cost.py``'s JSON."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from benchmarks.core.renderers import remake, stale


def render_multiclass_cost(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/cost/multiclass_cost.py``'s JSON: one row per label space and their ratio; the in-process interleaved
    engine timings in the last two columns."""
    from fedseg.bench.tables import caption

    data = outputs[0]
    costs, ratio, engine = data["costs"], data["ratio_c3_over_c2"], data.get("interleaved_engine") or {}
    lines = ["| label space | median round wall (s) | median site compute (s) | peak site memory (MB) | "
             "upload per site per round (MB) | mean test Dice | local epoch, in process (s) | test evaluation, in process (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, c in costs.items():
        e = engine.get(name) or {}
        lines.append(f"| {name} | {c['median_round_wall_s']:.2f} | {c['median_site_compute_s']:.2f} | "
                     f"{c['peak_site_memory_mb']:.0f} | {c['upload_mb_per_site_round']:.3f} | {c['mean_test_dice']:.3f} | "
                     + (f"{e['train']:.2f} | {e['evaluate']:.2f} |" if e else "- | - |"))
    r, er = ratio, engine.get("ratio") or {}
    lines.append(f"| ratio C=3 / C=2 | {r['median_round_wall_s']:.2f}x | {r['median_site_compute_s']:.2f}x | "
                 f"{r['peak_site_memory_mb']:.2f}x | {r['upload_mb_per_site_round']:.4f}x | | "
                 + (f"{er['train']:.2f}x | {er['evaluate']:.2f}x |" if er else "- | - |"))
    note = ("One FedAvg bench per label space (first round left out of the medians); mean test Dice = the mean over the "
            "foreground classes (C=3: rim, cup; C=2: disc), so the two are not comparable; in-process columns: median over "
            f"{engine.get('repeats', '?')} interleaved repeats on site {engine.get('site', '?')}, "
            f"{engine.get('threads', '?')} torch thread. {remake(table_id)}{stale(data)}")
    return [caption(data, table["title"], note), "", *lines]


def round_limit_rows(record: Mapping[str, Any]) -> List[str]:
    """``benchmarks/cost/round_limit.py``'s record as table rows (header included)."""
    lines = ["| method | tasks per round | round 0 (s) | median round (s) | slowest site's compute in the round (s) | limit (s) "
             "| round / limit | shared limit (s) | round / shared limit | round vs FedAvg |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, row in record["methods"].items():
        lim = row["limit"]
        shared = lim.get("shared_limit_s")
        compute = row.get("slowest_site_compute_s")
        compute_cell = "-" if compute is None else f"{compute:.2f}"
        shared_cells = ("- | -" if shared is None else f"{shared:.2f} | {row['ratio_to_shared_limit']:.2f}x")
        lines.append(
            f"| {label} | {row['tasks_per_round']:g} | {row['round0_s']:.1f} | {row['median_round_s']:.2f} | "
            f"{compute_cell} | {lim['limit_s']:.2f} | {row['ratio_to_limit']:.2f}x | {shared_cells} | "
            f"{row.get('round_ratio_to_fedavg', 1.0):.2f}x |")
    return lines


#: what a round-limit table's columns mean
ROUND_LIMIT_NOTE = (
    "Median round = over rounds 1.. of one `fedseg bench` run per method (NVFlare's simulator, one process per site); "
    "round 0 holds the sites' start-up (each site process imports torch and MONAI). Limit = the slowest site alone: its "
    "round's training steps in a plain PyTorch loop over the same batches already resident on the device, plus its "
    "validation forward pass. Shared limit = every site's plain loop at once, one process per site as the simulator "
    "runs them: the floor of a round whose sites share the machine.")


def render_round_limit(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/cost/round_limit.py``'s JSON: per method its round against the device's limit."""
    from fedseg.bench.tables import caption

    data = outputs[0]
    split = "; ".join(
        f"{label}: " + ", ".join(f"{task} {t['deliver']:.2f} / {t['site']:.2f} / {t['return']:.2f}"
                                 for task, t in row["task_breakdown"].items())
        for label, row in data["methods"].items())
    note = (f"`{data['command']}`, {len(data['sites'])} sites. {ROUND_LIMIT_NOTE} Each task's median deliver / site / "
            f"return (s): {split}. {remake(table_id)}{stale(data)}")
    return [caption(data, table["title"], note), "", *round_limit_rows(data)]
