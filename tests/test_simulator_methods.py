"""FedEvi, FVAC and GraphFedSeg end to end in NVFlare's simulator on tiny built-in data: each method's shared
run (tests/README.md; FedEvi and GraphFedSeg on vessel data, i.e. patch mode, GraphFedSeg with DP-SGD)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sim_utils import read_audit

SITES = ["site-1", "site-2", "site-3"]


@pytest.mark.shared_runs("fedevi")
def test_fedevi_two_phase_round(shared_runs):
    report = shared_runs("fedevi").report
    assert report["method"] == "fedevi"
    cfg = report["config"]
    assert cfg["delta"] == 1.0 and cfg["weight_form"] == "code" and cfg["beta0"] == "samples"
    previous = None
    for r in report["rounds"]:
        for key in ("beta", "beta_prev", "G", "R", "A"):
            assert sorted(r[key]) == SITES, key
        if previous is not None:
            assert r["beta_prev"] == pytest.approx(previous)
        # beta^r = normalise(beta^{r-1} + delta * G * R), code form R = 1 / A
        raw = np.array([r["beta_prev"][s] + cfg["delta"] * r["G"][s] / r["A"][s] for s in SITES])
        expected = np.maximum(raw / raw.sum(), cfg["clip"])
        expected /= expected.sum()
        assert [r["beta"][s] for s in SITES] == pytest.approx(expected.tolist(), abs=1e-9)
        assert [r["R"][s] for s in SITES] == pytest.approx([1 / r["A"][s] for s in SITES])
        # both phases are timed, inside the round's wall time
        assert set(r["task_times"]) == {"train", "evaluate_surrogate"}
        assert sum(r["task_times"].values()) <= r["wall_time"]
        previous = r["beta"]
    for s in SITES:
        assert all(math.isfinite(v) for v in report["final"]["global"][s].values())
    # the surrogate task returned one scalar (G); A and R_paper of the local model left with its weights
    audit = read_audit(report)
    surrogate = [r for r in audit if r["task"] == "evaluate_surrogate"]
    assert len(surrogate) == 3 * len(report["rounds"])
    for rec in surrogate:
        assert rec["params"] == {}
        assert set(rec["meta"]) == {"G", "initial_metrics", "task_clock"}
        assert rec["meta"]["initial_metrics"]["items"] == {}  # no metrics either
        assert rec["meta"]["G"]["type"] == "float"
    train = [r for r in audit if r["task"] == "train"]
    assert len(train) == 3 * len(report["rounds"])
    assert all(rec["meta"][k]["type"] == "float" for rec in train for k in ("A", "R_paper"))


@pytest.mark.shared_runs("fvac")
def test_fvac_uniform_average_and_site_figure(shared_runs):
    run = shared_runs("fvac")
    report = run.report
    assert report["method"] == "fvac"
    assert report["config"]["train_config"]["data_family"] == "vessel"
    assert report["config"]["objective_args"]["beta"] == 2.0
    for r in report["rounds"]:
        assert r["aggregation_weight"] == pytest.approx({s: 1 / 3 for s in SITES})
    for s in SITES:
        assert all(math.isfinite(v) for v in report["final"]["global"][s].values())
        assert (run.site_outputs(s) / "fvac_weight_maps.png").is_file()


def _qp_row_scipy(p, cos_row, u, alpha, gamma):
    """Graph row by a generic constrained optimiser (independent of the project's two solvers)."""
    from scipy.optimize import minimize

    objective = lambda w: np.sum((w - p) ** 2) - alpha * w @ cos_row + gamma * w @ u  # noqa: E731
    res = minimize(
        objective, np.full(len(p), 1 / len(p)), method="SLSQP", bounds=[(0, 1)] * len(p),
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}], options={"ftol": 1e-12, "maxiter": 500},
    )
    return res.x


