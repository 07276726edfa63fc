"""The methods on built-in 3-D MR volumes (``prostate3d``: two zones, sites with their own spacing and orientation)
in NVFlare's simulator, as a 3-D network on 3-D patches and as a 2-D network on the slices. One small run per
(method, mode): per-volume metrics per zone and region, in mm, in report.json and the sites' per-image files, and
the job's volume settings in the checkpoint that ``fedseg infer`` reads."""

from __future__ import annotations

import math

import pytest
import torch

from fedseg.bench.runs import read_site_per_image
from fedseg.cli import export_job
from fedseg.data.checks import check_federation
from sim_utils import run_simulator

pytestmark = pytest.mark.slow
SITES = ["site-1", "site-2"]
EXPECTED = {"dice", "hd95_mm", "assd_mm"} | {f"{m}:{s}" for m in ("dice", "hd95_mm") for s in ("pz", "tz", "prostate")}
RUNS = {
    ("fedevi", "patch"): {},
    ("graphfedseg", "patch"): {},
    ("fvac", "patch"): {"local_epochs": 1},
    ("fedavg", "slices"): {"slice_foreground_only": True},
    ("pathfl", "slices"): {},
}


@pytest.fixture(scope="module", params=sorted(RUNS), ids=lambda p: f"{p[0]}-{p[1]}")
def run(request, tmp_path_factory):
    method, mode = request.param
    tmp = tmp_path_factory.mktemp(f"{method}_{mode}")
    fields = check_federation(family="prostate3d", explicit={"data_profile": "tiny"})
    job = export_job(method, tmp / "jobs", profile="tiny", num_rounds=1, data_family="prostate3d", spatial_mode=mode,
                     **fields, **RUNS[request.param])
    return method, mode, run_simulator(job, tmp / "ws", clients=SITES), tmp / "ws"


def test_per_volume_metrics_in_mm(run):
    method, mode, report, workspace = run
    cfg = report["config"]["train_config"]
    assert cfg["spatial_dims"] == 3 and cfg["spatial_mode"] == mode and cfg["num_classes"] == 3
    for site in SITES:
        final = report["final"]["global"][site]
        assert EXPECTED <= set(final), sorted(final)
        assert all(math.isfinite(final[k]) for k in EXPECTED)
        rows = read_site_per_image(workspace, site)
        assert rows and all(r["id"].endswith(".nii.gz") for r in rows)
        assert final["dice:prostate"] == pytest.approx(sum(r["dice:prostate"] for r in rows) / len(rows), rel=1e-6)


def test_checkpoint_records_the_volume_settings(run):
    method, mode, report, _ = run
    from pathlib import Path

    (path,) = Path(report["_path"]).parent.rglob("FL_global_model.pt")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    cfg = ckpt["train_config"]
    assert cfg["spatial_dims"] == 3 and cfg["spatial_mode"] == mode and cfg["target_spacing"] and cfg["modality"] == "MR"
    if method == "graphfedseg":
        assert all(0 < r["uncertainty"][s] <= 1 for r in report["rounds"] for s in SITES)
