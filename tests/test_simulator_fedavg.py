"""FedAvg end to end in NVFlare's real simulator on tiny built-in vessel data (3 sites, 2 rounds, 16 px patches of
native-resolution images, whole-image evaluation): the shared ``fedavg`` run (tests/README.md). A site with broken
data is in ``test_simulator_faults.py``, FedAvg in resize mode there and in ``test_payload_precision.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedseg.engine import SegEngine
from fedseg.recipes.base import build_initial_network
from sim_utils import read_audit

pytestmark = pytest.mark.shared_runs("fedavg")

SITES = ["site-1", "site-2", "site-3"]


@pytest.fixture(scope="module")
def fedavg_run(shared_runs):
    run = shared_runs("fedavg")
    return run.workspace, run.report


def test_report_structure(fedavg_run):
    _, report = fedavg_run
    assert report["method"] == "fedavg"
    assert report["clients"] == SITES
    assert report["config"]["num_rounds"] == 2 and report["config"]["train_config"]["image_size"] == 32
    assert [r["round"] for r in report["rounds"]] == [0, 1]
    for r in report["rounds"]:
        assert r["missing"] == [] and r["rejected"] == {}
        for site in SITES:
            m = r["metrics"][site]
            assert math.isfinite(m["train_loss"]) and 0.0 <= m["val_dice"] <= 1.0
        assert sum(r["aggregation_weight"].values()) == pytest.approx(1.0)
        assert set(r["task_times"]) == {"train"} and 0 < r["task_times"]["train"] <= r["wall_time"]
        # one clock (one machine): each part of a site's round trip is non-negative and they fit in the task
        parts = r["task_breakdown"]["train"]
        assert parts["answers"] == 3 and parts["total"] == r["task_times"]["train"]
        assert all(parts[k] >= -0.01 for k in ("deliver", "site", "return"))
        assert parts["deliver"] + parts["site"] + parts["return"] <= parts["total"] + 0.01
        # the site's own work includes its training
        assert parts["site"] >= min(r["metrics"][s]["compute_time"] for s in SITES) - 0.01
    for site in SITES:
        final = report["final"]["global"][site]
        assert set(final) == {"dice", "hd95", "assd"} and all(math.isfinite(v) for v in final.values())
    run_dir = Path(report["_path"]).parent
    assert (run_dir / "summary.md").is_file() and (run_dir / "plots" / "val_dice.png").is_file()
    assert list((run_dir / "tb_events").rglob("events.out.tfevents*")), "no TensorBoard events from tracking"


def test_global_model_changed_and_beats_untrained(fedavg_run):
    ws, report = fedavg_run
    cfg = report["config"]["train_config"]
    initial = build_initial_network(cfg)
    saved = next(ws.rglob("FL_global_model.pt"))
    saved_ckpt = torch.load(saved, map_location="cpu", weights_only=False)
    trained_state = saved_ckpt["model"]
    # the job left the spatial mode to the sites' datalists: the built-in vessel data declares patch, and the
    # saved model records it (fedseg infer runs it that way without being told)
    assert cfg["spatial_mode"] is None
    assert saved_ckpt["train_config"]["spatial_mode"] == "patch" and saved_ckpt["train_config"]["rescale"] == 1.0
    changed = [k for k, v in initial.state_dict().items() if not torch.allclose(v, torch.as_tensor(trained_state[k]))]
    assert changed, "the global model did not change"

    untrained = []
    for site in SITES:
        datalist = next((ws / site).rglob("datalist.json"))
        untrained.append(SegEngine(site, datalist, cfg).evaluate(initial, "test", metrics=("dice",))["dice"])
    final = [report["final"]["global"][s]["dice"] for s in SITES]
    assert sum(final) / 3 > sum(untrained) / 3 + 0.05, (final, untrained)


def test_only_parameters_and_declared_statistics_left_the_sites(fedavg_run):
    _, report = fedavg_run
    model_keys = set(build_initial_network(report["config"]["train_config"]).state_dict())
    records = read_audit(report)
    assert {r["site"] for r in records} == set(SITES)
    assert sorted(r["task"] for r in records) == sorted(["train"] * 6 + ["evaluate"] * 3)
    for r in records:
        assert set(r["meta"]) <= {"initial_metrics", "n_samples", "round", "task_clock", "spatial"}, r["meta"]
        metrics = r["meta"]["initial_metrics"]["items"]
        assert all(v["type"] in ("float", "int") for v in metrics.values()), metrics
        if r["task"] == "train":
            assert set(r["params"]) == model_keys
            # the site's spatial settings (patch?, rescale): two numbers, no data
            assert r["meta"]["spatial"] == {"type": "list", "length": 2}
            assert set(metrics) == {"train_loss", "val_dice", "steps", "compute_time", "peak_memory_mb"}
            assert r["meta"]["n_samples"]["type"] == "int"
        else:
            assert r["params"] == {} and set(metrics) == {"dice", "hd95", "assd"}
    # nothing image-shaped anywhere: every tensor that arrived is a model parameter
    for r in records:
        for name, desc in r.get("params", {}).items():
            assert name in model_keys


def test_site_outputs_stay_at_the_site(fedavg_run):
    ws, report = fedavg_run
    for site in SITES:
        assert (ws / site / "fedseg_outputs" / site / "overlays_global.png").is_file()
    server_files = [p.name for p in (ws / "server").rglob("*.png")]
    assert not any(name.startswith("overlays") for name in server_files)
