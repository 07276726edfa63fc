"""Aggregation over seeds and paired tests between approaches.

Data layout used throughout: ``per_image[seed][site]`` = the list of per-image rows
(``{"id", "dice", "hd95", "assd"}``) of one approach's final evaluation on ``site``'s test split,
in datalist order.

Pairing (:func:`paired_values`): image ``i`` of site ``k`` of seed ``s`` of approach A is paired with
image ``i`` of site ``k`` of seed ``s`` of approach B (the ids must agree); pairs are pooled over the
seeds both approaches ran (ascending) and, unless one site is asked for, over the sites (in the given order).

Classification rows are ``{"id", "label", "prediction", "correct" (0/1)}``; their paired test is McNemar's
exact test on the per-image correctness (:func:`mcnemar_exact`, :func:`compare_correct`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

PerImage = Mapping[int, Mapping[str, Sequence[Mapping[str, Any]]]]


def seed_spread(values: Sequence[Optional[float]]) -> Dict[str, Any]:
    """``{"mean", "std", "n", "values"}`` over seeds; ``std`` is the sample standard deviation
    (ddof=1), 0 for a single seed; missing values (None) are left out."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"mean": None, "std": None, "n": 0, "values": []}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "n": len(vals), "values": vals}


def paired_values(a: PerImage, b: PerImage, metric: str = "dice", sites: Optional[Sequence[str]] = None
                  ) -> Tuple[List[float], List[float], List[Tuple[int, str, str]]]:
    """Paired per-image values of approaches ``a`` and ``b`` (layout in the module docstring).

    Args:
        a, b: ``{seed: {site: rows}}``.
        metric: row key to pair.
        sites: sites to pool (in this order); default every site ``a`` has in its first common seed.

    Returns:
        ``(x, y, keys)``: ``x[j]`` from ``a`` and ``y[j]`` from ``b`` for the pair ``keys[j] = (seed, site, id)``.

    Raises:
        ValueError: a site's image lists differ between ``a`` and ``b`` (other length or ids).
    """
    seeds = sorted(set(a) & set(b))
    x: List[float] = []
    y: List[float] = []
    keys: List[Tuple[int, str, str]] = []
    for seed in seeds:
        use = list(sites) if sites is not None else list(a[seed])
        for site in use:
            if site not in a[seed] or site not in b[seed]:
                continue
            rows_a, rows_b = a[seed][site], b[seed][site]
            ids_a, ids_b = [r.get("id") for r in rows_a], [r.get("id") for r in rows_b]
            if ids_a != ids_b:
                raise ValueError(f"seed {seed} site {site}: the test images differ between the two approaches")
            for ra, rb in zip(rows_a, rows_b):
                if ra.get(metric) is None or rb.get(metric) is None:  # e.g. a FOV metric of a site without FOV
                    continue
                x.append(float(ra[metric]))
                y.append(float(rb[metric]))
                keys.append((seed, site, ra.get("id")))
    return x, y, keys


def paired_tests(x: Sequence[float], y: Sequence[float]) -> Dict[str, Any]:
    """Wilcoxon signed-rank test (``scipy.stats.wilcoxon(x, y)``) and paired t-test
    (``scipy.stats.ttest_rel(x, y)``), both two-sided with scipy's defaults.

    Returns:
        ``{"n", "mean_x", "mean_y", "mean_diff" (x - y), "wilcoxon_stat", "wilcoxon_p", "ttest_stat",
        "ttest_p"}``; a test that cannot be computed (fewer than 2 pairs, all differences zero) gives
        None for its statistic and p-value and a ``note``.
    """
    from scipy import stats as sps

    n = len(x)
    if n != len(y):
        raise ValueError(f"paired samples of different lengths {n} and {len(y)}")
    out: Dict[str, Any] = {"n": n, "mean_x": statistics.fmean(x) if n else None, "mean_y": statistics.fmean(y) if n else None,
                           "mean_diff": statistics.fmean([a - b for a, b in zip(x, y)]) if n else None,
                           "wilcoxon_stat": None, "wilcoxon_p": None, "ttest_stat": None, "ttest_p": None}
    if n < 2:
        out["note"] = "fewer than 2 pairs"
        return out
    if all(a == b for a, b in zip(x, y)):
        out["note"] = "all paired differences are zero"
        return out
    w = sps.wilcoxon(x, y)
    out["wilcoxon_stat"], out["wilcoxon_p"] = _finite(w.statistic), _finite(w.pvalue)
    t = sps.ttest_rel(x, y)
    out["ttest_stat"], out["ttest_p"] = _finite(t.statistic), _finite(t.pvalue)
    return out


def _finite(v: Any) -> Optional[float]:
    v = float(v)
    return v if math.isfinite(v) else None


def compare(a: PerImage, b: PerImage, sites: Sequence[str], metrics: Sequence[str] = ("dice", "hd95", "assd")
            ) -> Dict[str, Dict[str, Any]]:
    """Paired tests of ``a`` against ``b`` per metric: ``{"all": pooled over sites and seeds,
    "per_site": {site: pooled over seeds}}``."""
    out: Dict[str, Dict[str, Any]] = {}
    for metric in metrics:
        x, y, _ = paired_values(a, b, metric, sites)
        out[metric] = {"all": paired_tests(x, y),
                       "per_site": {s: paired_tests(*paired_values(a, b, metric, [s])[:2]) for s in sites}}
    return out


