"""The results page's figures, drawn from the committed run records by the same registry as its tables.

Three kinds (``FIGURES`` names each figure, its kind and the bench approaches it draws):

* ``forest``: per approach, its test Dice minus FedAvg's of the same bench — the mean over seeds of each seed's
  difference (mean over sites), a bar of ± one standard deviation over seeds — a filled marker where the paired
  per-image Wilcoxon test gives p < 0.05, an open one elsewhere; the paper's claimed gain as a cross beside it.
* ``cost-gain``: per approach, its median round wall over FedAvg's in the same bench (x) against its Dice gain (y).
* ``curve``: per approach, the mean validation Dice over sites at each round, mean over seeds (a band of ± one
  standard deviation).

Figures are SVG with text kept as text and no timestamp; each carries the SHA-256 of the numbers it plots in its
metadata, which ``page.check_page`` compares with a fresh render's (the drawing itself may differ between matplotlib
versions; the data may not).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

#: (run id, approach key in that bench's results, row label)
Row = Tuple[str, str, str]

_POLYP = [("polyp", "graphfedseg", "GraphFedSeg"), ("polyp", "graphfedseg (personalised)", "GraphFedSeg (personalised)"),
          ("polyp", "fvac", "FVAC (5 local epochs)"), ("polyp", "fedavg_e5", "FedAvg, 5 local epochs"),
          ("polyp", "pathfl", "PathFL"), ("polyp", "fedevi", "FedEvi"),
          ("fedevi-protocol-architecture", "fedevi", "FedEvi, reference U-Net layout"),
          ("fedevi-protocol-network", "fedevi", "FedEvi, reference U-Net + Kaiming init"),
          ("fedevi-protocol-authors", "fedevi", "FedEvi, authors' protocol"),
          ("fedevi-protocol-authors-30", "fedevi", "FedEvi, authors' protocol, 30 rounds")]
_RETINA = [("fedevi-protocol-retina-base", "fedevi", "FedEvi, suite protocol"),
           ("fedevi-protocol-retina-architecture", "fedevi", "FedEvi, reference U-Net layout"),
           ("fedevi-protocol-retina-authors", "fedevi", "FedEvi, authors' protocol")]
_FUNDUS = [("fundus", "fedevi", "FedEvi"), ("fundus", "graphfedseg", "GraphFedSeg"),
           ("fundus", "graphfedseg (personalised)", "GraphFedSeg (personalised)"),
           ("fundus", "fvac", "FVAC (5 local epochs)"), ("fundus", "fedavg_e5", "FedAvg, 5 local epochs"),
           ("fundus", "pathfl", "PathFL"),
           ("fundus", "local", "local only"), ("fundus", "pooled", "pooled")]

#: figure id -> kind, title, rows (and the papers' claimed gains over FedAvg, Dice as a fraction, with their source)
FIGURES: Dict[str, Dict[str, Any]] = {
    "forest-polyp": {"kind": "forest", "rows": _POLYP, "title": "Built-in polyp, 3 sites: Dice − FedAvg's",
                     "paper": {"fedevi": (0.098, "FedEvi paper T1 (4 polyp sites, 200 rounds)"),
                               "graphfedseg": (0.041, "GraphFedSeg paper T2 (polyp)"),
                               "fvac": (0.009, "FVAC paper T1 (fundus vessels)"),
                               "pathfl": (0.017, "PathFL paper T2 (H&E)")}},
    "forest-retina": {"kind": "forest", "rows": _RETINA,
                      "title": "Real retina (DRIVE / STARE / CHASE_DB1), 20 rounds: Dice − FedAvg's",
                      "paper": {"fedevi": (0.098, "FedEvi paper T1 (polyp)")}},
    "forest-fundus": {"kind": "forest", "rows": _FUNDUS, "title": "Built-in fundus (rim, cup), 3 sites: Dice − FedAvg's",
                      "paper": {"fedevi": (0.028, "FedEvi paper T1 (fundus: 87.91 -> 90.69)"),
                                "graphfedseg": (0.041, "GraphFedSeg paper T2 (polyp)"),
                                "fvac": (0.009, "FVAC paper T1 (fundus vessels)"),
                                "pathfl": (0.017, "PathFL paper T2 (H&E)")}},
    "cost-gain": {"kind": "cost-gain",
                  "rows": [("polyp", "fedevi", "FedEvi, polyp"), ("polyp", "graphfedseg", "GraphFedSeg, polyp"),
                           ("polyp", "fvac", "FVAC, polyp"), ("polyp", "pathfl", "PathFL, polyp"),
                           ("fedevi-protocol-retina-base", "fedevi", "FedEvi, retina"),
                           ("fundus", "fedevi", "FedEvi, fundus"), ("fundus", "graphfedseg", "GraphFedSeg, fundus"),
                           ("fundus", "fvac", "FVAC, fundus"), ("fundus", "pathfl", "PathFL, fundus")],
                  "title": "Cost against gain: round wall over FedAvg's vs Dice − FedAvg's (same bench)"},
    "curve-retina": {"kind": "curve", "runs": ["fedevi-protocol-retina-base", "fedevi-protocol-retina-architecture"],
                     "labels": {"fedevi-protocol-retina-base": "suite U-Net",
                                "fedevi-protocol-retina-architecture": "reference U-Net layout"},
                     "title": "Real retina: validation Dice per round (mean over sites and seeds)"},
}


def _load(run_id: str, root: Path, runs: Mapping[str, Any]) -> Dict[str, Any]:
    import reproduce

    return reproduce.load_output(run_id, root, runs)


def forest_points(rows: Sequence[Row], root: Path, runs: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Per row present in the records: its label, the per-seed difference to the bench's baseline (mean, std, seeds
    ahead), the paired per-image test (mean difference, Wilcoxon p) and the round wall ratio to FedAvg."""
    import reproduce
    from fedseg.bench.stats import seed_differences

    points, cache = [], {}
    for run_id, name, label in rows:
        if run_id not in cache:
            try:
                cache[run_id] = _load(run_id, root, runs)
            except reproduce.MissingOutput:
                cache[run_id] = None
        results = cache[run_id]
        if results is None or name not in results.get("approaches", {}):
            continue
        entry, base = results["approaches"][name], results["approaches"][results["baseline"]]
        per_seed = seed_differences(entry["final_by_seed"], base["final_by_seed"], list(results["sites"]), "dice")
        test = ((results.get("comparisons") or {}).get(name) or {}).get("metrics", {}).get("dice", {}).get("all", {})
        timing = (results.get("timing") or {}).get(entry["label"]) or {}
        points.append({"label": label, "method": entry["label"], "mean": per_seed["mean"], "std": per_seed["std"] or 0.0,
                       "ahead": per_seed["ahead"], "n_seeds": len(per_seed["seeds"]), "mean_diff": test.get("mean_diff"),
                       "p": test.get("wilcoxon_p"), "round_ratio": timing.get("round_wall_ratio_to_fedavg")})
    return points


