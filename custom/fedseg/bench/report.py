"""``results.json``, ``results.md`` and ``plots/`` of a ``fedseg bench`` run, from the stored runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fedseg.bench.runs import VAL_METRIC, record_task, task_metrics, with_structures
from fedseg.data.labels import split_metric_key
from fedseg.fl.report import CLASSIFICATION_NOTE, METRIC_HEADERS, METRIC_NOTE, STRUCTURE_NOTE, metric_header
from fedseg.markdown import markdown_table
from fedseg.bench.stats import compare, compare_correct, seed_differences, seed_spread, summarise_seeds
from fedseg.bench.ranking import rank, recommendation_lines

#: the approach every other is tested against, unless the bench names another (``--baseline``)
BASELINE = "fedavg"


def bench_task(records: Sequence[Dict[str, Any]]) -> str:
    """The task shared by all runs ("segmentation" when there are none).

    Raises:
        ValueError: runs of different tasks (e.g. a stale ``runs/`` folder of another federation).
    """
    tasks = {record_task(r) for r in records}
    if len(tasks) > 1:
        raise ValueError(f"the runs mix tasks {sorted(tasks)}; use one --out per federation")
    return tasks.pop() if tasks else "segmentation"


def resolve_baseline(labels: Sequence[str], baseline: Optional[str] = None) -> Optional[str]:
    """The label the paired tests and cost ratios compare against.

    ``baseline`` given: it must be one of ``labels``. Otherwise ``fedavg`` where present, else the only
    label starting with ``fedavg`` (e.g. ``fedavg_cfl=fedefm:overseas=false``), else None (no tests).

    Raises:
        ValueError: ``baseline`` is not a label of this bench.
    """
    labels = list(labels)
    if baseline is not None:
        if baseline not in labels:
            raise ValueError(f"baseline {baseline!r} is not one of the bench's labels {labels}")
        return baseline
    if BASELINE in labels:
        return BASELINE
    candidates = [l for l in labels if l.startswith(BASELINE)]
    return candidates[0] if len(candidates) == 1 else None


#: how each evaluated model of a run is named in the tables (``global``: the run's label alone)
MODEL_SUFFIXES = {"global": "", "personalized": " (personalised)", "global_best_val": " (best val round)",
                  "local": " (local models)"}


def _approach_name(record: Dict[str, Any], model: str) -> str:
    return record["label"] + MODEL_SUFFIXES[model]


def build_results(records: Sequence[Dict[str, Any]], sites: Sequence[str], header: Dict[str, Any],
                  baseline: Optional[str] = None) -> Dict[str, Any]:
    """Aggregate the stored runs into the ``results.json`` dict.

    Args:
        records: one dict per finished run (``fedseg.bench.runs.run_method`` / ``run_reference``).
        sites: site order.
        header: fields written first (command, budget, data, machine, ...).
        baseline: label to test against (:func:`resolve_baseline`; default FedAvg).

    Returns:
        ``header`` plus ``task``, ``baseline``, ``approaches`` (per site and mean: mean +- std over seeds
        of the task's metrics: Dice / HD95 / ASSD, or accuracy / balanced accuracy), ``comparisons``
        (paired tests of every approach against the baseline's global model, pooled over sites and seeds
        and per site: Wilcoxon and t-test per segmentation metric, McNemar's exact test on per-image
        correctness for classification; ``seed_differences``: the headline metric's per-seed difference of
        site means, :func:`fedseg.bench.stats.seed_differences`), ``timing`` (wall time per run, median round
        wall time and its ratio to the baseline's in this bench) and, for ``benchmarks/accuracy/ablation_table.py``,
        ``methods`` / ``references`` with seed-mean per-site metrics.
    """
    task = bench_task(records)
    # the task's metrics, each followed by its per-class / per-region keys where the runs report them
    metrics = with_structures(task_metrics(task), [k for r in records for finals in r["final"].values()
                                                   for m in finals.values() for k in (m or {})],
                              next((r.get("train_config") for r in records if r.get("train_config")), None))
    base_label = resolve_baseline(list(dict.fromkeys(r["label"] for r in records)), baseline)
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
        entry["summary"] = summarise_seeds(entry["final_by_seed"], sites, metrics=metrics)

    comparisons: Dict[str, Any] = {}
    head = task_metrics(task)[0]
    base = approaches.get(base_label) if base_label else None
    if base is not None:
        for name, entry in approaches.items():
            if name == base_label:
                continue
            if task == "classification":
                tests = compare_correct(entry["per_image_by_seed"], base["per_image_by_seed"], sites)
            else:
                tests = compare(entry["per_image_by_seed"], base["per_image_by_seed"], sites,
                                metrics=_present(entry["per_image_by_seed"], metrics))
            comparisons[name] = {"vs": base_label,
                                 "seeds": sorted(set(entry["per_image_by_seed"]) & set(base["per_image_by_seed"])),
                                 "metrics": tests,
                                 # the headline metric's per-seed difference of site means (the three-seed rule)
                                 "seed_differences": {head: seed_differences(entry["final_by_seed"],
                                                                             base["final_by_seed"], sites, head)}}

    timing = _timing(records, base_label)
    # the rule's paired test is on per-image scores (Wilcoxon): segmentation; classification has McNemar's only
    ranking = rank(approaches, timing, sites, head) if task == "segmentation" else None
    results = dict(header)
    results.update({
        "task": task,
        "metrics": list(metrics),
        "baseline": base_label,
        "sites": list(sites),
        "approaches": {k: {kk: vv for kk, vv in v.items() if kk not in ("per_image_by_seed",)} for k, v in approaches.items()},
        "comparisons": comparisons,
        "timing": timing,
        # the approach to use by the page's rule (fedseg.bench.ranking), None with fewer than two federated approaches
        "ranking": ranking,
    })
    results.update(_compat(records, approaches, timing, sites, metrics, VAL_METRIC[task]))
    return results


def _present(per_image_by_seed: Dict[int, Dict[str, List[Dict[str, Any]]]], metrics: Sequence[str]) -> List[str]:
    """The metrics of ``metrics`` that at least one per-image row carries."""
    keys = {k for per_site in per_image_by_seed.values() for rows in per_site.values() for row in rows for k in row}
    return [m for m in metrics if m in keys] or ["dice", "hd95", "assd"]


def _timing(records: Sequence[Dict[str, Any]], baseline: Optional[str] = BASELINE) -> Dict[str, Any]:
    by_label: Dict[str, List[Dict[str, Any]]] = {}
    for rec in records:
        by_label.setdefault(rec["label"], []).append(rec)
    out: Dict[str, Any] = {}
    for label, recs in by_label.items():
        walls = [w for r in recs for w in (r.get("round_walls") or [])[1:] or (r.get("round_walls") or [])]
        out[label] = {"kind": recs[0]["kind"], "runs": len(recs), "wall_s_per_run": seed_spread([r["wall_s"] for r in recs]),
                      "wall_s_total": sum(r["wall_s"] for r in recs),
                      "median_round_wall": statistics.median(walls) if walls else None,
                      "rounds_timed": len(walls),
                      "upload_mb_per_site_round": recs[0].get("upload_mb_per_site_round"),
                      "peak_site_memory_mb": max((r["peak_site_memory_mb"] for r in recs if r.get("peak_site_memory_mb")), default=None),
                      "download_mb_per_site_round": recs[0].get("download_mb_per_site_round")}
    ref = out.get(baseline) or {} if baseline else {}
    base = ref.get("median_round_wall")
    for entry in out.values():
        mine = entry["median_round_wall"]
        entry["round_wall_ratio_to_fedavg"] = mine / base if mine and base else None
        up, base_up = entry.get("upload_mb_per_site_round"), ref.get("upload_mb_per_site_round")
        entry["upload_ratio_to_fedavg"] = up / base_up if up and base_up else None
    return out


def _mean_over_seeds(final_by_seed: Dict[int, Dict[str, Dict[str, Optional[float]]]], sites,
                     metrics: Sequence[str]) -> Dict[str, Dict[str, Optional[float]]]:
    out = {}
    for site in sites:
        out[site] = {m: seed_spread([(final_by_seed[s].get(site) or {}).get(m) for s in final_by_seed])["mean"] for m in metrics}
    return out


def val_curve(record: Dict[str, Any]) -> List[Optional[float]]:
    """A run's mean validation metric over sites per round (Dice or accuracy, ``record["val_metric"]``)."""
    return record.get(f"{record.get('val_metric') or 'val_dice'}_per_round") or []


def _compat(records, approaches, timing, sites, metrics, val_key) -> Dict[str, Any]:
    """``methods`` / ``references`` in the layout ``benchmarks/accuracy/compare.py`` wrote (seed means)."""
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
        if label in approaches:  # FedBN / FedRep have no complete global model: personalised only
            entry["global"] = _mean_over_seeds(approaches[label]["final_by_seed"], sites, metrics)
        pers = approaches.get(f"{label} (personalised)")
        if pers:
            entry["personalized"] = _mean_over_seeds(pers["final_by_seed"], sites, metrics)
        entry["median_round_wall"] = timing[label]["median_round_wall"]
        entry["job_total_seconds"] = timing[label]["wall_s_per_run"]["mean"]
        tasks = sorted({t for r in recs for t in r.get("median_task_times", {})})
        entry["median_task_times"] = {t: statistics.median([r["median_task_times"][t] for r in recs if t in r["median_task_times"]])
                                      for t in tasks}
        entry[f"{val_key}_per_round"] = _mean_curve([val_curve(r) for r in recs])
    for label, entry in references.items():
        entry["final"] = _mean_over_seeds(approaches[label]["final_by_seed"], sites, metrics)
        entry["total_train_seconds"] = timing[label]["wall_s_per_run"]["mean"]
    return {"methods": methods, "references": references}


def _mean_curve(curves: Sequence[Sequence[Optional[float]]]) -> List[Optional[float]]:
    n = max((len(c) for c in curves), default=0)
    return [seed_spread([c[i] for c in curves if i < len(c)])["mean"] for i in range(n)]


# ------------------------------------------------------------------------------------------ markdown
def format_spread(spread: Dict[str, Any], digits: int) -> str:
    """``"0.835 ± 0.011"``: a :func:`fedseg.bench.stats.seed_spread` as mean ± sample std with ``digits``
    decimals; ``"-"`` where there is no value."""
    if spread.get("mean") is None:
        return "-"
    return f"{spread['mean']:.{digits}f} ± {spread['std']:.{digits}f}"


def format_seed_difference(diff: Optional[Dict[str, Any]]) -> str:
    """``"+0.019 ± 0.007 (3 of 3)"``: a :func:`fedseg.bench.stats.seed_differences` as signed mean ± sample std and
    the seeds ahead; ``"-"`` where there is none."""
    if not diff or not diff.get("n"):
        return "-"
    return f"{diff['mean']:+.3f} ± {diff['std']:.3f} ({diff['ahead']} of {diff['n']})"


def format_p(v: Optional[float]) -> str:
    """A p-value: ``"3.43e-04"`` below 0.001, else ``"0.072"``; ``"-"`` where the test could not run."""
    return "-" if v is None else (f"{v:.2e}" if v < 1e-3 else f"{v:.3f}")


_pm, _p = format_spread, format_p  # the short names the tables below use


def budget_text(budget: Dict[str, Any]) -> str:
    """``20 rounds x 1 local epoch, profile default`` (what a recommendation holds for)."""
    rounds = budget.get("rounds") or "the profile's rounds"
    epochs = budget.get("local_epochs")
    epochs_text = "each method's local epochs" if epochs is None else f"{epochs} local epoch{'s' if epochs != 1 else ''}"
    return f"{rounds} rounds x {epochs_text}, profile {budget.get('profile', 'default')}"


def site_statistics_lines(statistics: Optional[Dict[str, Any]]) -> List[str]:
    """``## How the sites differ``: the federated statistics' summary (``fedseg stats``), or nothing."""
    if not statistics:
        return []
    missing = statistics.get("missing_sites") or []
    return ["## How the sites differ", "",
            "From NVFlare's federated statistics of the sites' training images (aggregates only; "
            f"`{statistics['stats']}`):", "",
            *(f"- {sentence}" for sentence in statistics["summary"]),
            *([f"- The statistics lack {', '.join(missing)}."] if missing else []), ""]


def markdown(results: Dict[str, Any]) -> str:
    """The human-readable ``results.md``."""
    sites = results["sites"]
    budget = results.get("budget", {})
    seeds = results.get("seeds", [])
    task = results.get("task", "segmentation")
    metrics = results.get("metrics") or task_metrics(task)
    base = results.get("baseline", BASELINE) or BASELINE
    base_name = "FedAvg" if base == BASELINE else f"`{base}`"
    lines = [
        f"# fedseg bench — {', '.join(results['approaches'])}",
        "",
        f"Sites: {', '.join(sites)}. Seeds: {', '.join(map(str, seeds))}. Budget: profile `{budget.get('profile')}`, "
        f"rounds {budget.get('rounds') or 'profile default'}, local epochs {budget.get('local_epochs') or 'profile/method default'}"
        + (f", set {json.dumps(budget.get('sets'))}" if budget.get("sets") else "") + ". "
        "Final models (no checkpoint selection) on each site's test split; cells are mean ± std over seeds; "
        "mean = unweighted mean over sites per seed, then mean ± std over seeds ('-' where a site lacks the metric). "
        f"{CLASSIFICATION_NOTE if task == 'classification' else METRIC_NOTE}. Total wall time {results.get('wall_time_s', 0):.0f} s.",
        "",
    ]
    if results.get("ranking"):
        lines += ["## Which to use", ""] + [line + "  " for line in recommendation_lines(
            results["ranking"], "these sites", budget_text(budget))] + [""]
    lines += site_statistics_lines(results.get("site_statistics"))
    shown = [m for m in metrics if any(
        (entry["summary"].get(site) or {}).get(m, {}).get("mean") is not None
        for entry in results["approaches"].values() for site in sites)]
    # per-site tables: the headline metrics and the Dice of each class / region; other per-class / per-region
    # metrics get one compact table of their site means below
    compact = [m for m in shown if split_metric_key(m)[1] is not None and split_metric_key(m)[0] != "dice"]
    for metric in [m for m in shown if m not in compact]:
        digits = 3 if metric.startswith("dice") or "iou" in metric or "accuracy" in metric else 2
        rows = [[name] + [_pm(entry["summary"][site][metric], digits) for site in [*sites, "mean"]]
                for name, entry in results["approaches"].items()]
        lines += [f"## {metric_header(metric)}", "", *markdown_table(["approach", *sites, "mean"], rows), ""]
    if compact:
        rows = [[name] + [_pm(entry["summary"]["mean"][m], 2) for m in compact]
                for name, entry in results["approaches"].items()]
        lines += ["## Per class and region: distances (mean over sites)", "", STRUCTURE_NOTE + ".", "",
                  *markdown_table(["approach"] + [metric_header(m) for m in compact], rows), ""]
    if results.get("comparisons") and task == "classification":
        lines += _mcnemar_lines(results["comparisons"], sites, base_name)
    elif results.get("comparisons"):
        lines += [f"## Paired tests against {base_name} (per-image test Dice)", "",
                  f"Pairs: image i of site k of seed s vs the same image of {base_name}'s global model with seed s, pooled "
                  "over seeds (and over sites in the 'all sites' columns). Two-sided Wilcoxon signed-rank "
                  "(`scipy.stats.wilcoxon`) and paired t-test (`scipy.stats.ttest_rel`). Per seed: each seed's mean "
                  f"Dice over sites minus {base_name}'s of the same seed, mean ± std over seeds (seeds ahead).", ""]
        rows = []
        for name, comp in results["comparisons"].items():
            d = comp["metrics"]["dice"]
            a = d["all"]
            diff = "-" if a["mean_diff"] is None else f"{a['mean_diff']:+.3f}"
            per_seed = format_seed_difference((comp.get("seed_differences") or {}).get("dice"))
            rows.append([name, str(a["n"]), diff, _p(a["wilcoxon_p"]), _p(a["ttest_p"])]
                        + [_p(d["per_site"][s]["wilcoxon_p"]) for s in sites] + [per_seed])
        header = ["approach", "pairs", "mean Dice diff", "Wilcoxon p", "t-test p"] + [f"Wilcoxon p {s}" for s in sites]
        lines += markdown_table(header + ["Dice diff per seed"], rows) + [""]
        regions = [m for m in metrics if split_metric_key(m)[0] == "dice" and split_metric_key(m)[1] is not None]
        if regions:
            rows = []
            for name, comp in results["comparisons"].items():
                cells = [name]
                for m in regions:
                    a = (comp["metrics"].get(m) or {}).get("all") or {}
                    diff = "-" if a.get("mean_diff") is None else f"{a['mean_diff']:+.3f}"
                    cells.append(f"{diff} / {_p(a.get('wilcoxon_p'))}")
                rows.append(cells)
            header = ["approach"] + [f"{split_metric_key(m)[1]}: diff / Wilcoxon p" for m in regions]
            lines += ["Per class and region, per-image Dice (same pairs):", "", *markdown_table(header, rows), ""]
        fov = {name: comp["metrics"]["dice_fov"]["all"] for name, comp in results["comparisons"].items() if "dice_fov" in comp["metrics"]}
        if fov:
            rows = [[name, str(a["n"]), "-" if a["mean_diff"] is None else f"{a['mean_diff']:+.3f}", _p(a["wilcoxon_p"]),
                     _p(a["ttest_p"])] for name, a in fov.items()]
            lines += ["Inside the field of view (sites whose datalist has FOV masks), per-image `dice_fov`:", "",
                      *markdown_table(["approach", "pairs", "mean Dice FOV diff", "Wilcoxon p", "t-test p"], rows), ""]
    rows = []
    for label, t in results["timing"].items():
        kind = "simulator job" if t["kind"] == "method" else "in-process training"
        med = "-" if t["median_round_wall"] is None else f"{t['median_round_wall']:.2f}"
        ratio = "-" if t["round_wall_ratio_to_fedavg"] is None else f"{t['round_wall_ratio_to_fedavg']:.2f}x"
        up = "-" if t.get("upload_mb_per_site_round") is None else (
            f"{t['upload_mb_per_site_round']:.3f} / {t.get('download_mb_per_site_round') or 0:.3f}")
        up_ratio = "-" if t.get("upload_ratio_to_fedavg") is None else f"{t['upload_ratio_to_fedavg']:.3f}x"
        mem = "-" if t.get("peak_site_memory_mb") is None else f"{t['peak_site_memory_mb']:.0f}"
        rows.append([label, str(t["runs"]), f"{_pm(t['wall_s_per_run'], 1)} ({kind})", f"{t['wall_s_total']:.1f}", med, ratio,
                     up, up_ratio, mem])
    lines += ["## Cost", "", *markdown_table(
        ["approach", "runs", "wall time per run (s)", "total (s)", "median round wall (s)", f"vs {base_name}",
         "upload / download per site per round (MB)", f"upload vs {base_name}", "peak site memory (MB)"], rows)]
    if results.get("plots"):
        lines += ["", "Plots: " + ", ".join(f"`{Path(p).name}`" for p in results["plots"])]
    return "\n".join(lines) + "\n"


def _mcnemar_lines(comparisons: Dict[str, Any], sites: Sequence[str], base_name: str) -> List[str]:
    """The classification paired-test table: accuracy difference and McNemar's exact test."""
    lines = [f"## Paired tests against {base_name} (per-image test correctness)", "",
             f"Pairs: image i of site k of seed s (right or wrong) vs the same image of {base_name}'s global model "
             "with seed s, pooled over seeds (and over sites in the 'all sites' columns). b = images only this "
             f"approach gets right, c = images only {base_name} gets right; McNemar's exact test = two-sided "
             "`scipy.stats.binomtest(b, b + c, 0.5)`.", ""]
    rows = []
    for name, comp in comparisons.items():
        d = comp["metrics"]["correct"]
        a = d["all"]
        diff = "-" if a["mean_diff"] is None else f"{a['mean_diff']:+.3f}"
        rows.append([name, str(a["n"]), diff, f"{a['b']} / {a['c']}", _p(a["mcnemar_p"])]
                    + [_p(d["per_site"][s]["mcnemar_p"]) for s in sites])
    header = ["approach", "pairs", "mean accuracy diff", "b / c", "McNemar p"] + [f"McNemar p {s}" for s in sites]
    return lines + markdown_table(header, rows) + [""]


# --------------------------------------------------------------------------------------------- plots
def plot_results(results: Dict[str, Any], records: Sequence[Dict[str, Any]], out_dir: Path) -> List[Path]:
    """``<metric>_per_site.png`` (seed mean, std error bar, each seed a dot) and ``<val metric>_rounds.png``
    (mean validation metric over sites per round; line = seed mean, band = seed min..max). The metric is
    the task's first: Dice (``dice_per_site.png``, ``val_dice_rounds.png``) or accuracy
    (``accuracy_per_site.png``, ``val_accuracy_rounds.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    task = results.get("task", "segmentation")
    metric, val_key = task_metrics(task)[0], VAL_METRIC[task]
    title = METRIC_HEADERS[metric].split(" (")[0]
    sites = list(results["sites"]) + ["mean"]
    names = list(results["approaches"])
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(sites) * max(1, len(names)) * 0.5), 4))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        summary = results["approaches"][name]["summary"]
        xs = np.arange(len(sites)) + (j - (len(names) - 1) / 2) * width
        means = [summary[s][metric]["mean"] or 0.0 for s in sites]
        stds = [summary[s][metric]["std"] or 0.0 for s in sites]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=name, alpha=0.8)
        for x, s in zip(xs, sites):
            vals = summary[s][metric]["values"]
            ax.scatter([x] * len(vals), vals, color="k", s=8, zorder=3)
    ax.set_xticks(range(len(sites)), sites)
    ax.set_ylabel(f"test {title}")
    ax.set_ylim(0, 1)
    ax.set_title(f"final test {title} per site (bar: seed mean, error bar: std, dots: seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    p1 = out_dir / f"{metric}_per_site.png"
    fig.savefig(p1, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    by_label: Dict[str, List[List[Optional[float]]]] = {}
    for rec in records:
        by_label.setdefault(rec["label"], []).append(val_curve(rec))
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
    ax.set_ylabel(f"mean validation {title} over sites")
    ax.set_title(f"validation {title} over rounds (line: seed mean, band: seed range)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p2 = out_dir / f"{val_key}_rounds.png"
    fig.savefig(p2, dpi=100)
    plt.close(fig)
    return [p1, p2]
