"""Every method on three-class data (built-in ``fundus``: background / rim / cup, regions disc and cup) in NVFlare's
simulator: per-class and per-region metrics in report.json and each site's per-image file, the methods' statistics
finite, and only scalar metrics in the evaluation results (privacy audit). Reads the shared runs ``<method>_fundus``
(``tests/sim_utils.py``)."""

from __future__ import annotations

import math

import pytest

from fedseg.bench.runs import read_site_per_image
from sim_utils import MULTICLASS_METHODS

STRUCTURES = ("rim", "cup", "disc")
EXPECTED = {"dice", "hd95", "assd"} | {f"{m}:{s}" for m in ("dice", "hd95", "assd") for s in STRUCTURES}
PARAMS = [pytest.param(m, marks=pytest.mark.shared_runs(f"{m}_fundus"), id=m) for m in MULTICLASS_METHODS]


@pytest.mark.parametrize("method", PARAMS)
def test_reports_every_class_and_region(method, shared_runs):
    run = shared_runs(f"{method}_fundus")
    report = run.report
    cfg = report["config"]["train_config"]
    assert cfg["num_classes"] == 3 and cfg["labels"] == {"background": 0, "rim": 1, "cup": 2}
    models = ["global"] + (["personalized"] if report["final"].get("personalized") else [])
    if method == "graphfedseg":
        assert models == ["global", "personalized"]
    for model in models:
        for site in run.sites:
            final = report["final"][model][site]
            assert EXPECTED <= set(final), (method, model, sorted(final))
            assert all(math.isfinite(final[k]) for k in EXPECTED)
            rows = read_site_per_image(run.workspace, site, model)
            assert rows and all(EXPECTED | {"id"} <= set(r) for r in rows)
            # the site's means are the means of its per-image rows
            for key in ("dice", "dice:cup", "hd95:disc"):
                assert final[key] == pytest.approx(sum(r[key] for r in rows) / len(rows), rel=1e-6)


@pytest.mark.parametrize("method", PARAMS)
def test_method_statistics_and_privacy(method, shared_runs):
    run = shared_runs(f"{method}_fundus")
    for r in run.report["rounds"]:
        assert all(0.0 <= r["metrics"][s]["val_dice"] <= 1.0 for s in run.sites)
        if method == "fedevi":
            assert all(r[k][s] >= 0 and math.isfinite(r[k][s]) for k in ("G", "A", "R") for s in run.sites)
        if method == "graphfedseg":
            # vacuity C / S lies in (0, 1] for any number of classes
            assert all(0 < r["uncertainty"][s] <= 1 for s in run.sites)
    for record in run.audit():
        if record["task"] == "evaluate":
            assert record["params"] == {}
            items = record["meta"]["initial_metrics"]["items"]
            assert EXPECTED <= set(items) and all(v["type"] in ("float", "int") for v in items.values())
