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