def _figure(height: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "fedseg", "font.size": 9})
    return plt, plt.subplots(figsize=(7.0, height))


def data_digest(data: Any) -> str:
    """The SHA-256 of the plotted numbers (JSON, sorted keys): written into the SVG, compared by the page check, so
    that a figure is checked against its records whatever matplotlib version drew it."""
    def rounded(v: Any) -> Any:  # to 6 significant digits: the last bits of a float may differ between libraries
        if isinstance(v, float):
            return float(f"{v:.6g}")
        if isinstance(v, (list, tuple)):
            return [rounded(x) for x in v]
        if isinstance(v, dict):
            return {k: rounded(x) for k, x in v.items()}
        return v

    return hashlib.sha256(json.dumps(rounded(data), sort_keys=True).encode()).hexdigest()


#: how the digest appears in the SVG's metadata
DIGEST_TEXT = "fedseg figure data sha256 "


def read_digest(path: Path) -> Optional[str]:
    """The data digest written into an SVG by :func:`write_figure`, or None."""
    match = re.search(re.escape(DIGEST_TEXT) + r"([0-9a-f]{64})", Path(path).read_text(errors="replace"))
    return match.group(1) if match else None


def _save(plt, fig, path: Path, digest: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None, "Description": DIGEST_TEXT + digest})
    plt.close(fig)
    return path


def _evidence(pt: Mapping[str, Any]) -> str:
    """``+0.024 ± 0.009, 3/3 seeds ahead, p 5e-05``: the per-seed difference and the paired test."""
    p = "-" if pt["p"] is None else (f"{pt['p']:.3f}" if pt["p"] >= 1e-3 else f"{pt['p']:.0e}")
    return f"{pt['mean']:+.3f} ± {pt['std']:.3f}, {pt['ahead']}/{pt['n_seeds']} seeds ahead, p {p}"


def draw_forest(spec: Mapping[str, Any], points: Sequence[Mapping[str, Any]], path: Path, digest: str = "") -> Path:
    plt, (fig, ax) = _figure(0.9 + 0.42 * len(points))
    paper = spec.get("paper") or {}
    ys = list(range(len(points)))[::-1]
    for y, pt in zip(ys, points):
        significant = pt["p"] is not None and pt["p"] < 0.05
        ax.errorbar(pt["mean"], y, xerr=pt["std"], fmt="o", color="tab:blue", capsize=3,
                    markerfacecolor="tab:blue" if significant else "white")
        if pt["method"] in paper:
            ax.plot(paper[pt["method"]][0], y, "x", color="tab:red", markersize=7)
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_yticks(ys, [f"{pt['label']}\n{_evidence(pt)}" for pt in points], fontsize=8)
    ax.set_ylim(-0.6, len(points) - 0.4)
    ax.set_xlabel("test Dice − FedAvg's (same bench; mean ± std over seeds)")
    sources = [f"x {m}: {v:+.3f}, {src}" for m, (v, src) in paper.items() if any(pt["method"] == m for pt in points)]
    ax.set_title("\n".join([spec["title"], *sources]), fontsize=8)
    return _save(plt, fig, path, digest)


