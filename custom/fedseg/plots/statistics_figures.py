"""Figures of a federated statistics report (``fedseg stats``, :func:`fedseg.fl.site_differences.site_report`): each
site's intensity histograms overlaid per channel, its foreground-fraction histograms per class, and the sites'
intensity distance matrix. Drawn from the aggregates the sites sent; what a site withheld is absent from a panel."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

#: the report's feature prefixes
INTENSITY, FRACTION = "intensity_c", "fg_fraction_"


def _histogram(report: Mapping[str, Any], site: str, feature: str) -> Optional[np.ndarray]:
    """A site's histogram of ``feature`` as NVFlare's bins ``(B, 3)``: low, high, count; None where it withheld it."""
    bins = report["per_site"].get(site, {}).get(feature, {}).get("histogram")
    return np.asarray(bins, dtype=float) if bins else None


def _sent_histograms(report: Mapping[str, Any], prefix: str) -> List[str]:
    """The features of ``prefix`` whose histogram at least one site sent, sorted."""
    features = {f for row in report["per_site"].values() for f in row if f.startswith(prefix)}
    return sorted(f for f in features if any(_histogram(report, site, f) is not None for site in report["sites"]))


def _overlaid_histograms(report: Mapping[str, Any], features: List[str], titles: List[str], xlabel: str,
                         path: Path) -> Path:
    """One panel per feature, each site's histogram as a density step curve (counts / total / bin width)."""
    fig, axes = plt.subplots(1, len(features), figsize=(4.2 * len(features), 3.2), squeeze=False)
    for ax, feature, title in zip(axes[0], features, titles):
        for site in report["sites"]:
            bins = _histogram(report, site, feature)
            if bins is None or bins[:, 2].sum() <= 0:
                continue
            edges = np.append(bins[:, 0], bins[-1, 1])
            density = bins[:, 2] / bins[:, 2].sum() / np.diff(edges)
            ax.stairs(density, edges, label=site)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("density")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_intensity_histograms(report: Mapping[str, Any], path: Path) -> Optional[Path]:
    """Each site's intensity histogram, overlaid, one panel per channel (None: no site sent one)."""
    features = _sent_histograms(report, INTENSITY)
    if not features:
        return None
    return _overlaid_histograms(report, features, [f"channel {f[len(INTENSITY):]}" for f in features], "intensity",
                                path)


def plot_fraction_histograms(report: Mapping[str, Any], path: Path) -> Optional[Path]:
    """Each site's histogram of the per-image foreground fraction, overlaid, one panel per class (None: no site sent
    one; small sites withhold it, NVFlare's HistogramBinsCleanser)."""
    features = _sent_histograms(report, FRACTION)
    if not features:
        return None
    return _overlaid_histograms(report, features, [f[len(FRACTION):] for f in features],
                                "foreground fraction of an image", path)


def plot_site_distances(report: Mapping[str, Any], path: Path) -> Optional[Path]:
    """The sites' intensity distance (EMD, mean over channels) as a heatmap; a pair with a withheld histogram is
    blank."""
    matrices = list((report.get("distances") or {}).get("intensity_emd", {}).values())
    if not matrices:
        return None
    distance = np.mean(np.asarray(matrices, dtype=float), axis=0)  # as fedseg.fl.site_differences.mean_intensity_distance
    sites = report["sites"]
    fig, ax = plt.subplots(figsize=(1.2 * len(sites) + 2.5, 1.0 * len(sites) + 1.5))
    image = ax.imshow(np.ma.masked_invalid(distance), cmap="viridis")
    for i in range(len(sites)):
        for j in range(len(sites)):
            text = "-" if np.isnan(distance[i, j]) else f"{distance[i, j]:.1f}"
            ax.text(j, i, text, ha="center", va="center", color="white", fontsize=8)
    ax.set_xticks(range(len(sites)), sites, rotation=45, ha="right")
    ax.set_yticks(range(len(sites)), sites)
    ax.set_title("intensity EMD (mean over channels)")
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_statistics(report: Mapping[str, Any], out_dir: Path) -> List[Path]:
    """Every figure of ``report`` that its statistics allow, as PNG files in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = [plot_intensity_histograms(report, out_dir / "intensity_histograms.png"),
               plot_fraction_histograms(report, out_dir / "foreground_fraction_histograms.png"),
               plot_site_distances(report, out_dir / "site_distances.png")]
    return [f for f in figures if f is not None]
