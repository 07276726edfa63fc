"""Every method on three-class data (built-in ``fundus``: background / rim / cup, regions disc and cup): per-class and
per-region metrics in report.json and each site's per-image file, and the methods' statistics finite. Each method runs
the real server workflow with in-process sites (``fedseg.bench.inprocess``: controller, objectives, evaluation and
report as in a job, without NVFlare's transport); FedEvi (two tasks a round) also runs through NVFlare's simulator
(shared run ``fedevi_fundus``, ``tests/sim_utils.py``), where the privacy audit shows that only scalar metrics left
the sites in the evaluation results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedseg.bench.runs import read_site_per_image
from fedseg.data.checks import federation_label_config
from inprocess import builtin_sites, run_in_process
from sim_utils import MULTICLASS_METHODS

SITES = ("site-1", "site-2")
STRUCTURES = ("rim", "cup", "disc")
EXPECTED = {"dice", "hd95", "assd"} | {f"{m}:{s}" for m in ("dice", "hd95", "assd") for s in STRUCTURES}


@pytest.fixture(scope="module")
def fundus_sites(tmp_path_factory):
    return builtin_sites("fundus", SITES, tmp_path_factory.mktemp("fundus"))


def check_multiclass_run(method: str, report: dict, workspace: Path) -> None:
    """Per-class / per-region finals (global and personalised), per-image rows whose means are the finals, and each
    method's statistics in range."""
    cfg = report["config"]["train_config"]
    assert cfg["num_classes"] == 3 and cfg["labels"] == {"background": 0, "rim": 1, "cup": 2}
    models = ["global"] + (["personalized"] if report["final"].get("personalized") else [])
    if method == "graphfedseg":
        assert models == ["global", "personalized"]
    for model in models:
        for site in SITES:
            final = report["final"][model][site]
            assert EXPECTED <= set(final), (method, model, sorted(final))
            assert all(math.isfinite(final[k]) for k in EXPECTED)
            rows = read_site_per_image(workspace, site, model)
            assert rows and all(EXPECTED | {"id"} <= set(r) for r in rows)
            # the site's means are the means of its per-image rows
            for key in ("dice", "dice:cup", "hd95:disc"):
                assert final[key] == pytest.approx(sum(r[key] for r in rows) / len(rows), rel=1e-6)
    for r in report["rounds"]:
        assert all(0.0 <= r["metrics"][s]["val_dice"] <= 1.0 for s in SITES)
        if method == "fedevi":
            assert all(r[k][s] >= 0 and math.isfinite(r[k][s]) for k in ("G", "A", "R") for s in SITES)
        if method == "graphfedseg":
            # vacuity C / S lies in (0, 1] for any number of classes
            assert all(0 < r["uncertainty"][s] <= 1 for s in SITES)


@pytest.mark.parametrize("method", MULTICLASS_METHODS)
def test_method_on_three_classes(method, fundus_sites, tmp_path):
    report = run_in_process(method, fundus_sites, tmp_path, num_rounds=1, local_epochs=1, data_family="fundus",
                            **federation_label_config(family="fundus"))
    check_multiclass_run(method, report, tmp_path / "sites")


@pytest.mark.shared_runs("fedevi_fundus")
def test_fedevi_on_three_classes_in_the_simulator(shared_runs):
    run = shared_runs("fedevi_fundus")
    check_multiclass_run("fedevi", run.report, run.workspace)
    evaluations = [rec for rec in run.audit() if rec["task"] == "evaluate"]
    assert evaluations
    for record in evaluations:
        assert record["params"] == {}
        items = record["meta"]["initial_metrics"]["items"]
        assert EXPECTED <= set(items) and all(v["type"] in ("float", "int") for v in items.values())
