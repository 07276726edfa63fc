"""FedAvg of a tiny ViT classifier (task classification) end to end in NVFlare's simulator: 2 sites with
their own classification datalists, 2 rounds, 32 px (the shared ``classification`` run, tests/README.md). The
server builds the round-0 ViT from bundles/vit_foundation, the sites the same network through the
classification engine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sim_utils import read_audit

pytestmark = pytest.mark.shared_runs("classification")

SITES = ["site-1", "site-2"]


@pytest.fixture(scope="module")
def classification_run(shared_runs):
    return shared_runs("classification").report


def test_report_has_accuracy_per_site(classification_run):
    report = classification_run
    assert report["clients"] == SITES and report["config"]["train_config"]["task"] == "classification"
    for r in report["rounds"]:
        assert r["missing"] == [] and r["rejected"] == {}
        for site in SITES:
            m = r["metrics"][site]
            assert math.isfinite(m["train_loss"]) and 0.0 <= m["val_accuracy"] <= 1.0 and "val_dice" not in m
    for site in SITES:
        final = report["final"]["global"][site]
        assert 0.0 <= final["accuracy"] <= 1.0 and 0.0 <= final["balanced_accuracy"] <= 1.0
        assert {"accuracy_class_0", "accuracy_class_1"} <= set(final)
    run_dir = Path(report["_path"]).parent
    summary = (run_dir / "summary.md").read_text()
    assert "Validation accuracy per round" in summary and "| Accuracy | Balanced accuracy |" in summary
    assert (run_dir / "plots" / "val_accuracy.png").is_file()


def test_only_weights_and_scalars_left_the_sites(classification_run):
    from fedseg.recipes.base import build_initial_network

    report = classification_run
    model_keys = set(build_initial_network(report["config"]["train_config"]).state_dict())
    assert any(k.startswith("vit.blocks.") for k in model_keys)  # the server's model is the ViT
    records = read_audit(report)
    assert sorted(r["task"] for r in records) == sorted(["train"] * 4 + ["evaluate"] * 2)
    for r in records:
        assert set(r["meta"]) <= {"initial_metrics", "n_samples", "round", "task_clock"}, r["meta"]
        metrics = r["meta"]["initial_metrics"]["items"]
        assert all(v["type"] in ("float", "int") for v in metrics.values()), metrics
        if r["task"] == "train":
            assert set(r["params"]) == model_keys
        else:
            assert r["params"] == {} and {"accuracy", "balanced_accuracy"} <= set(metrics)
    # per-image predictions stayed in each site's workspace
    ws = Path(report["_path"]).parents[2]
    for site in SITES:
        rows = json.loads((ws / site / "fedseg_outputs" / site / "per_image_global.json").read_text())["rows"]
        assert len(rows) == 4 and "prediction" in rows[0]