@pytest.mark.shared_runs("graphfedseg")
def test_graphfedseg_graph_and_personalised_models(shared_runs):
    run = shared_runs("graphfedseg")
    report = run.report
    cfg = report["config"]
    assert cfg["alpha"] == pytest.approx(0.08 * 3) and cfg["gamma"] == 0.4 and cfg["lam"] == 0.2
    assert cfg["lambda1"] == 0.01 and cfg["similarity"] == "update"
    for r in report["rounds"]:
        p = np.array(r["p"])
        cos = np.array(r["cos"])
        u = np.array([r["uncertainty"][s] for s in SITES])
        w = np.array(r["graph"])
        assert p.sum() == pytest.approx(1) and w.shape == (3, 3)
        for i in range(3):
            expected = _qp_row_scipy(p, cos[i], u, cfg["alpha"], cfg["gamma"])
            assert w[i] == pytest.approx(expected, abs=1e-4)
        eff = cfg["lam"] * p + (1 - cfg["lam"]) * w.mean(axis=0)
        assert [r["effective_weight"][s] for s in SITES] == pytest.approx(eff.tolist(), abs=1e-9)
        assert all(0 < r["uncertainty"][s] <= 1 for s in SITES)
    run_dir = run.run_dir
    for s in SITES:
        assert set(report["final"]["personalized"][s]) == {"dice", "hd95", "assd"}
        assert (run_dir / report["final"]["personalized_checkpoints"][s]).is_file()
    assert (run_dir / "plots" / "graph_heatmaps.png").is_file()
    assert (run_dir / "plots" / "effective_weight.png").is_file()
    # the uncertainty statistic is the only extra thing a site sent
    for rec in read_audit(report):
        assert set(rec["meta"]) <= {"initial_metrics", "n_samples", "round", "uncertainty", "task_clock", "spatial"}


@pytest.mark.shared_runs("graphfedseg")
def test_graphfedseg_with_differential_privacy_reports_epsilon(shared_runs):
    report = shared_runs("graphfedseg").report
    assert report["config"]["train_config"]["dp_target_epsilon"] == 10.0
    for s in SITES:
        eps = [r["metrics"][s]["dp_epsilon"] for r in report["rounds"]]
        assert eps[0] < eps[-1] <= 10.0 + 0.05, eps
        assert report["rounds"][-1]["metrics"][s]["dp_delta"] == pytest.approx(1e-5)


@pytest.mark.parametrize("run_name", [pytest.param(n, marks=pytest.mark.shared_runs(n)) for n in ("fedavg", "graphfedseg", "fedevi")])
def test_patch_mode_end_to_end(shared_runs, run_name):
    """Built-in vessel data declares patch mode: training on native-resolution patches, whole-image
    evaluation at each image's own size (FVAC runs on vessel data in its own test above). The runs:
    FedAvg, GraphFedSeg (the uncertainty pass over whole training images by sliding window,
    and DP-SGD on patches), FedEvi (the surrogate evaluation (G, A) on whole validation images)."""
    run = shared_runs(run_name)
    report, sites, method = run.report, run.sites, run.spec.method
    assert report["config"]["train_config"]["data_family"] == "vessel"
    for s in sites:
        assert "spatial mode patch (patches 16 px x" in run.site_log(s)
        assert all(math.isfinite(v) for v in report["final"]["global"][s].values())
        assert 0.0 <= report["final"]["global"][s]["dice"] <= 1.0
    assert "own size" in report["final"]["note"]
    # the sites' datalists chose patch mode: the saved models record it for fedseg infer
    assert run.global_model()["train_config"]["spatial_mode"] == "patch"
    if method == "graphfedseg":
        assert all(0 < r["uncertainty"][s] <= 1 for r in report["rounds"] for s in sites)
        assert all(r["metrics"][s]["dp_epsilon"] > 0 for r in report["rounds"] for s in sites)
        assert set(report["final"]["personalized"]) == set(sites)
        for rel in report["final"]["personalized_checkpoints"].values():
            saved = torch.load(run.run_dir / rel, map_location="cpu", weights_only=True)
            assert saved["train_config"]["spatial_mode"] == "patch"
    if method == "fedevi":
        assert all(r["A"][s] > 0 for r in report["rounds"] for s in sites)
