"""FedEFM phase 2: the downstream job fine-tunes a UNETR whose encoder the *server* loads from the
foundation checkpoint (sites receive the weights), federated with FedAvg; reports Dice, Jaccard, mIoU."""

from __future__ import annotations

import json

import pytest
import torch

from fedseg.foundation.networks import INPUT_MEAN, INPUT_STD, PATCH_CONV, build_vit, fold_input_standardisation, unetr_key_map
from fedseg.foundation.unetr import FoundationUNETR
from fedseg.recipes.export import export_job
from sim_utils import run_simulator


def write_foundation(path):
    """A tiny 3-channel foundation ViT at 96 px (the downstream default), saved like the FL server does; returns
    its state dict."""
    vit = build_vit("tiny", in_channels=3, num_classes=12, init_seed=5)
    with torch.no_grad():
        for p in vit.parameters():
            p.add_(0.01 * torch.randn_like(p))
    torch.save({"model": vit.state_dict(), "train_config": {"task": "classification"}}, path)
    return vit.state_dict()


@pytest.fixture(scope="module")
def foundation(tmp_path_factory):
    path = tmp_path_factory.mktemp("foundation") / "FL_global_model.pt"
    return path, write_foundation(path)


def downstream_run(root):
    """Shared run ``fedefm_downstream`` (tests/sim_utils.py): a foundation checkpoint written here, the downstream job
    exported from it; the background worker runs it with 2 sites and the readers get the report."""
    path = root / "FL_global_model.pt"
    write_foundation(path)
    job = export_job("fedefm_downstream", root / "jobs", profile="tiny", foundation_ckpt=str(path))
    return lambda: run_simulator(job, root / "ws", n_clients=2)


def _persistor_model(job):
    server = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    persistor = next(c for c in server["components"] if c["id"] == "persistor")
    return persistor["args"]["model"]


def test_server_builds_the_initial_model_from_the_foundation(foundation, tmp_path):
    path, vit_state = foundation
    job = export_job("fedefm_downstream", tmp_path / "jobs", profile="tiny", foundation_ckpt=str(path))
    model = _persistor_model(job)
    assert model["path"] == "fedseg.foundation.unetr.FoundationUNETR"
    assert model["args"]["foundation_ckpt"] == str(path) and model["args"]["in_channels"] == 3
    # what the server's persistor instantiates from that config: encoder tensors equal the foundation's
    unetr = FoundationUNETR(**model["args"])
    mapping, dropped = unetr_key_map(vit_state)
    target = unetr.state_dict()
    assert mapping and set(dropped) == {"vit.cls_token", "vit.classification_head.weight", "vit.classification_head.bias"}
    folded = fold_input_standardisation(
        vit_state[PATCH_CONV + ".weight"], vit_state[PATCH_CONV + ".bias"], INPUT_MEAN, INPUT_STD
    )
    expected = {**{dst: vit_state[src] for src, dst in mapping.items()}, PATCH_CONV + ".weight": folded[0], PATCH_CONV + ".bias": folded[1]}
    for dst, tensor in expected.items():
        assert torch.equal(target[dst], tensor), dst
    # the site's train_config never needs the file (it gets the weights with its first task)
    cfg = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    assert "unetr_seg" in json.dumps(cfg)


def test_scratch_has_no_foundation_and_bad_paths_are_refused(tmp_path):
    job = export_job("fedefm_downstream", tmp_path / "jobs", profile="tiny")
    assert _persistor_model(job)["args"].get("foundation_ckpt") in (None, "")
    with pytest.raises(FileNotFoundError, match="absolute"):
        export_job("fedefm_downstream", tmp_path / "jobs2", profile="tiny", foundation_ckpt="relative/model.pt")
    with pytest.raises(FileNotFoundError):
        export_job("fedefm_downstream", tmp_path / "jobs3", profile="tiny", foundation_ckpt=str(tmp_path / "missing.pt"))


@pytest.mark.shared_runs("fedefm_downstream")
def test_downstream_job_in_the_simulator(shared_runs):
    report = shared_runs("fedefm_downstream")
    assert report["method"] == "fedefm_downstream" and report["config"]["strategy"] == "fedavg"
    for site, final in report["final"]["global"].items():
        assert {"dice", "iou", "miou", "hd95", "assd"} <= set(final)
        assert 0.0 <= final["iou"] <= final["dice"] <= 1.0  # Jaccard <= Dice for the same masks


def test_a_seeded_foundation_unetr_is_monais_unetr_from_that_seed_without_touching_the_global_rng():
    from monai.networks.nets import UNETR

    args = dict(in_channels=3, out_channels=2, img_size=32, hidden_size=48, mlp_dim=96, num_heads=3, feature_size=8)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    model = FoundationUNETR(**args, init_seed=7)
    assert torch.equal(torch.rand(1), before)  # a seeded build draws nothing from the global generator
    torch.manual_seed(7)
    reference = UNETR(**{**args, "img_size": (32, 32)}, proj_type="conv", norm_name="instance", spatial_dims=2).state_dict()
    state = model.state_dict()
    assert state.keys() == reference.keys()
    for key, value in reference.items():
        assert state[key].device.type == "cpu" and torch.equal(state[key], value), key
