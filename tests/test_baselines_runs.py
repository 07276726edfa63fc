"""Every baseline end to end: the real server workflow with in-process sites (``fedseg.bench.inprocess``: the
controller, the sites' objectives and the report as in a job, without NVFlare's transport; about a second a run) for
each of the ten, and SCAFFOLD, the one whose payload carries more than the weights, once through NVFlare's
simulator (shared run ``scaffold``, ``tests/sim_utils.py``). Tiny profile, 2 sites, 2 rounds so that round-to-round
site state is exercised; all checks on each run: the report, what left the sites (privacy audit), the bytes of extra payloads,
and the personalised / cross-site evaluation of the personalised methods."""

from __future__ import annotations

import math

import pytest

from fedseg.fl.protocol import SPATIAL_KEY
from fedseg.methods import BASELINES
from fedseg.objectives.registry import build_objective
from fedseg.recipes.base import build_initial_network
from inprocess import builtin_sites, run_in_process

SITES = ["site-1", "site-2"]
BASE_META = {"initial_metrics", "n_samples", "round", "task_clock", SPATIAL_KEY}
#: method -> (per-round report fields, personalised, method options)
METHODS = {
    "fedprox": ((), False, {}),
    "scaffold": (("control_norm",), False, {}),
    "fedadam": (("average_update_norm", "server_lr"), False, {}),
    "fedavgm": (("average_update_norm", "server_lr"), False, {}),
    "fedbn": (("local_entries",), True, {}),
    "ditto": ((), True, {}),
    "fedrep": (("local_entries",), True, {}),
    "moon": ((), False, {}),
    "feddyn": (("h_norm",), False, {}),
    "fedce": (("fedce_minus_val", "fedce_cosine_mean"), False, {}),
}


def _bytes(state):
    return sum(v.numel() * v.element_size() for v in state.values())


assert set(METHODS) == set(BASELINES)


def check_baseline_run(method, report, records):
    """Every check of one baseline's run: ``report`` (report.json) and ``records``, what each site sent per task
    (``task``, ``params`` and ``meta`` names: the privacy audit of a simulator run, or what an in-process site answered)."""
    fields, personalised, _ = METHODS[method]
    assert report["method"] == method and report["clients"] == SITES
    assert [r["round"] for r in report["rounds"]] == [0, 1]
    cfg = report["config"]["train_config"]
    model = build_initial_network(cfg)
    state, params = model.state_dict(), dict(model.named_parameters())
    for r in report["rounds"]:
        assert r["missing"] == [] and r["rejected"] == {}, r
        assert all(f in r for f in fields), (fields, sorted(r))
        for s in SITES:
            assert math.isfinite(r["metrics"][s]["train_loss"]) and 0.0 <= r["metrics"][s]["val_dice"] <= 1.0
    final = report["final"]
    if personalised:
        assert set(final["personalized"]) == set(SITES)
        cross = final["cross_site"]
        assert cross["models"] == cross["test_sites"] == SITES
        assert [cross["dice"][i][i] for i in range(2)] == [final["personalized"][s]["dice"] for s in SITES]
        assert all(0.0 <= v <= 1.0 for row in cross["dice"] for v in row)
    else:
        assert "personalized" not in final and "cross_site" not in final
    if method in ("fedbn", "fedrep"):
        assert "global" not in final
    else:
        assert all(0.0 <= final["global"][s]["dice"] <= 1.0 for s in SITES)
        if personalised:  # the global model's row of the cross-site matrix is its final evaluation
            assert final["cross_site"]["global"] == [final["global"][s]["dice"] for s in SITES]

    # what left the sites: model entries (SCAFFOLD: and its control delta), declared statistics, nothing else
    objective = build_objective(report["config"]["objective"], **report["config"]["objective_args"])
    local = set(objective.local_state_keys(model)) if method in ("fedbn", "fedrep") else set()
    declared = set(objective.declared_statistics)
    delta = {f"__model__/scaffold_c_delta/{k}" for k in params} if method == "scaffold" else set()
    tasks = {"train": 0, "evaluate": 0, "submit_model": 0}
    for rec in records:
        tasks[rec["task"]] += 1
        assert set(rec["meta"]) <= BASE_META | declared, rec["meta"]
        if rec["task"] == "train":
            assert set(rec["params"]) == (set(state) - local) | delta
            assert set(rec["meta"]) >= declared
        elif rec["task"] == "submit_model":
            assert set(rec["params"]) == set(state)  # the site's whole personalised model, after training
        else:
            assert not rec["params"]
    evaluations = (0 if method in ("fedbn", "fedrep") else 2) + (2 + 2 if personalised else 0)  # global, own, cross
    assert tasks == {"train": 4, "evaluate": evaluations, "submit_model": 2 if method in ("fedbn", "fedrep", "ditto") else 0}

    # bytes: SCAFFOLD's control travels both ways and is counted like the weights
    weights = _bytes({k: v for k, v in state.items() if k not in local})
    for r in report["rounds"]:
        extra = 2 * _bytes(dict(params)) if method == "scaffold" else 0
        assert 2 * weights + extra <= r["bytes_received"] < 2 * weights + extra + 2000
        assert 2 * weights + extra <= r["bytes_sent"] < 2 * weights + extra + 20000


@pytest.fixture(scope="module")
def baseline_sites(tmp_path_factory):
    return builtin_sites("polyp", SITES, tmp_path_factory.mktemp("baseline_data"))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_baseline_run(method, baseline_sites, tmp_path):
    report = run_in_process(method, baseline_sites, tmp_path, num_rounds=2, local_epochs=1)
    check_baseline_run(method, report, report["_controller"].received)


@pytest.mark.shared_runs("scaffold")
def test_scaffold_in_the_simulator(shared_runs):
    """The same checks through NVFlare's transport: SCAFFOLD's control delta travels as an extra model and is
    counted in the round's bytes like the weights."""
    run = shared_runs("scaffold")
    check_baseline_run("scaffold", run.report, run.audit())
