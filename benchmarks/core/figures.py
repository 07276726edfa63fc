"""The results pages' figures, drawn from the committed run records by the same registry as their tables.

Three kinds (``FIGURES`` names each figure, its kind and the bench approaches it draws):

* ``forest``: per approach, its test Dice minus FedAvg's of the same bench — the mean over seeds of each seed's
  difference (mean over sites), a bar of ± one standard deviation over seeds — a filled marker where the paired
  per-image Wilcoxon test gives p < 0.05, an open one elsewhere; the paper's claimed gain as a cross beside it.
* ``cost-gain``: per approach, its median round wall over FedAvg's in the same bench (x) against its Dice gain (y).
* ``curve``: per approach, the mean validation Dice over sites at each round, mean over seeds (a band of ± one
  standard deviation).

Figures are SVG with text kept as text and no timestamp; each carries the SHA-256 of the numbers it plots in its
metadata, which :func:`benchmarks.core.page.check_page` compares with a fresh render's (the drawing itself may differ between matplotlib
versions; the data may not).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from benchmarks.core.outputs import load_output
from benchmarks.core.registry import MissingOutput, ReproduceError
from benchmarks.core.runs import load_runs

#: (run id, approach key in that bench's results, row label)
Row = Tuple[str, str, str]

#: figure id -> its kind, title and rows (``forest``, ``cost-gain``: ``rows``; ``curve``: ``runs`` and ``labels``) and,
#: for a forest, the papers' claimed gains over FedAvg (``paper``: method -> (Dice as a fraction, source)); the pages'
#: registries declare theirs and ``benchmarks/registry.py`` registers them (:func:`register_figures`)
FIGURES: Dict[str, Dict[str, Any]] = {}


def register_figures(figures: Mapping[str, Dict[str, Any]]) -> None:
    """Add a page's figures to :data:`FIGURES`.

    Raises:
        ValueError: an id that another figure has, or an unknown kind.
    """
    for figure_id, spec in figures.items():
        if spec.get("kind") not in KINDS:
            raise ValueError(f"figure {figure_id!r}: unknown kind {spec.get('kind')!r}; known: {', '.join(KINDS)}")
        if FIGURES.get(figure_id, spec) is not spec:
            raise ValueError(f"figure {figure_id!r} is registered twice")
        FIGURES[figure_id] = spec


def _load(run_id: str, root: Path, runs: Mapping[str, Any]) -> Dict[str, Any]:
    return load_output(run_id, root, runs)


def forest_points(rows: Sequence[Row], root: Path, runs: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Per row present in the records: its label, the per-seed difference to the bench's baseline (mean, std, seeds
    ahead), the paired per-image test (mean difference, Wilcoxon p) and the round wall ratio to FedAvg."""
    from fedseg.bench.stats import seed_differences

    points, cache = [], {}
    for run_id, name, label in rows:
        if run_id not in cache:
            try:
                cache[run_id] = _load(run_id, root, runs)
            except MissingOutput:
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
    from benchmarks.core.tables import approach_title

    spec_labels = spec_labels or {}
    curves = []
    for run_id in run_ids:
        try:
            results = _load(run_id, root, runs)
        except MissingOutput:
            continue
        for label, records in load_runs(Path(results["_output_dir"])).items():
            per_seed = [r.get("val_dice_per_round") or [] for r in records]
            length = min(len(c) for c in per_seed)
            rounds = [[c[i] for c in per_seed if c[i] is not None] for i in range(length)]
            title = approach_title(results["approaches"][label]) if label in results["approaches"] else label
            curves.append({"label": f"{title}, {spec_labels.get(run_id, run_id)}",
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


def write_figure(figure_id: str, out_dir: Path, root: Path, runs: Mapping[str, Any]) -> Path:
    """Draw figure ``figure_id`` from the records under ``root`` into ``out_dir/<figure_id>.svg``.

    Raises:
        ReproduceError: an unknown figure, or none of its runs has a record.
    """
    if figure_id not in FIGURES:
        raise ReproduceError(f"unknown figure {figure_id!r}; known: {', '.join(FIGURES)}")
    spec = FIGURES[figure_id]
    path = Path(out_dir) / f"{figure_id}.svg"
    if spec["kind"] == "curve":
        curves = curve_points(spec["runs"], root, runs, spec.get("labels"))
        if not curves:
            raise MissingOutput(f"figure {figure_id!r}: none of its runs has a record")
        return draw_curve(spec, curves, path, data_digest([spec, curves]))
    points = forest_points(spec["rows"], root, runs)
    if not points:
        raise MissingOutput(f"figure {figure_id!r}: none of its runs has a record")
    return (draw_forest if spec["kind"] == "forest" else draw_cost_gain)(spec, points, path, data_digest([spec, points]))


#: the kinds of figure :func:`write_figure` draws
KINDS = ("forest", "cost-gain", "curve")
