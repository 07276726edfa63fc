"""``results.json``, ``results.md`` and ``plots/`` of a ``fedseg bench`` run, from the stored runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fedseg.bench.runs import METRICS
from fedseg.fl.report import METRIC_HEADERS, METRIC_NOTE
from fedseg.bench.stats import compare, seed_spread, summarise_seeds

BASELINE = "fedavg"


def _approach_name(record: Dict[str, Any], model: str) -> str:
    return record["label"] if model == "global" else f"{record['label']} (personalised)"


def build_results(records: Sequence[Dict[str, Any]], sites: Sequence[str], header: Dict[str, Any]) -> Dict[str, Any]:
    """Aggregate the stored runs into the ``results.json`` dict.

    Args:
        records: one dict per finished run (``fedseg.bench.runs.run_method`` / ``run_reference``).
        sites: site order.
        header: fields written first (command, budget, data, machine, ...).

    Returns:
        ``header`` plus ``approaches`` (per site and mean: mean +- std over seeds of Dice / HD95 /
        ASSD), ``comparisons`` (paired tests of every approach against FedAvg's global model, per
        metric, pooled over sites and seeds and per site), ``timing`` (wall time per run, median
        round wall time and its ratio to FedAvg's in this bench) and, for ``benchmarks/ablation_table.py``,
        ``methods`` / ``references`` with seed-mean per-site metrics.
    """
    approaches: Dict[str, Dict[str, Any]] = {}
    for rec in records:
        for model, per_site in rec["final"].items():
            name = _approach_name(rec, model)
            entry = approaches.setdefault(name, {
                "kind": rec["kind"], "label": rec["label"], "method": rec["method"], "model": model,
                "variant_args": rec.get("variant_args", {}), "train_config": rec.get("train_config"),
                "num_rounds": rec.get("num_rounds"), "final_by_seed": {}, "per_image_by_seed": {}, "run_ids": [],
            })
            entry["final_by_seed"][rec["seed"]] = per_site
            entry["per_image_by_seed"][rec["seed"]] = rec["per_image"].get(model, {})
            entry["run_ids"].append(rec["id"])
    for entry in approaches.values():
        entry["seeds"] = sorted(entry["final_by_seed"])
        entry["summary"] = summarise_seeds(entry["final_by_seed"], sites, metrics=METRICS)

    comparisons: Dict[str, Any] = {}
    base = approaches.get(BASELINE)
    if base is not None:
        for name, entry in approaches.items():
            if name == BASELINE:
                continue
            comparisons[name] = {"vs": BASELINE,
                                 "seeds": sorted(set(entry["per_image_by_seed"]) & set(base["per_image_by_seed"])),
                                 "metrics": compare(entry["per_image_by_seed"], base["per_image_by_seed"], sites,
                                                    metrics=_present(entry["per_image_by_seed"]))}

    timing = _timing(records)
    results = dict(header)
    results.update({
        "sites": list(sites),
        "approaches": {k: {kk: vv for kk, vv in v.items() if kk not in ("per_image_by_seed",)} for k, v in approaches.items()},
        "comparisons": comparisons,
        "timing": timing,
    })
    results.update(_compat(records, approaches, timing, sites))
    return results


def _present(per_image_by_seed: Dict[int, Dict[str, List[Dict[str, Any]]]]) -> List[str]:
    """The metrics of :data:`METRICS` that at least one per-image row carries."""
    keys = {k for per_site in per_image_by_seed.values() for rows in per_site.values() for row in rows for k in row}
    return [m for m in METRICS if m in keys] or ["dice", "hd95", "assd"]


def _timing(records: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    by_label: Dict[str, List[Dict[str, Any]]] = {}
    for rec in records:
        by_label.setdefault(rec["label"], []).append(rec)
    out: Dict[str, Any] = {}
    for label, recs in by_label.items():
        walls = [w for r in recs for w in (r.get("round_walls") or [])[1:] or (r.get("round_walls") or [])]
        out[label] = {"kind": recs[0]["kind"], "runs": len(recs), "wall_s_per_run": seed_spread([r["wall_s"] for r in recs]),
                      "wall_s_total": sum(r["wall_s"] for r in recs),
                      "median_round_wall": statistics.median(walls) if walls else None,
                      "upload_mb_per_site_round": recs[0].get("upload_mb_per_site_round"),
                      "download_mb_per_site_round": recs[0].get("download_mb_per_site_round")}
    base = (out.get(BASELINE) or {}).get("median_round_wall")
    for entry in out.values():
        mine = entry["median_round_wall"]
        entry["round_wall_ratio_to_fedavg"] = mine / base if mine and base else None
        up, base_up = entry.get("upload_mb_per_site_round"), (out.get(BASELINE) or {}).get("upload_mb_per_site_round")
        entry["upload_ratio_to_fedavg"] = up / base_up if up and base_up else None
    return out


def _mean_over_seeds(final_by_seed: Dict[int, Dict[str, Dict[str, Optional[float]]]], sites) -> Dict[str, Dict[str, Optional[float]]]:
    out = {}
    for site in sites:
        out[site] = {m: seed_spread([(final_by_seed[s].get(site) or {}).get(m) for s in final_by_seed])["mean"] for m in METRICS}
    return out


def _compat(records, approaches, timing, sites) -> Dict[str, Any]:
    """``methods`` / ``references`` in the layout ``benchmarks/compare.py`` wrote (seed means)."""
    methods: Dict[str, Any] = {}
    references: Dict[str, Any] = {}
    for rec in sorted(records, key=lambda r: r["seed"]):
        if rec["kind"] == "method":
            entry = methods.setdefault(rec["label"], {"method": rec["method"], "variant_args": rec.get("variant_args", {}),
                                                      "report_path": rec["report_path"], "report_paths": [], "seeds": []})
            entry["report_paths"].append(rec["report_path"])
            entry["seeds"].append(rec["seed"])
        else:
            references.setdefault(rec["label"], {"seeds": []})["seeds"].append(rec["seed"])
    for label, entry in methods.items():
        recs = [r for r in records if r["kind"] == "method" and r["label"] == label]
        entry["global"] = _mean_over_seeds(approaches[label]["final_by_seed"], sites)
        pers = approaches.get(f"{label} (personalised)")
        if pers:
            entry["personalized"] = _mean_over_seeds(pers["final_by_seed"], sites)
        entry["median_round_wall"] = timing[label]["median_round_wall"]
        entry["job_total_seconds"] = timing[label]["wall_s_per_run"]["mean"]
        tasks = sorted({t for r in recs for t in r.get("median_task_times", {})})
        entry["median_task_times"] = {t: statistics.median([r["median_task_times"][t] for r in recs if t in r["median_task_times"]])
                                      for t in tasks}
        entry["val_dice_per_round"] = _mean_curve([r.get("val_dice_per_round") or [] for r in recs])
    for label, entry in references.items():
        entry["final"] = _mean_over_seeds(approaches[label]["final_by_seed"], sites)
        entry["total_train_seconds"] = timing[label]["wall_s_per_run"]["mean"]
    return {"methods": methods, "references": references}


def _mean_curve(curves: Sequence[Sequence[Optional[float]]]) -> List[Optional[float]]:
    n = max((len(c) for c in curves), default=0)
    return [seed_spread([c[i] for c in curves if i < len(c)])["mean"] for i in range(n)]


# ------------------------------------------------------------------------------------------ markdown
def _pm(spread: Dict[str, Any], digits: int) -> str:
    if spread.get("mean") is None:
        return "-"
    return f"{spread['mean']:.{digits}f} ± {spread['std']:.{digits}f}"


def _p(v: Optional[float]) -> str:
    return "-" if v is None else (f"{v:.2e}" if v < 1e-3 else f"{v:.3f}")


def markdown(results: Dict[str, Any]) -> str:
    """The human-readable ``results.md``."""
    sites = results["sites"]
    budget = results.get("budget", {})
    seeds = results.get("seeds", [])
    lines = [
        f"# fedseg bench — {', '.join(results['approaches'])}",
        "",
        f"Sites: {', '.join(sites)}. Seeds: {', '.join(map(str, seeds))}. Budget: profile `{budget.get('profile')}`, "
        f"rounds {budget.get('rounds') or 'profile default'}, local epochs {budget.get('local_epochs') or 'profile/method default'}"
        + (f", set {json.dumps(budget.get('sets'))}" if budget.get("sets") else "") + ". "
        "Final models (no checkpoint selection) on each site's test split; cells are mean ± std over seeds; "
        "mean = unweighted mean over sites per seed, then mean ± std over seeds ('-' where a site lacks the metric). "
        f"{METRIC_NOTE}. Total wall time {results.get('wall_time_s', 0):.0f} s.",
        "",
    ]
    shown = [m for m in METRICS if any(
        (entry["summary"].get(site) or {}).get(m, {}).get("mean") is not None
        for entry in results["approaches"].values() for site in sites)]
    for metric in shown:
        digits = 3 if metric.startswith("dice") else 2
        lines += [f"## {METRIC_HEADERS[metric]}", "",
                  "| approach | " + " | ".join(sites) + " | mean |", "|---" * (len(sites) + 2) + "|"]
        for name, entry in results["approaches"].items():
            s = entry["summary"]
            lines.append(f"| {name} | " + " | ".join(_pm(s[site][metric], digits) for site in sites)
                         + f" | {_pm(s['mean'][metric], digits)} |")
        lines.append("")
    if results.get("comparisons"):
        lines += ["## Paired tests against FedAvg (per-image test Dice)", "",
                  "Pairs: image i of site k of seed s vs the same image of FedAvg's global model with seed s, pooled "
                  "over seeds (and over sites in the 'all sites' columns). Two-sided Wilcoxon signed-rank "
                  "(`scipy.stats.wilcoxon`) and paired t-test (`scipy.stats.ttest_rel`).", "",
                  "| approach | pairs | mean Dice diff | Wilcoxon p | t-test p | " + " | ".join(f"Wilcoxon p {s}" for s in sites) + " |",
                  "|---" * (5 + len(sites)) + "|"]
        for name, comp in results["comparisons"].items():
            d = comp["metrics"]["dice"]
            a = d["all"]
            diff = "-" if a["mean_diff"] is None else f"{a['mean_diff']:+.3f}"
            lines.append(f"| {name} | {a['n']} | {diff} | {_p(a['wilcoxon_p'])} | {_p(a['ttest_p'])} | "
                         + " | ".join(_p(d["per_site"][s]["wilcoxon_p"]) for s in sites) + " |")
        lines.append("")
        fov = {name: comp["metrics"]["dice_fov"]["all"] for name, comp in results["comparisons"].items() if "dice_fov" in comp["metrics"]}
        if fov:
            lines += ["Inside the field of view (sites whose datalist has FOV masks), per-image `dice_fov`:", "",
                      "| approach | pairs | mean Dice FOV diff | Wilcoxon p | t-test p |", "|---|---|---|---|---|"]
            for name, a in fov.items():
                diff = "-" if a["mean_diff"] is None else f"{a['mean_diff']:+.3f}"
                lines.append(f"| {name} | {a['n']} | {diff} | {_p(a['wilcoxon_p'])} | {_p(a['ttest_p'])} |")
            lines.append("")
    lines += ["## Cost", "",
              "| approach | runs | wall time per run (s) | total (s) | median round wall (s) | vs FedAvg | upload / download per site per round (MB) | upload vs FedAvg |",
              "|---|---|---|---|---|---|---|---|"]
    for label, t in results["timing"].items():
        kind = "simulator job" if t["kind"] == "method" else "in-process training"
        med = "-" if t["median_round_wall"] is None else f"{t['median_round_wall']:.2f}"
        ratio = "-" if t["round_wall_ratio_to_fedavg"] is None else f"{t['round_wall_ratio_to_fedavg']:.2f}x"
        up = "-" if t.get("upload_mb_per_site_round") is None else (
            f"{t['upload_mb_per_site_round']:.3f} / {t.get('download_mb_per_site_round') or 0:.3f}")
        up_ratio = "-" if t.get("upload_ratio_to_fedavg") is None else f"{t['upload_ratio_to_fedavg']:.3f}x"
        lines.append(f"| {label} | {t['runs']} | {_pm(t['wall_s_per_run'], 1)} ({kind}) | {t['wall_s_total']:.1f} | {med} | {ratio} | {up} | {up_ratio} |")
    if results.get("plots"):
        lines += ["", "Plots: " + ", ".join(f"`{Path(p).name}`" for p in results["plots"])]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- plots
def plot_results(results: Dict[str, Any], records: Sequence[Dict[str, Any]], out_dir: Path) -> List[Path]:
    """``dice_per_site.png`` (seed mean, std error bar, each seed a dot) and ``val_dice_rounds.png``
    (mean validation Dice over sites per round; line = seed mean, band = seed min..max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sites = list(results["sites"]) + ["mean"]
    names = list(results["approaches"])
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(sites) * max(1, len(names)) * 0.5), 4))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        summary = results["approaches"][name]["summary"]
        xs = np.arange(len(sites)) + (j - (len(names) - 1) / 2) * width
        means = [summary[s]["dice"]["mean"] or 0.0 for s in sites]
        stds = [summary[s]["dice"]["std"] or 0.0 for s in sites]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=name, alpha=0.8)
        for x, s in zip(xs, sites):
            vals = summary[s]["dice"]["values"]
            ax.scatter([x] * len(vals), vals, color="k", s=8, zorder=3)
    ax.set_xticks(range(len(sites)), sites)
    ax.set_ylabel("test Dice")
    ax.set_ylim(0, 1)
    ax.set_title("final test Dice per site (bar: seed mean, error bar: std, dots: seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    p1 = out_dir / "dice_per_site.png"
    fig.savefig(p1, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    by_label: Dict[str, List[List[Optional[float]]]] = {}
    for rec in records:
        by_label.setdefault(rec["label"], []).append(rec.get("val_dice_per_round") or [])
    for label, curves in by_label.items():
        n = max((len(c) for c in curves), default=0)
        if not n:
            continue
        rounds = np.arange(1, n + 1)
        vals = [[c[i] for c in curves if i < len(c) and c[i] is not None] for i in range(n)]
        mean = [float(np.mean(v)) if v else np.nan for v in vals]
        lo = [float(np.min(v)) if v else np.nan for v in vals]
        hi = [float(np.max(v)) if v else np.nan for v in vals]
        line, = ax.plot(rounds, mean, marker=".", label=label)
        ax.fill_between(rounds, lo, hi, alpha=0.2, color=line.get_color())
    ax.set_xlabel("round")
    ax.set_ylabel("mean validation Dice over sites")
    ax.set_title("validation Dice over rounds (line: seed mean, band: seed range)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p2 = out_dir / "val_dice_rounds.png"
    fig.savefig(p2, dpi=100)
    plt.close(fig)
    return [p1, p2]
