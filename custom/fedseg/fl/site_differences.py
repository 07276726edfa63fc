"""How different a federation's sites are, from what NVFlare's federated statistics sent (nothing per image).

Input: the JSON NVFlare's ``StatisticsController`` writes, ``{feature: {statistic: {site | "Global": {split: value}}}}``
(features of :mod:`fedseg.fl.site_statistics`). Output (``stats.json`` and ``stats.md``):

* per site: image count and size, per channel intensity mean / std / min / max (with NVFlare's noise) / share outside
  the shared histogram range, per class the share of images it appears in and its foreground fraction;
* pooled: the count-weighted combination of the sites that sent a statistic (NVFlare's own "Global" also counts
  records of sites whose other statistics the privacy filter withheld, so it is not used);
* what each site withheld (the privacy filter dropped it: too few records, or too many bins for its records);
* site distances: the Earth mover's distance between two sites' intensity histograms per channel (POT,
  ``ot.wasserstein_1d`` on the bin centres, in intensity units), and the differences in prevalence and foreground
  fraction; and a few plain sentences.
"""

from __future__ import annotations

import json
import math
import os
from itertools import combinations
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from fedseg.fl.site_statistics import FG_FRACTION, INTENSITY, OUTSIDE, PRESENT, SIZE, SPACING

GLOBAL = "Global"  # NVFlare's key of the server's combination
#: the statistics the job computes of every feature (``fedseg.fl.fed_statistics.statistic_configs``)
JOB_STATISTICS = ("count", "sum", "mean", "stddev", "min", "max", "histogram")


def site_values(raw: Mapping[str, Any], feature: str, statistic: str) -> Dict[str, Any]:
    """``{site: value}`` of one statistic of one feature (the split level removed; "Global" left out); a site that
    withheld it is absent."""
    per_site = raw.get(feature, {}).get(statistic, {})
    return {site: next(iter(v.values())) for site, v in per_site.items() if site != GLOBAL and v}


def histogram_edges_counts(bins: Sequence[Sequence[float]]) -> Tuple[np.ndarray, np.ndarray]:
    """NVFlare's bins ``[[low, high, count], ...]`` -> ``(edges (B+1,), counts (B,))``."""
    arr = np.asarray(bins, dtype=np.float64).reshape(-1, 3)
    return np.append(arr[:, 0], arr[-1, 1]), arr[:, 2]


def histogram_emd(edges: np.ndarray, counts_a: np.ndarray, counts_b: np.ndarray) -> float:
    """Earth mover's distance between two histograms on the same ``edges`` (each normalised to mass 1), in the units
    of the edges: POT's 1-D Wasserstein-1 with the mass of each bin at its centre."""
    import ot

    centres = (edges[:-1] + edges[1:]) / 2
    a = np.asarray(counts_a, dtype=np.float64)
    b = np.asarray(counts_b, dtype=np.float64)
    if a.sum() <= 0 or b.sum() <= 0:
        return float("nan")
    return float(ot.wasserstein_1d(centres, centres, a / a.sum(), b / b.sum(), p=1))


def pooled_moments(counts: Sequence[float], means: Sequence[float], stds: Sequence[float]) -> Tuple[float, float]:
    """``(mean, sample std)`` of the union of groups given each group's count, mean and sample std (``ddof=1``)."""
    n = np.asarray(counts, dtype=np.float64)
    m = np.asarray(means, dtype=np.float64)
    s = np.asarray(stds, dtype=np.float64)
    total = n.sum()
    mean = float((n * m).sum() / total)
    sq_dev = ((n - 1) * s**2).sum() + (n * (m - mean) ** 2).sum()
    return mean, float(math.sqrt(sq_dev / max(total - 1, 1)))


def _features(raw: Mapping[str, Any], prefix: str) -> List[str]:
    return [f for f in raw if f.startswith(prefix)]


def _site_row(raw: Mapping[str, Any], site: str) -> Dict[str, Any]:
    """What one site sent, per feature: ``{feature: {statistic: value}}`` (withheld statistics absent)."""
    row: Dict[str, Any] = {}
    for feature, stats in raw.items():
        sent = {stat: next(iter(v[site].values())) for stat, v in stats.items() if site in v and v[site]}
        row[feature] = sent
    return row


