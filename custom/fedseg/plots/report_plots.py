"""Plots drawn from a report dict: which figures appear depends on which fields the method recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_report(data: Dict[str, Any], out_dir: Path, val_metric: str) -> List[Path]:
    """Write every figure the report supports into ``out_dir``; return their paths.

    ``val_metric`` is the per-round validation metric the sites sent (``fedseg.fl.report.validation_metric``:
    ``val_dice``, or ``val_accuracy`` for a classification run)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = [plot_metric_over_rounds(data, val_metric, out_dir / f"{val_metric}.png")]
    rounds = data.get("rounds") or []
    if rounds and "graph" in rounds[-1]:
        figures.append(plot_graph_heatmaps(data, out_dir / "graph_heatmaps.png"))
    if rounds and isinstance(rounds[-1].get("ssa_similarity"), dict):
        figures.append(plot_stratum_heatmaps(data, out_dir / "ssa_similarity.png"))
    if isinstance((data.get("final") or {}).get("cross_site"), dict):
        figures.append(plot_cross_site(data, out_dir / "cross_site_dice.png"))
    for field in ("effective_weight", "beta", "aggregation_weight"):
        if rounds and isinstance(rounds[-1].get(field), dict):
            figures.append(plot_site_field(data, field, out_dir / f"{field}.png"))
    return [f for f in figures if f is not None]


def plot_metric_over_rounds(data: Dict[str, Any], metric: str, path: Path):
    rounds = data.get("rounds") or []
    if not rounds:
        return None
    curves = {}
    for site in data["clients"]:
        points = [(r["round"] + 1, (r["metrics"].get(site) or {}).get(metric)) for r in rounds]
        curves[site] = [(x, y) for x, y in points if y is not None]
    return _save_curves(curves, metric, f"{data['method']}: {metric} per site", path)


def plot_site_field(data: Dict[str, Any], field: str, path: Path):
    """A per-round {site: value} field (aggregation weights, FedEvi's beta, ...) as curves."""
    rounds = [r for r in data.get("rounds") or [] if isinstance(r.get(field), dict)]
    curves = {site: [(r["round"] + 1, r[field][site]) for r in rounds if site in r[field]] for site in data["clients"]}
    return _save_curves(curves, field, f"{data['method']}: {field}", path)


def _save_curves(curves: Dict[str, List], ylabel: str, title: str, path: Path) -> Path:
    """One line per site from ``{site: [(round, value), ...]}``."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for site, points in curves.items():
        ax.plot([x for x, _ in points], [y for _, y in points], marker=".", label=site)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_graph_heatmaps(data: Dict[str, Any], path: Path, max_panels: int = 4):
    """Collaboration graph W (row i = site i) at evenly spaced rounds."""
    rounds = [r for r in data["rounds"] if r.get("graph") is not None]
    picks = sorted({rounds[int(i)]["round"] for i in np.linspace(0, len(rounds) - 1, min(max_panels, len(rounds)))})
    chosen = [r for r in rounds if r["round"] in picks]
    fig, axes = plt.subplots(1, len(chosen), figsize=(3.2 * len(chosen), 3.2), squeeze=False)
    names = data["clients"]
    for ax, r in zip(axes[0], chosen):
        w = np.asarray(r["graph"], dtype=float)
        im = ax.imshow(w, vmin=0, vmax=max(1e-9, w.max()), cmap="viridis")
        ax.set_title(f"round {r['round'] + 1}")
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_yticks(range(len(names)), names, fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_stratum_heatmaps(data: Dict[str, Any], path: Path, field: str = "ssa_similarity"):
    """PathFL's per-stratum site similarity (row i = site i of ``ssa_sites``) in the last round that has it."""
    rounds = [r for r in data.get("rounds") or [] if isinstance(r.get(field), dict)]
    if not rounds:
        return None
    last = rounds[-1]
    names = last.get("ssa_sites") or data["clients"]
    strata = list(last[field])
    cols = min(5, len(strata))
    rows = (len(strata) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat[len(strata):]:
        ax.set_axis_off()
    for ax, stratum in zip(axes.flat, strata):
        im = ax.imshow(np.asarray(last[field][stratum], dtype=float), vmin=0, vmax=1, cmap="viridis")
        ax.set_title(stratum, fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_yticks(range(len(names)), names, fontsize=6)
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.02)
    fig.suptitle(f"{data['method']}: {field}, round {last['round'] + 1}", fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_cross_site(data: Dict[str, Any], path: Path):
    """``final.cross_site`` as a heat map: row = whose model (the global model's row first when there is one),
    column = whose test split, cell = mean test Dice (blank where a site did not answer)."""
    cross = data["final"]["cross_site"]
    rows = [f"model {m}" for m in cross["models"]]
    matrix = [list(r) for r in cross["dice"]]
    if cross.get("global"):
        rows, matrix = ["global model"] + rows, [list(cross["global"])] + matrix
    values = np.array([[np.nan if v is None else float(v) for v in r] for r in matrix], dtype=float)
    cols = cross["test_sites"]
    fig, ax = plt.subplots(figsize=(1.2 * len(cols) + 2.5, 0.6 * len(rows) + 1.8))
    im = ax.imshow(values, vmin=0, vmax=1, cmap="viridis")
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if np.isfinite(values[i, j]):
                ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if values[i, j] < 0.6 else "black")
    ax.set_xticks(range(len(cols)), [f"test {c}" for c in cols], rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_title(f"{data['method']}: cross-site test {cross.get('metric', 'dice')}", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