def draw_cost_gain(spec: Mapping[str, Any], points: Sequence[Mapping[str, Any]], path: Path, digest: str = "") -> Path:
    plt, (fig, ax) = _figure(4.0)
    drawn = sorted((pt for pt in points if pt["round_ratio"] is not None), key=lambda pt: (pt["round_ratio"], pt["mean"]))
    for i, pt in enumerate(drawn):
        significant = pt["p"] is not None and pt["p"] < 0.05
        ax.errorbar(pt["round_ratio"], pt["mean"], yerr=pt["std"], fmt="o", capsize=3, color="tab:blue",
                    markerfacecolor="tab:blue" if significant else "white")
        # neighbours' labels alternate right / left and up / down, so that a cluster stays readable
        ax.annotate(pt["label"], (pt["round_ratio"], pt["mean"]), textcoords="offset points", fontsize=7,
                    xytext=((6, -12, 6, -12)[i % 4], (4, 4, -10, -10)[i % 4]), ha="left" if i % 2 == 0 else "right")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("median round wall / FedAvg's (same bench)")
    ax.set_ylabel("test Dice − FedAvg's")
    ax.set_title(spec["title"], fontsize=9)
    return _save(plt, fig, path, digest)


def curve_points(run_ids: Sequence[str], root: Path, runs: Mapping[str, Any],
                 spec_labels: Optional[Mapping[str, str]] = None) -> List[Dict[str, Any]]:
    """Per bench and approach: the validation Dice per round (mean over sites) averaged over seeds, and its std;
    ``spec_labels`` names each bench in the legend."""
    import reproduce  # puts benchmarks/ on the path: cost_table below
    from cost_table import load_runs
    from fedseg.bench.tables import approach_title

    spec_labels = spec_labels or {}
    curves = []
    for run_id in run_ids:
        try:
            results = _load(run_id, root, runs)
        except reproduce.MissingOutput:
            continue
        for label, records in load_runs(Path(results["_output_dir"])).items():
            per_seed = [r.get("val_dice_per_round") or [] for r in records]
            length = min(len(c) for c in per_seed)
            rounds = [[c[i] for c in per_seed if c[i] is not None] for i in range(length)]
            title = approach_title(results["approaches"][label]) if label in results["approaches"] else label
            curves.append({"label": f"{title}, {spec_labels.get(run_id, reproduce.bench_name(run_id))}",
                           "mean": [statistics.fmean(v) if v else None for v in rounds],
                           "std": [statistics.pstdev(v) if len(v) > 1 else 0.0 for v in rounds]})
    return curves


def draw_curve(spec: Mapping[str, Any], curves: Sequence[Mapping[str, Any]], path: Path, digest: str = "") -> Path:
    plt, (fig, ax) = _figure(3.8)
    for curve in curves:
        xs = [i + 1 for i, v in enumerate(curve["mean"]) if v is not None]
        mean = [v for v in curve["mean"] if v is not None]
        std = [s for v, s in zip(curve["mean"], curve["std"]) if v is not None]
        line, = ax.plot(xs, mean, label=curve["label"])
        ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                        color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("round")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("validation Dice (mean over sites)")
    ax.legend(fontsize=7)
    ax.set_title(spec["title"], fontsize=9)
    return _save(plt, fig, path, digest)


def write_figure(figure_id: str, out_dir: Path, root: Path, runs: Optional[Mapping[str, Any]] = None) -> Path:
    """Draw figure ``figure_id`` from the records under ``root`` into ``out_dir/<figure_id>.svg``.

    Raises:
        reproduce.ReproduceError: an unknown figure, or none of its runs has a record.
    """
    import reproduce

    runs = reproduce.RUNS if runs is None else runs
    if figure_id not in FIGURES:
        raise reproduce.ReproduceError(f"unknown figure {figure_id!r}; known: {', '.join(FIGURES)}")
    spec = FIGURES[figure_id]
    path = Path(out_dir) / f"{figure_id}.svg"
    if spec["kind"] == "curve":
        curves = curve_points(spec["runs"], root, runs, spec.get("labels"))
        if not curves:
            raise reproduce.MissingOutput(f"figure {figure_id!r}: none of its runs has a record")
        return draw_curve(spec, curves, path, data_digest([spec, curves]))
    points = forest_points(spec["rows"], root, runs)
    if not points:
        raise reproduce.MissingOutput(f"figure {figure_id!r}: none of its runs has a record")
    return (draw_forest if spec["kind"] == "forest" else draw_cost_gain)(spec, points, path, data_digest([spec, points]))