def seed_differences(a: Mapping[Any, Mapping[str, Mapping[str, Optional[float]]]],
                     b: Mapping[Any, Mapping[str, Mapping[str, Optional[float]]]], sites: Sequence[str],
                     metric: str = "dice") -> Dict[str, Any]:
    """Seed by seed, ``a``'s unweighted mean over sites of each site's ``metric`` minus ``b``'s: the paired reading of
    "beyond the spread of three seeds" (seeds share data splits, so a seed that is hard for one approach is hard for
    all; the per-seed difference removes that shared part of the spread).

    Args:
        a, b: ``{seed: {site: {metric: value}}}`` (a site's value = mean over its test images).
        sites: the sites to average; a seed where either approach lacks a site's value is left out.

    Returns:
        :func:`seed_spread` of the differences over the seeds both ran (ascending) plus ``"seeds"`` (those seeds)
        and ``"ahead"`` (in how many of them ``a`` is above ``b``).
    """
    seeds, diffs = [], []
    for seed in sorted(set(a) & set(b), key=int):
        va = [(a[seed].get(site) or {}).get(metric) for site in sites]
        vb = [(b[seed].get(site) or {}).get(metric) for site in sites]
        if any(v is None for v in va + vb):
            continue
        seeds.append(int(seed))
        diffs.append(statistics.fmean(va) - statistics.fmean(vb))
    out = seed_spread(diffs)
    out.update(seeds=seeds, ahead=sum(1 for d in out["values"] if d > 0))
    return out


def mcnemar_exact(x: Sequence[float], y: Sequence[float]) -> Dict[str, Any]:
    """McNemar's exact test of paired per-image correctness ``x`` (approach A) and ``y`` (approach B), 0/1 each.

    Only the discordant pairs carry information: ``b`` = images A gets right and B wrong, ``c`` = the
    reverse. Under H0 (same accuracy) ``b ~ Binomial(b + c, 1/2)``; the p-value is the two-sided exact
    binomial test ``scipy.stats.binomtest(b, b + c, 0.5)``.

    Returns:
        ``{"n", "mean_x", "mean_y", "mean_diff" (accuracy of A - accuracy of B), "b", "c", "mcnemar_p"}``;
        with fewer than 2 pairs or no discordant pair the p-value is None and a ``note`` says why.

    Raises:
        ValueError: different lengths, or a value that is not 0 or 1.
    """
    from scipy import stats as sps

    n = len(x)
    if n != len(y):
        raise ValueError(f"paired samples of different lengths {n} and {len(y)}")
    bad = [v for v in list(x) + list(y) if float(v) not in (0.0, 1.0)]
    if bad:
        raise ValueError(f"McNemar's test needs per-image correctness 0 or 1, got {bad[:5]}")
    b = sum(1 for a, o in zip(x, y) if float(a) == 1.0 and float(o) == 0.0)
    c = sum(1 for a, o in zip(x, y) if float(a) == 0.0 and float(o) == 1.0)
    out: Dict[str, Any] = {"n": n, "mean_x": statistics.fmean(x) if n else None, "mean_y": statistics.fmean(y) if n else None,
                           "mean_diff": (b - c) / n if n else None, "b": b, "c": c, "mcnemar_p": None}
    if n < 2:
        out["note"] = "fewer than 2 pairs"
    elif b + c == 0:
        out["note"] = "no discordant pairs (both approaches right or wrong on the same images)"
    else:
        out["mcnemar_p"] = _finite(sps.binomtest(b, b + c, 0.5).pvalue)
    return out


def compare_correct(a: PerImage, b: PerImage, sites: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """McNemar's exact test of ``a`` against ``b`` on per-image correctness (classification):
    ``{"correct": {"all": pooled over sites and seeds, "per_site": {site: pooled over seeds}}}``."""
    x, y, _ = paired_values(a, b, "correct", sites)
    return {"correct": {"all": mcnemar_exact(x, y),
                        "per_site": {s: mcnemar_exact(*paired_values(a, b, "correct", [s])[:2]) for s in sites}}}


def summarise_seeds(final: Mapping[int, Mapping[str, Mapping[str, Optional[float]]]], sites: Sequence[str],
                    metrics: Sequence[str] = ("dice", "hd95", "assd")) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """Mean +- std over seeds of each site's test metric and of the unweighted mean over sites.

    Args:
        final: ``{seed: {site: {metric: value}}}`` (a site's value = mean over its test images).

    Returns:
        ``{site or "mean": {metric: seed_spread(...)}}``.
    """
    out: Dict[str, Dict[str, Any]] = {}
    for site in sites:
        out[site] = {m: seed_spread([(final[s].get(site) or {}).get(m) for s in sorted(final)]) for m in metrics}
    means = {}
    for m in metrics:
        per_seed = []
        for s in sorted(final):
            vals = [(final[s].get(site) or {}).get(m) for site in sites]
            per_seed.append(None if any(v is None for v in vals) else statistics.fmean(vals))
        means[m] = seed_spread(per_seed)
    out["mean"] = means
    return out
