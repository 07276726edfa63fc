"""Every method on three-class data (built-in ``fundus``: background / rim / cup, regions disc and cup) in NVFlare's
simulator: per-class and per-region metrics in report.json and each site's per-image file, the methods' statistics
finite, and only scalar metrics in the evaluation results (privacy audit). One small run per method."""

from __future__ import annotations

import math

import pytest

from fedseg.bench.runs import read_site_per_image
from fedseg.cli import export_job
from fedseg.data.labels import federation_label_config
from sim_utils import read_audit, run_simulator

pytestmark = pytest.mark.slow
SITES = ["site-1", "site-2"]
STRUCTURES = ("rim", "cup", "disc")
EXPECTED = {"dice", "hd95", "assd"} | {f"{m}:{s}" for m in ("dice", "hd95", "assd") for s in STRUCTURES}
METHODS = {
    "fedavg": {},
    "fedevi": {},
    "graphfedseg": {},
    "fvac": {},
    "pathfl": {},
    "fedefm_downstream": {},
}


@pytest.fixture(scope="module", params=sorted(METHODS))
def run(request, tmp_path_factory):
    method = request.param
    tmp = tmp_path_factory.mktemp(method)
    job = export_job(method, tmp / "jobs", profile="tiny", num_rounds=1, data_family="fundus",
                     **federation_label_config(family="fundus"), **METHODS[method])
    return method, run_simulator(job, tmp / "ws", clients=SITES), tmp / "ws"


def test_reports_every_class_and_region(run):
    method, report, workspace = run
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


def test_method_statistics_and_privacy(run):
    method, report, _ = run
    for r in report["rounds"]:
        assert all(0.0 <= r["metrics"][s]["val_dice"] <= 1.0 for s in SITES)
        if method == "fedevi":
            assert all(r[k][s] >= 0 and math.isfinite(r[k][s]) for k in ("G", "A", "R") for s in SITES)
        if method == "graphfedseg":
            # vacuity C / S lies in (0, 1] for any number of classes
            assert all(0 < r["uncertainty"][s] <= 1 for s in SITES)
    for record in read_audit(report):
        if record["task"] == "evaluate":
            assert record["params"] == {}
            items = record["meta"]["initial_metrics"]["items"]
            assert EXPECTED <= set(items) and all(v["type"] in ("float", "int") for v in items.values())
