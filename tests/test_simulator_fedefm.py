"""FedEFM end to end in NVFlare's simulator on tiny built-in X-ray silos (tests/README.md): CFL with the w/o-EMD
switch and the privacy audit (shared run ``fedefm_cfl``), and DFL (ring gossip, the server relays) with EMD
teacher weights (``fedefm_dfl``, also the native half of the executor pair in test_site_executor.py)."""

from __future__ import annotations

import math

import pytest

SITES = ["site-1", "site-2", "site-3"]
RING_HOST = {"site-1": "site-2", "site-2": "site-3", "site-3": "site-1"}  # directed ring: i -> i+1
DECLARED = {"n_samples", "round", "teacher_emd", "teacher_weights", "initial_metrics", "task_clock"}


def _model_names(params):
    """'main' and the extra models' names of an audited result (packed as ``__model__/<name>/...``)."""
    return {k.split("/")[1] if k.startswith("__model__/") else "main" for k in params}


def _check_weights_only(rec, shapes):
    for key, summary in rec["params"].items():
        name = key.split("/", 2)[2] if key.startswith("__model__/") else key
        assert summary["type"] == "Tensor" and summary["shape"] == list(shapes[name]), key


@pytest.mark.shared_runs("fedefm_cfl")
def test_fedefm_cfl_without_emd_report_and_privacy_audit(shared_runs):
    run = shared_runs("fedefm_cfl")
    report = run.report
    assert report["method"] == "fedefm" and report["clients"] == SITES
    cfg = report["config"]
    assert cfg["mode"] == "cfl" and cfg["train_config"]["task"] == "classification"
    assert cfg["train_config"]["num_classes"] == 12
    assert cfg["objective_args"]["use_emd"] is False
    first, last = report["rounds"][0], report["rounds"][-1]
    assert "overseas_train" in first["task_times"]  # experts for round 1 are trained in round 0
    for site in SITES:  # one teacher per silo on a ring; w/o EMD: uniform teacher weights and no EMD computed
        assert last["teacher_weights"][site] == [pytest.approx(1.0)]
        assert site not in (last.get("teacher_emd") or {})
        final = report["final"]["global"][site]
        assert 0.0 <= final["accuracy"] <= 1.0 and math.isfinite(final["balanced_accuracy"])
        assert 0.0 <= last["metrics"][site]["val_accuracy"] <= 1.0

    shapes = {k: tuple(v.shape) for k, v in run.global_model()["model"].items()}
    audit = run.audit()
    by_task = {t: [a for a in audit if a["task"] == t] for t in ("train", "overseas_train", "evaluate")}
    assert len(by_task["train"]) == 3 * len(report["rounds"])
    for rec in by_task["train"]:
        assert set(rec["meta"]) <= DECLARED and _model_names(rec["params"]) == {"main"}
        _check_weights_only(rec, shapes)
    for rec in by_task["overseas_train"]:  # the host returns only the guest it trained, as weights
        guest = next(s for s, host in RING_HOST.items() if host == rec["site"])
        assert _model_names(rec["params"]) == {f"guest@{guest}"}
        assert set(rec["meta"]) <= {"n_samples", "round", "initial_metrics", "task_clock"}
        _check_weights_only(rec, shapes)
    for rec in by_task["evaluate"]:
        assert rec["params"] == {}


@pytest.mark.shared_runs("fedefm_dfl")
def test_fedefm_dfl_ring_gossip_with_emd(shared_runs):
    run = shared_runs("fedefm_dfl")
    report = run.report
    assert report["config"]["mode"] == "dfl" and report["config"]["objective_args"]["use_emd"] is True
    for r in report["rounds"]:
        assert "gossip" in r["task_times"]
    last = report["rounds"][-1]
    for site in SITES:  # one teacher per silo on a ring; its weight is 1 and its EMD a cost in [0, 2]
        assert last["teacher_weights"][site] == [pytest.approx(1.0)]
        assert 0.0 <= last["teacher_emd"][site][0] <= 2.0
    # the only averaging in DFL is the final one (foundation weights)
    assert report["final"]["foundation_weight"] == {s: pytest.approx(1 / 3) for s in SITES}
    audit = run.audit()
    gossip = [a for a in audit if a["task"] == "gossip"]
    assert len(gossip) == 3 * len(report["rounds"])
    assert all(_model_names(a["params"]) == {"main"} for a in gossip)
