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


def test_the_leader_is_used_and_a_tie_is_named_beside_it():
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
    # a rival within the noise: not separable, so named beside the leader (with its round) — the leader stays the one
    approaches["rival"] = _approach(b + 0.05 + rng.normal(0, 0.03, size=b.shape) - 0.004, "rival")
    timing["rival"] = {"median_round_wall": 4.0}
    got = rank(approaches, timing, SITES)
    assert got["leader"] == "strong" and got["level"] == ["rival"] and got["use"] == "strong"
    assert "does not separate it from rival (0.44x its round)" in got["why"]
    lines = recommendation_lines(got, "retina", "20 rounds")
    assert lines[0].startswith("On retina, at 20 rounds: use strong") and "strong vs rival" in lines[1]


def test_fewer_than_three_seeds_decide_nothing():
    b = _base()
    one = {k: v for k, v in _approach(b + 0.1, "x").items()}
    one["final_by_seed"] = {0: one["final_by_seed"][0]}
    one["per_image_by_seed"] = {0: one["per_image_by_seed"][0]}
    got = rank({"x": one, "fedavg": _approach(b, "fedavg")}, {}, SITES)
    assert got["use"] == "x" and "fewer than 3 seeds" in got["why"]
    assert not rule_verdict(one, _approach(b, "fedavg"), SITES, "dice")["beats"]
    assert rank({"fedavg": _approach(b, "fedavg")}, {}, SITES) is None


def test_glance_adds_the_best_baseline_of_a_recorded_bench():
    """The built-in polyp record: the best baseline is the non-published approach with the highest mean Dice,
    computed here from the raw run records with numpy."""
    import json
    from pathlib import Path

    from benchmarks.core.tables import PUBLISHED_METHODS, approach_title, glance_rows

    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "polyp"
    results = json.loads((folder / "results.json").read_text())
    by_label = {}
    for path in sorted((folder / "runs").glob("*.json")):
        run = json.loads(path.read_text())
        if run["kind"] == "method" and run["method"] not in PUBLISHED_METHODS and run["label"] != "fedavg":
            sites = run["final"]["global"]
            by_label.setdefault(run["label"], []).append(np.mean([sites[s]["dice"] for s in results["sites"]]))
    best = max(by_label, key=lambda k: np.mean(by_label[k]))
    rows = glance_rows(results, "polyp", "polyp-accuracy")
    assert rows[-1][0] == "best baseline: " + approach_title(results["approaches"][best])
    assert rows[-1][2].startswith(f"{np.mean(by_label[best]):.3f} ± {np.std(by_label[best], ddof=1):.3f}")
    published = [r[0] for r in rows[:-1]]
    assert all(not r.startswith("best baseline") for r in published) and "FVAC" in published


def test_server_step_rows_are_named_by_their_step():
    from benchmarks.core.tables import approach_title

    assert approach_title({"method": "graphfedseg", "label": "graphfedseg+m",
                           "variant_args": {"server_optimizer": "sgd-momentum"}}) == "GraphFedSeg + server momentum"
    assert approach_title({"method": "fedevi", "label": "x", "variant_args": {"server_optimizer": "adam", "server_lr": 0.01}}
                          ) == "FedEvi + server Adam (server_lr=0.01)"