def _pooled(raw: Mapping[str, Any], sites: Sequence[str]) -> Dict[str, Any]:
    """Per feature, the count-weighted combination over the sites that sent mean and std (and the summed histograms
    of the sites that sent one); ``sites_included`` names them."""
    pooled: Dict[str, Any] = {}
    for feature in raw:
        counts, means, stds = site_values(raw, feature, "count"), site_values(raw, feature, "mean"), site_values(raw, feature, "stddev")
        included = [s for s in sites if s in means and s in stds and s in counts]
        entry: Dict[str, Any] = {"sites_included": included}
        if included:
            mean, std = pooled_moments([counts[s] for s in included], [means[s] for s in included], [stds[s] for s in included])
            entry.update(count=int(sum(counts[s] for s in included)), mean=mean, stddev=std)
        hists = site_values(raw, feature, "histogram")
        with_hist = [s for s in sites if s in hists]
        if with_hist:
            edges, _ = histogram_edges_counts(hists[with_hist[0]])
            entry["histogram"] = {"edges": edges.tolist(),
                                  "counts": np.sum([histogram_edges_counts(hists[s])[1] for s in with_hist], axis=0).tolist(),
                                  "sites_included": with_hist}
        pooled[feature] = entry
    return pooled


def _withheld(raw: Mapping[str, Any], sites: Sequence[str]) -> Dict[str, List[str]]:
    """``{site: ["feature: statistic", ...]}`` of what the privacy filter kept at the site: every statistic the job
    computes (any feature has it) that the site did not send for a feature."""
    computed = JOB_STATISTICS  # not what any site sent: when every site withheld a statistic, no feature has it
    out: Dict[str, List[str]] = {}
    for feature, stats in raw.items():
        for stat in computed:
            for site in sites:
                if not stats.get(stat, {}).get(site):
                    out.setdefault(site, []).append(f"{feature}: {stat}")
    return out


def _intensity_distances(raw: Mapping[str, Any], sites: Sequence[str]) -> Dict[str, Any]:
    """Per channel, the pairwise EMD matrix (NaN where a site withheld its histogram)."""
    out: Dict[str, Any] = {}
    for feature in _features(raw, INTENSITY):
        hists = site_values(raw, feature, "histogram")
        matrix = np.zeros((len(sites), len(sites)))
        for (i, a), (j, b) in combinations(enumerate(sites), 2):
            if a in hists and b in hists:
                edges, ca = histogram_edges_counts(hists[a])
                matrix[i, j] = matrix[j, i] = histogram_emd(edges, ca, histogram_edges_counts(hists[b])[1])
            else:
                matrix[i, j] = matrix[j, i] = float("nan")
        out[feature] = matrix.tolist()
    return out


def _class_differences(raw: Mapping[str, Any], sites: Sequence[str]) -> Dict[str, Any]:
    """Per class, the pairwise differences (row site minus column site) of prevalence and mean foreground fraction."""
    out: Dict[str, Any] = {}
    for prefix, key in ((PRESENT, "prevalence"), (FG_FRACTION, "fg_fraction")):
        for feature in _features(raw, prefix):
            means = site_values(raw, feature, "mean")
            diff = [[(means[a] - means[b]) if a in means and b in means else float("nan") for b in sites] for a in sites]
            out.setdefault(key, {})[feature[len(prefix):]] = diff
    return out


def sites_that_sent(raw: Mapping[str, Any], sites: Sequence[str]) -> List[str]:
    """The ``sites`` (in order) that sent any statistic of any feature; a site that sent nothing dropped out (its
    client ended, or it could not read its data) or is not in the job at all."""
    sent = {site for stats in raw.values() for per_site in stats.values() for site, v in per_site.items() if v}
    return [site for site in sites if site in sent]


