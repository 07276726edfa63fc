"""The methods on built-in 3-D MR volumes (``prostate3d``: two zones, sites with their own spacing and orientation),
as a 3-D network on 3-D patches and as a 2-D network on the slices: per-volume metrics per zone and region, in mm, in
report.json and the sites' per-image files. Each (method, mode) runs the real server workflow with in-process sites
(``fedseg.bench.inprocess``); GraphFedSeg on 3-D patches also runs through NVFlare's simulator (shared run
``graphfedseg_patch3d``, ``tests/sim_utils.py``), where the checkpoint ``fedseg infer`` reads must carry the job's
volume settings."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedseg.bench.runs import read_site_per_image
from inprocess import builtin_sites, run_in_process
from sim_utils import VOLUME_FIELDS, VOLUME_RUNS

SITES = ("site-1", "site-2")
EXPECTED = {"dice", "hd95_mm", "assd_mm"} | {f"{m}:{s}" for m in ("dice", "hd95_mm") for s in ("pz", "tz", "prostate")}


@pytest.fixture(scope="module")
def volume_sites(tmp_path_factory):
    return builtin_sites("prostate3d", SITES, tmp_path_factory.mktemp("prostate3d"))


def check_volume_run(method: str, mode: str, report: dict, workspace: Path) -> None:
    cfg = report["config"]["train_config"]
    assert cfg["spatial_dims"] == 3 and cfg["spatial_mode"] == mode and cfg["num_classes"] == 3
    for site in SITES:
        final = report["final"]["global"][site]
        assert EXPECTED <= set(final), sorted(final)
        assert all(math.isfinite(final[k]) for k in EXPECTED)
        rows = read_site_per_image(workspace, site)
        assert rows and all(r["id"].endswith(".nii.gz") for r in rows)
        assert final["dice:prostate"] == pytest.approx(sum(r["dice:prostate"] for r in rows) / len(rows), rel=1e-6)
    if method == "graphfedseg":
        assert all(0 < r["uncertainty"][s] <= 1 for r in report["rounds"] for s in SITES)


@pytest.mark.parametrize("method,mode", list(VOLUME_RUNS), ids=[f"{m}-{mode}" for m, mode in VOLUME_RUNS])
def test_method_on_volumes(method, mode, volume_sites, tmp_path):
    report = run_in_process(method, volume_sites, tmp_path, num_rounds=1, local_epochs=1, data_family="prostate3d",
                            spatial_mode=mode, **VOLUME_FIELDS, **VOLUME_RUNS[(method, mode)])
    check_volume_run(method, mode, report, tmp_path / "sites")


@pytest.mark.shared_runs("graphfedseg_patch3d")
def test_graphfedseg_on_volumes_in_the_simulator(shared_runs):
    run = shared_runs("graphfedseg_patch3d")
    check_volume_run("graphfedseg", "patch", run.report, run.workspace)
    (path,) = run.run_dir.rglob("FL_global_model.pt")
    cfg = torch.load(path, map_location="cpu", weights_only=True)["train_config"]
    assert cfg["spatial_dims"] == 3 and cfg["spatial_mode"] == "patch" and cfg["target_spacing"] and cfg["modality"] == "MR"
