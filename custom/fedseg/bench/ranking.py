"""Which approach to use: a bench's federated approaches ranked by the results page's rule.

**The rule** (``docs/benchmarks.md``): approach A beats approach B when, on the bench's headline metric (Dice; accuracy
for classification), A is ahead of B in every seed (each seed's unweighted mean over sites), the mean of those per-seed
differences is beyond their standard deviation, and the paired per-image test (two-sided Wilcoxon signed-rank,
pooled over seeds and sites) gives p < 0.05 — with at least three seeds.

The recommendation: the approach with the highest seed-mean score leads, and it is the one to use; every approach it
does not beat by the rule is level with it and named beside it with its round time, so a user can trade a difference
the rule cannot confirm for a cheaper round. (Picking the cheapest of the level group instead would let a noisy
approach — level only because its seeds spread widely — win over steadier ones the leader does beat.)
Only federated approaches (methods'
global and personalised models) are ranked: the local / pooled references are not an option for a federation.
Segmentation benches only: a classification bench's per-image test is McNemar's on correctness, not this rule's.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

from fedseg.bench.stats import paired_tests, paired_values, seed_differences

#: fewest seeds the rule reads ("beyond the spread of three seeds")
MIN_SEEDS = 3
ALPHA = 0.05


def rule_verdict(a: Mapping[str, Any], b: Mapping[str, Any], sites: Sequence[str], metric: str) -> Dict[str, Any]:
    """Does ``a`` beat ``b`` by the rule?

    Args:
        a, b: approach entries with ``final_by_seed`` (``{seed: {site: {metric: value}}}``) and ``per_image_by_seed``
            (``{seed: {site: [rows]}}``), as :func:`fedseg.bench.report.build_results` collects them.

    Returns:
        ``{"per_seed": seed_differences(...), "paired": paired_tests(...), "beats": bool}`` (``beats`` is False with
        fewer than :data:`MIN_SEEDS` common seeds).
    """
    per_seed = seed_differences(a["final_by_seed"], b["final_by_seed"], sites, metric)
    x, y, _ = paired_values(a["per_image_by_seed"], b["per_image_by_seed"], metric, sites)
    paired = paired_tests(x, y)
    n = per_seed["n"]
    beats = (n >= MIN_SEEDS and per_seed["ahead"] == n and per_seed["mean"] > per_seed["std"]
             and paired["wilcoxon_p"] is not None and paired["wilcoxon_p"] < ALPHA and paired["mean_diff"] > 0)
    return {"per_seed": per_seed, "paired": paired, "beats": bool(beats)}


def _score(entry: Mapping[str, Any], sites: Sequence[str], metric: str) -> Optional[float]:
    """Mean over seeds of the unweighted mean over sites (None where a seed lacks a site's value)."""
    per_seed = []
    for by_site in entry["final_by_seed"].values():
        values = [(by_site.get(s) or {}).get(metric) for s in sites]
        if any(v is None for v in values):
            return None
        per_seed.append(statistics.fmean(values))
    return statistics.fmean(per_seed) if per_seed else None


def evidence(name: str, other: str, verdict: Mapping[str, Any], metric: str) -> str:
    """``graphfedseg+m vs fedavgm: +0.012 ± 0.004 Dice per seed, 3/3 seeds ahead, per image +0.010 (Wilcoxon p 3e-04)``."""
    ps, pt = verdict["per_seed"], verdict["paired"]
    p = pt.get("wilcoxon_p")
    per_image = "-" if pt.get("mean_diff") is None else f"{pt['mean_diff']:+.3f}"
    return (f"{name} vs {other}: {ps['mean']:+.3f} ± {ps['std']:.3f} {metric} per seed, {ps['ahead']}/{ps['n']} seeds "
            f"ahead, per image {per_image} (Wilcoxon p {'-' if p is None else f'{p:.1g}'})")


def rank(approaches: Mapping[str, Mapping[str, Any]], timing: Mapping[str, Mapping[str, Any]], sites: Sequence[str],
         metric: str = "dice") -> Optional[Dict[str, Any]]:
    """The bench's recommendation (module docstring).

    Args:
        approaches: ``{name: entry}`` with ``kind``, ``label``, ``final_by_seed``, ``per_image_by_seed``.
        timing: ``{label: {"median_round_wall": s, ...}}`` (the bench's cost table).
        sites: the sites averaged.
        metric: the headline metric.

    Returns:
        None when fewer than two federated approaches ran; else ``{"metric", "order": [(name, score)], "leader",
        "level": [names level with the leader], "use", "why", "evidence": [lines], "seeds", "verdicts": {name: the
        leader against it, :func:`rule_verdict`'s per-seed spread, paired n / mean_diff / wilcoxon_p and beats}}``.
    """
    scored = [(name, _score(e, sites, metric)) for name, e in approaches.items() if e.get("kind") == "method"]
    scored = sorted([(n, s) for n, s in scored if s is not None], key=lambda t: -t[1])
    if len(scored) < 2:
        return None
    leader = scored[0][0]
    verdicts = {name: rule_verdict(approaches[leader], approaches[name], sites, metric) for name, _ in scored[1:]}
    level = [name for name, _ in scored[1:] if not verdicts[name]["beats"]]
    seeds = min(v["per_seed"]["n"] for v in verdicts.values())
    runner_up = scored[1][0]
    lines = [evidence(leader, name, verdicts[name], metric) for name, _ in scored[1:]]
    use = leader

    def round_wall(name: str) -> Optional[float]:
        return (timing.get(approaches[name]["label"]) or {}).get("median_round_wall")

    if seeds < MIN_SEEDS:
        why = f"highest mean {metric}; fewer than {MIN_SEEDS} seeds, so the rule decides nothing"
    elif not level:
        why = f"beats every other approach by the rule (closest: {runner_up})"
    else:
        lead_wall = round_wall(leader)
        parts = []
        for name in level:
            wall = round_wall(name)
            parts.append(name if wall is None or not lead_wall else f"{name} ({wall / lead_wall:.2f}x its round)")
        why = f"highest mean {metric}; the rule does not separate it from " + ", ".join(parts)
    return {"metric": metric, "order": [[n, s] for n, s in scored], "leader": leader, "level": level, "use": use,
            "why": why, "evidence": lines, "seeds": seeds,
            "verdicts": {n: {"per_seed": v["per_seed"], "paired": {k: v["paired"].get(k) for k in ("n", "mean_diff", "wilcoxon_p")},
                             "beats": v["beats"]} for n, v in verdicts.items()}}


def recommendation_lines(ranking: Optional[Mapping[str, Any]], data: str = "this federation",
                         budget: str = "this budget") -> List[str]:
    """The two lines ``fedseg bench`` prints: ``On <data>, at <budget>: use X`` and the leader's evidence."""
    if not ranking:
        return []
    head = f"On {data}, at {budget}: use {ranking['use']} ({ranking['why']})."
    return [head, "Evidence (leader against each other approach): " + "; ".join(ranking["evidence"]) + "."]