def site_report(raw: Mapping[str, Any], sites: Sequence[str], settings: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The ``stats.json`` content (module docstring) from NVFlare's statistics JSON ``raw`` of the job's ``sites``:
    ``sites`` are the ones that sent statistics, ``dropped_sites`` the ones that sent nothing."""
    dropped = [site for site in sites if site not in sites_that_sent(raw, sites)]
    sites = [site for site in sites if site not in dropped]
    report = {
        "sites": list(sites),
        "dropped_sites": dropped,
        "settings": dict(settings or {}),
        "per_site": {site: _site_row(raw, site) for site in sites},
        "pooled": _pooled(raw, sites),
        "withheld": _withheld(raw, sites),
        "distances": {"intensity_emd": _intensity_distances(raw, sites), **_class_differences(raw, sites)},
    }
    report["summary"] = summary_sentences(report)
    return report


def _mean_intensity(report: Mapping[str, Any], who: str) -> Optional[float]:
    """The mean over channels of the mean intensity of a site (or "pooled"); None when withheld."""
    rows = report["pooled"] if who == "pooled" else report["per_site"][who]
    values = [rows[f].get("mean") for f in rows if f.startswith(INTENSITY)]
    return float(np.mean(values)) if values and None not in values else None


def summary_sentences(report: Mapping[str, Any]) -> List[str]:
    """Plain sentences: which sites sent nothing, which site is darker / brighter than the pooled images, whose
    objects are smaller / larger, where a class is rarer, and the most different pair of sites by intensity."""
    sentences = dropped_sentence(report)
    pooled_mean = _mean_intensity(report, "pooled")
    pooled_std = np.mean([v["stddev"] for f, v in report["pooled"].items() if f.startswith(INTENSITY) and "stddev" in v] or [0])
    for site in report["sites"]:
        said = []
        absent = absent_classes(report, site)
        mean = _mean_intensity(report, site)
        if mean is not None and pooled_mean is not None and pooled_std > 0 and abs(mean - pooled_mean) > 0.25 * pooled_std:
            said.append(f"its images are {'darker' if mean < pooled_mean else 'brighter'} (mean intensity {mean:.1f} "
                        f"vs {pooled_mean:.1f} pooled)")
        for feature, pooled in report["pooled"].items():
            if any(feature in (FG_FRACTION + name, PRESENT + name) for name in absent):
                continue  # said in its own sentence below
            name, sent = feature[len(FG_FRACTION):], report["per_site"][site].get(feature, {})
            if feature.startswith(FG_FRACTION) and "mean" in sent and pooled.get("mean"):
                ratio = sent["mean"] / pooled["mean"]
                if abs(ratio - 1) > 0.25:
                    said.append(f"its {name} regions are {'smaller' if ratio < 1 else 'larger'} "
                                f"({sent['mean']:.1%} of an image vs {pooled['mean']:.1%})")
            name = feature[len(PRESENT):]
            if feature.startswith(PRESENT) and "mean" in sent and "mean" in pooled and abs(sent["mean"] - pooled["mean"]) > 0.1:
                said.append(f"{name} appears in {'fewer' if sent['mean'] < pooled['mean'] else 'more'} of its images "
                            f"({sent['mean']:.0%} vs {pooled['mean']:.0%})")
        if said:
            sentences.append(f"{site}: " + "; ".join(said) + ".")
        sentences += [f"{site} has no pixels of declared class '{name}' in any of its {n} images."
                      for name, n in absent.items()]
    sentences += _farthest_pair(report) + _outside_range(report)
    withheld = [s for s, items in report["withheld"].items() if items]
    if withheld:
        sentences.append(f"The privacy filter withheld statistics of {', '.join(withheld)} (see 'withheld'); pooled "
                         "values combine only the sites that sent them.")
    return sentences or ["The sites' statistics are alike."]


def absent_classes(report: Mapping[str, Any], site: str) -> Dict[str, int]:
    """``{class: images}`` of the declared classes with no foreground pixel in any of ``site``'s images (it sent a
    prevalence of 0 over that many images); a class whose prevalence the site withheld is not listed."""
    out = {}
    for feature, sent in report["per_site"][site].items():
        if feature.startswith(PRESENT) and sent.get("mean") == 0 and sent.get("count"):
            out[feature[len(PRESENT):]] = int(sent["count"])
    return out


def dropped_sentence(report: Mapping[str, Any]) -> List[str]:
    """One sentence naming the sites that sent nothing and the ones the statistics are of; none when every site sent."""
    dropped = report.get("dropped_sites") or []
    if not dropped:
        return []
    have = ", ".join(report["sites"]) or "no site"
    return [f"{', '.join(dropped)} sent nothing (dropped out); statistics of {have}."]


def _farthest_pair(report: Mapping[str, Any]) -> List[str]:
    """The pair of sites farthest apart by intensity EMD (mean over channels), as one sentence."""
    matrices = [np.asarray(m, dtype=np.float64) for m in report["distances"]["intensity_emd"].values()]
    sites = report["sites"]
    if not matrices or len(sites) < 2:
        return []
    mean = np.mean(matrices, axis=0)
    if np.all(np.isnan(mean)):
        return []
    i, j = np.unravel_index(np.nanargmax(mean), mean.shape)
    return [f"Most different intensities: {sites[i]} and {sites[j]} (EMD {mean[i, j]:.1f} intensity units, "
            "mean over channels)."]


def _outside_range(report: Mapping[str, Any], most: float = 0.5) -> List[str]:
    """A sentence per site and channel where more than ``most`` of the values fell outside the histogram range (the
    histogram then describes few of them: widen ``--intensity-range``)."""
    out = []
    for site in report["sites"]:
        for feature, sent in report["per_site"][site].items():
            if feature.startswith(OUTSIDE) and sent.get("mean", 0) > most:
                out.append(f"{sent['mean']:.0%} of {site}'s channel-{feature[len(OUTSIDE):]} values fall outside the "
                           "histogram range: its histogram describes only the rest (widen the range).")
    return out


def _fmt(value: Any, spec: str = ".1f") -> str:
    """``value`` formatted, "withheld" for None (``+ 0`` turns NVFlare's noised ``-0.0`` into ``0.0``)."""
    return "withheld" if value is None else format(value + 0, spec)


def _extents(row: Mapping[str, Any], prefix: str, spec: str) -> str:
    """The mean per axis of the features ``prefix{d}`` as ``a×b(×c)``, or "withheld"."""
    values = [row.get(f, {}).get("mean") for f in sorted(x for x in row if x.startswith(prefix))]
    return "withheld" if None in values or not values else "×".join(_fmt(v, spec) for v in values)


def site_table(report: Mapping[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """``(headers, rows)`` of the per-site table: one row per site and the pooled one; images, size (and spacing),
    per channel intensity mean ± std [noisy min, max] and the share outside the histogram range, per class the share
    of images it appears in and its mean foreground fraction ("withheld" where a site did not send it)."""
    sites, per_site = report["sites"], report["per_site"]
    channels = sorted(f for f in report["pooled"] if f.startswith(INTENSITY))
    classes = sorted(f[len(PRESENT):] for f in report["pooled"] if f.startswith(PRESENT))
    spacing = any(f.startswith(SPACING) for f in report["pooled"])
    headers = ["site", "images", "size"] + (["spacing"] if spacing else []) + [f"c{f[len(INTENSITY):]} mean ± std [min, max]" for f in channels]
    headers += [f"c{f[len(INTENSITY):]} outside" for f in channels]
    headers += [f"{c} in images" for c in classes] + [f"{c} fraction" for c in classes]
    rows = []
    for who in [*sites, "pooled"]:
        row = report["pooled"] if who == "pooled" else per_site[who]
        cells = [who, _fmt(row.get(f"{SIZE}0", {}).get("count"), "d"), _extents(row, SIZE, ".0f")]
        cells += [_extents(row, SPACING, ".2f")] if spacing else []
        for f in channels:
            s = row.get(f, {})
            extent = f" [{_fmt(s.get('min'))}, {_fmt(s.get('max'))}]" if who != "pooled" else ""
            cells.append(f"{_fmt(s.get('mean'))} ± {_fmt(s.get('stddev'))}{extent}")
        cells += [_fmt(row.get(OUTSIDE + f[len(INTENSITY):], {}).get("mean"), ".2%") for f in channels]
        cells += [_fmt(row.get(PRESENT + c, {}).get("mean"), ".0%") for c in classes]
        cells += [_fmt(row.get(FG_FRACTION + c, {}).get("mean"), ".1%") for c in classes]
        rows.append(cells)
    return headers, rows


def distance_rows(sites: Sequence[str], matrix: Sequence[Sequence[float]]) -> List[List[str]]:
    """A site-by-site distance matrix as table rows (first cell the row's site; "withheld" where a site did not send
    its histogram)."""
    return [[a, *[_fmt(v, ".2f") if not math.isnan(v) else "withheld" for v in r]] for a, r in zip(sites, matrix)]


def mean_intensity_distance(report: Mapping[str, Any]) -> np.ndarray:
    """The sites' intensity EMD averaged over channels ``(K, K)`` (NaN where a site withheld a histogram)."""
    return np.mean(np.asarray(list(report["distances"]["intensity_emd"].values()), dtype=float), axis=0)


def markdown(report: Mapping[str, Any]) -> str:
    """``stats.md``: the per-site table, the EMD matrices, the class differences and the summary."""
    from fedseg.markdown import markdown_table

    sites = report["sites"]
    headers, rows = site_table(report)
    lines = ["# Site statistics", "", *markdown_table(headers, rows), "", "min/max carry NVFlare's privacy noise.", ""]
    for feature, matrix in report["distances"]["intensity_emd"].items():
        lines += [f"## Intensity EMD, channel {feature[len(INTENSITY):]}", "",
                  *markdown_table(["site", *sites], distance_rows(sites, matrix)), ""]
    lines += ["## Summary", "", *[f"- {s}" for s in report["summary"]], ""]
    for site, items in report["withheld"].items():
        lines += [f"Withheld by {site}'s privacy filter: {', '.join(items)}.", ""]
    return "\n".join(lines)


def write_report(report: Mapping[str, Any], out_dir: os.PathLike) -> Tuple[Path, Path]:
    """Write the figures (``plots/``, :mod:`fedseg.plots.statistics_figures`), ``stats.md`` (linking them) and
    ``stats.json`` in ``out_dir`` (the JSON last: a folder with it holds a finished run)."""
    from fedseg.plots.statistics_figures import plot_statistics

    out = Path(out_dir)
    figures = plot_statistics(report, out / "plots")
    md = out / "stats.md"
    links = ["## Figures", "", *(f"![{f.stem}]({f.relative_to(out).as_posix()})" for f in figures), ""] if figures else []
    md.write_text(markdown(report).rstrip("\n") + "\n\n" + "\n".join(links))
    js = out / "stats.json"
    tmp = js.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(js)
    return js, md
