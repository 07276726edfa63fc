"""``fedseg bench``'s recommendation (``fedseg.bench.ranking``) on constructed approaches whose verdicts are known:
the rule's numbers against numpy / scipy computed here from the same per-image values."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedseg.bench.ranking import rank, recommendation_lines, rule_verdict

SITES = ["a", "b"]
SEEDS = [0, 1, 2]
N_IMAGES = 8


def _approach(dice: np.ndarray, label: str, kind: str = "method"):
    """``dice[seed, site, image]`` -> an approach entry as ``build_results`` collects it."""
    per_image = {s: {site: [{"id": f"{site}-{i}", "dice": float(dice[s, k, i])} for i in range(N_IMAGES)]
                     for k, site in enumerate(SITES)} for s in SEEDS}
    final = {s: {site: {"dice": float(dice[s, k].mean())} for k, site in enumerate(SITES)} for s in SEEDS}
    return {"kind": kind, "label": label, "final_by_seed": final, "per_image_by_seed": per_image}


def _base(seed=0):
    return np.random.default_rng(seed).uniform(0.6, 0.8, size=(len(SEEDS), len(SITES), N_IMAGES))


def test_verdict_numbers_are_numpy_and_scipy_on_the_same_values():
    rng = np.random.default_rng(1)
    b = _base()
    a = b + 0.03 + rng.normal(0, 0.01, size=b.shape)
    verdict = rule_verdict(_approach(a, "a"), _approach(b, "b"), SITES, "dice")
    per_seed = (a.mean(axis=2).mean(axis=1) - b.mean(axis=2).mean(axis=1))
    assert verdict["per_seed"]["mean"] == pytest.approx(per_seed.mean())
    assert verdict["per_seed"]["std"] == pytest.approx(per_seed.std(ddof=1))
    assert verdict["paired"]["wilcoxon_p"] == pytest.approx(stats.wilcoxon(a.ravel(), b.ravel()).pvalue)
    assert verdict["beats"] and verdict["per_seed"]["ahead"] == 3


def test_a_clear_lead_is_used_and_a_tie_goes_to_the_cheaper():
    b = _base()
    rng = np.random.default_rng(2)
    approaches = {
        "strong": _approach(b + 0.05, "strong"),
        "fedavg": _approach(b, "fedavg"),
        "pooled": _approach(b + 0.2, "pooled", kind="reference"),  # not an option for a federation
    }
    timing = {"strong": {"median_round_wall": 9.0}, "fedavg": {"median_round_wall": 5.0}}
    got = rank(approaches, timing, SITES)
    assert got["use"] == "strong" and got["level"] == [] and got["leader"] == "strong"
    assert [n for n, _ in got["order"]] == ["strong", "fedavg"]
    # a rival within the noise: not separable, so the cheaper round is recommended even though it scores lower
    approaches["rival"] = _approach(b + 0.05 + rng.normal(0, 0.03, size=b.shape) - 0.004, "rival")
    timing["rival"] = {"median_round_wall": 4.0}
    got = rank(approaches, timing, SITES)
    assert got["leader"] == "strong" and got["level"] == ["rival"] and got["use"] == "rival"
    lines = recommendation_lines(got, "retina", "20 rounds")
    assert lines[0].startswith("On retina, at 20 rounds: use rival") and "strong vs rival" in lines[1]


def test_fewer_than_three_seeds_decide_nothing():
    b = _base()
    one = {k: v for k, v in _approach(b + 0.1, "x").items()}
    one["final_by_seed"] = {0: one["final_by_seed"][0]}
    one["per_image_by_seed"] = {0: one["per_image_by_seed"][0]}
    got = rank({"x": one, "fedavg": _approach(b, "fedavg")}, {}, SITES)
    assert got["use"] == "x" and "fewer than 3 seeds" in got["why"]
    assert not rule_verdict(one, _approach(b, "fedavg"), SITES, "dice")["beats"]
    assert rank({"fedavg": _approach(b, "fedavg")}, {}, SITES) is None
