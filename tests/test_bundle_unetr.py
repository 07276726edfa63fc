"""The MONAI bundle ``bundles/unetr_seg`` (FedEFM phase 2): offline metadata and network checks, the
encoder loaded from a foundation checkpoint tensor for tensor (the patch convolution with the
classifier's input standardisation folded in), one epoch of ``train.json`` from a
foundation, and ``fedseg infer --bundle`` / inference.json writing masks at the input size. A 32 px
tiny foundation (4 blocks, ``partial_depth``) keeps it to seconds; the bundle folder stays unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedseg.bundle import load_bundle
from fedseg.data.synthetic import generate_site_data
from fedseg.foundation.networks import INPUT_MEAN, INPUT_STD, PATCH_CONV, build_vit, fold_input_standardisation, unetr_key_map
from test_bundle import _fire_cli, _files, verify_metadata_offline

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "bundles" / "unetr_seg"
CONFIGS = BUNDLE / "configs"
META = CONFIGS / "metadata.json"
TRAIN = CONFIGS / "train.json"

#: 32 px grey images, UNETR input 32 (= the foundation's 2 x 2 tokens)
SMALL = {"image_size": 32, "patch_size": 32, "in_channels": 1}


@pytest.fixture(scope="module", autouse=True)
def bundle_untouched():
    before = _files(BUNDLE)
    yield
    assert _files(BUNDLE) == before, "a test wrote into the bundle folder"


@pytest.fixture(scope="module")
def foundation(tmp_path_factory):
    """A tiny foundation ViT (4 blocks, 32 px, 1 channel) saved the way the FL server saves its global
    model: ``{"model": state_dict, "train_config": ...}``."""
    vit = build_vit("tiny", in_channels=1, num_classes=5, img_size=32, init_seed=3)
    with torch.no_grad():  # not the UNETR's own init: every copied tensor must really come from here
        for p in vit.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("foundation") / "FL_global_model.pt"
    torch.save({"model": vit.state_dict(), "train_config": {"task": "classification", "num_classes": 5}}, path)
    return path, vit.state_dict()


def _network(**variables):
    parser = load_bundle(BUNDLE, SMALL)
    for k, v in variables.items():
        parser[k] = v
    return parser.get_parsed_content("network_def", lazy=False)


def test_verify_metadata_offline():
    assert "metadata is verified with no error" in verify_metadata_offline()[BUNDLE.name]


def test_verify_net_in_out():
    _fire_cli("verify_net_in_out", ["network_def", "--meta_file", str(META), "--config_file", str(TRAIN), "--device", "cpu"])


def test_encoder_equals_foundation(foundation):
    path, state = foundation
    unetr = _network(foundation_ckpt=str(path), partial_depth=True)
    target = unetr.state_dict()
    mapping, dropped = unetr_key_map(state)
    assert sorted(dropped) == ["vit.classification_head.bias", "vit.classification_head.weight", "vit.cls_token"]
    assert any(k.startswith("vit.blocks.3.") for k in mapping.values())
    conv = fold_input_standardisation(state[PATCH_CONV + ".weight"], state[PATCH_CONV + ".bias"], INPUT_MEAN, INPUT_STD)
    expected = {**{dst: state[src] for src, dst in mapping.items()}, PATCH_CONV + ".weight": conv[0], PATCH_CONV + ".bias": conv[1]}
    for dst, tensor in expected.items():  # copied exactly; the patch convolution with the input standardisation folded in
        assert torch.equal(target[dst], tensor), dst
    # blocks beyond the foundation's depth and the decoder keep their fresh weights, deterministically
    fresh = _network()
    for k, v in target.items():
        if k not in mapping.values():
            assert torch.equal(v, fresh.state_dict()[k]), k
    assert not torch.equal(fresh.state_dict()["vit.blocks.0.mlp.linear1.weight"], target["vit.blocks.0.mlp.linear1.weight"])


def _refusal(**variables) -> Exception:
    """The error building the network raised (MONAI wraps it in a RuntimeError naming the component)."""
    with pytest.raises(RuntimeError, match="FoundationUNETR") as info:
        _network(**variables)
    return info.value.__cause__


def test_foundation_refusals(foundation):
    path, _ = foundation
    err = _refusal(foundation_ckpt=str(path))
    assert isinstance(err, ValueError) and "partial_depth" in str(err)
    err = _refusal(foundation_ckpt=str(path), partial_depth=True, hidden_size=192, num_heads=4)
    assert isinstance(err, ValueError) and "hidden_size 96 in the checkpoint vs 192 configured" in str(err)
    err = _refusal(foundation_ckpt=str(path), partial_depth=True, image_size=64, patch_size=64)
    assert isinstance(err, ValueError) and "patch tokens" in str(err)
    assert isinstance(_refusal(foundation_ckpt=str(path.parent / "missing.pt")), FileNotFoundError)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, foundation):
    """One epoch of ``python -m monai.bundle run`` (train.json) starting from the foundation."""
    data = generate_site_data("polyp", "site-1", tmp_path_factory.mktemp("data"), seed=0, profile="tiny")
    out = tmp_path_factory.mktemp("train")
    argv = ["--config_file", str(TRAIN), "--meta_file", str(META), "--logging_file", "False", "--bundle_root", str(BUNDLE),
            "--ckpt_dir", str(out / "models"), "--output_dir", str(out / "eval"), "--datalist", str(data),
            "--foundation_ckpt", str(foundation[0]), "--partial_depth", "True", "--max_epochs", "1", "--batch_size", "4",
            "--image_size", "32", "--patch_size", "32"]  # fmt: skip
    _fire_cli("run", argv)
    return out / "models" / "model.pt", data


def test_train_from_foundation_writes_a_plain_unetr_checkpoint(finetuned):
    ckpt, _ = finetuned
    state = torch.load(ckpt, weights_only=True)
    _network().load_state_dict(state)  # strict: inference builds the plain UNETR (no foundation) and loads it


def test_fedseg_infer_with_the_bundle(tmp_path, finetuned):
    from fedseg.cli import main

    ckpt, _ = finetuned
    src = tmp_path / "new"
    src.mkdir()
    rng = np.random.default_rng(0)
    sizes = {"wide.png": (40, 72), "grey.png": (50, 30)}
    for name, (h, w) in sizes.items():
        arr = (rng.random((h, w) if name == "grey.png" else (h, w, 3)) * 255).astype(np.uint8)
        Image.fromarray(arr).save(src / name)
    main(["infer", "--checkpoint", str(ckpt), "--input", str(src), "--output", str(tmp_path / "out"),
          "--bundle", str(BUNDLE), "--overrides", json.dumps(SMALL)])  # fmt: skip
    for name, (h, w) in sizes.items():
        img = Image.open(tmp_path / "out" / f"{Path(name).stem}_seg.png")
        assert img.size == (w, h) and set(np.unique(np.asarray(img)).tolist()) <= {0, 255}


def test_evaluate_json(tmp_path, finetuned):
    from fedseg.inference import evaluate_checkpoint

    ckpt, data = finetuned
    metrics = evaluate_checkpoint(ckpt, data, split="test", output_dir=tmp_path, bundle_dir=BUNDLE, overrides=SMALL)
    assert 0.0 <= metrics["mean_dice"] <= 1.0
