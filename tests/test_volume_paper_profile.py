"""96^3 patches in the ``paper`` profile of a volume job, for the 3-D U-Net and UNETR (``volume_network``).

Shapes at 96^3 are checked on PyTorch's meta device (no memory, no arithmetic); a real training epoch runs UNETR on
small CT-like volumes with a 32 x 32 x 16 patch. Speed and memory at 96^3 are measured by ``benchmarks/gpu/gpu_check.py``
(step ``volume_networks_96``)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from fedseg.bundle import bundle_for_task, load_bundle
from fedseg.config import VOLUME_DEFAULTS, resolve_profile
from fedseg.recipes import paper_protocol
from fedseg.recipes.fedavg import PAPER_PROFILES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "fullsize"))
import fullsize_ct  # noqa: E402


def _network(cfg):
    return load_bundle(bundle_for_task(cfg), cfg).get_parsed_content("network_def", instantiate=True, lazy=False)


@pytest.mark.parametrize("kind,name", [("unet", "FeatureUNet"), ("unetr", "UNETR")])
def test_paper_profile_trains_volumes_on_96_cubed_patches(kind, name):
    cfg = resolve_profile("paper", PAPER_PROFILES, spatial_dims=3, spatial_mode="patch", volume_network=kind,
                          num_classes=3, in_channels=1)["train_config"]
    assert cfg["patch_size"] == [96, 96, 96]
    with torch.device("meta"):
        network = _network(cfg)
        out = network(torch.empty(2, 1, 96, 96, 96))
    assert type(network).__name__ == name and tuple(out.shape) == (2, 3, 96, 96, 96)
    # the other profiles keep the small volume patches; slices keep their 2-D side
    assert resolve_profile("default", spatial_dims=3, spatial_mode="patch")["train_config"]["patch_size"] == VOLUME_DEFAULTS["patch_size"]
    assert resolve_profile("paper", PAPER_PROFILES, spatial_dims=3, spatial_mode="slices")["train_config"]["patch_size"] != [96, 96, 96]


def test_a_volume_benchs_paper_protocol_has_the_volume_patches():
    assert paper_protocol("fedavg", 3, "patch")["train_config"]["patch_size"] == [96, 96, 96]
    assert paper_protocol("fedavg")["train_config"]["patch_size"] == 64  # images: as before


def test_unetr_needs_patches_in_multiples_of_16():
    cfg = resolve_profile("default", spatial_dims=3, spatial_mode="patch", volume_network="unetr", patch_size=[64, 64, 24])
    for train_config, message in ((cfg["train_config"], "multiples of 16"),
                                  ({**cfg["train_config"], "volume_network": "vnet"}, "volume_network")):
        with pytest.raises(RuntimeError) as raised:  # MONAI's config parser wraps the network builder's error
            _network(train_config)
        assert isinstance(raised.value.__cause__, ValueError) and message in str(raised.value.__cause__)


def test_the_engine_trains_unetr_on_volumes(tmp_path):
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import ClientObjective, RoundContext

    spacing = (8.0, 8.0, 10.0)
    datalist = fullsize_ct.generate(tmp_path, 4, (48, 40, 12), spacing, target_spacing=spacing)
    cfg = fullsize_ct.job_config(datalist, target_spacing=list(spacing), volume_network="unetr", patch_size=[32, 32, 16],
                                 batch_size=1)
    engine = SegEngine("site-1", datalist, cfg, device=torch.device("cpu"))
    model = engine.build_network()
    assert type(model).__name__ == "UNETR"
    out = engine.train(model, ClientObjective(), RoundContext("site-1", 0, 1, train_config=engine.train_config))
    assert math.isfinite(out["train_loss"]) and out["steps"] == 2
