"""The methods on built-in 3-D MR volumes (``prostate3d``: two zones, sites with their own spacing and orientation)
in NVFlare's simulator, as a 3-D network on 3-D patches and as a 2-D network on the slices. Per (method, mode), one
shared run ``<method>_<mode>3d`` (``tests/sim_utils.py``): per-volume metrics per zone and region, in mm, in
report.json and the sites' per-image files, and the job's volume settings in the checkpoint that ``fedseg infer``
reads."""

from __future__ import annotations

import math

import pytest
import torch

from fedseg.bench.runs import read_site_per_image
from sim_utils import VOLUME_RUNS

EXPECTED = {"dice", "hd95_mm", "assd_mm"} | {f"{m}:{s}" for m in ("dice", "hd95_mm") for s in ("pz", "tz", "prostate")}
PARAMS = [pytest.param(m, mode, marks=pytest.mark.shared_runs(f"{m}_{mode}3d"), id=f"{m}-{mode}") for m, mode in VOLUME_RUNS]


@pytest.mark.parametrize("method,mode", PARAMS)
def test_per_volume_metrics_in_mm(method, mode, shared_runs):
    run = shared_runs(f"{method}_{mode}3d")
    cfg = run.report["config"]["train_config"]
    assert cfg["spatial_dims"] == 3 and cfg["spatial_mode"] == mode and cfg["num_classes"] == 3
    for site in run.sites:
        final = run.report["final"]["global"][site]
        assert EXPECTED <= set(final), sorted(final)
        assert all(math.isfinite(final[k]) for k in EXPECTED)
        rows = read_site_per_image(run.workspace, site)
        assert rows and all(r["id"].endswith(".nii.gz") for r in rows)
        assert final["dice:prostate"] == pytest.approx(sum(r["dice:prostate"] for r in rows) / len(rows), rel=1e-6)


@pytest.mark.parametrize("method,mode", PARAMS)
def test_checkpoint_records_the_volume_settings(method, mode, shared_runs):
    run = shared_runs(f"{method}_{mode}3d")
    (path,) = run.run_dir.rglob("FL_global_model.pt")
    cfg = torch.load(path, map_location="cpu", weights_only=True)["train_config"]
    assert cfg["spatial_dims"] == 3 and cfg["spatial_mode"] == mode and cfg["target_spacing"] and cfg["modality"] == "MR"
    if method == "graphfedseg":
        assert all(0 < r["uncertainty"][s] <= 1 for r in run.report["rounds"] for s in run.sites)
