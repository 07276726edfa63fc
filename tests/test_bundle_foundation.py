"""The MONAI bundle ``bundles/vit_foundation`` (FedEFM phase-1 ViT classifier) as MONAI's tooling sees it:
offline metadata check, network I/O check, TorchScript export, one epoch of ``train.json``, evaluate.json
accuracy against the engine's, inference.json predictions, and the server's round-0 network equal to
the sites'. Tiny ViT at 32 px; the bundle folder must stay unchanged."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from test_bundle import _fire_cli, _files, verify_metadata_offline
from test_engine_classification import CONFIG, write_classification_datalist

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "bundles" / "vit_foundation"
CONFIGS = BUNDLE / "configs"
META = CONFIGS / "metadata.json"
TRAIN = CONFIGS / "train.json"

#: a 32 px tiny ViT: same code paths as the defaults, a fraction of the CPU time
SMALL = {"vit_image_size": 32, "in_channels": 1, "num_classes": 2}
# the monai.bundle CLI sees bundle variables as JSON strings
IMPORTS = {"extra_imports": ["$import fedseg"]}


@pytest.fixture(scope="module", autouse=True)
def bundle_untouched():
    before = _files(BUNDLE)
    yield
    assert _files(BUNDLE) == before, "a test wrote into the bundle folder"


@pytest.fixture(scope="module")
def datalist(tmp_path_factory) -> Path:
    return write_classification_datalist(tmp_path_factory.mktemp("cls"))


@pytest.fixture(scope="module")
def trained_ckpt(tmp_path_factory, datalist) -> Path:
    from monai.bundle import run

    out = tmp_path_factory.mktemp("train")
    run(
        config_file=str(TRAIN), meta_file=str(META), logging_file=False, bundle_root=str(BUNDLE),
        ckpt_dir=str(out / "models"), output_dir=str(out / "eval"), datalist=str(datalist),
        max_epochs=2, batch_size=4, **SMALL,
    )
    return out / "models" / "model.pt"


def test_verify_metadata_offline():
    assert "metadata is verified with no error" in verify_metadata_offline()[BUNDLE.name]


def test_verify_net_in_out():
    _fire_cli("verify_net_in_out", ["network_def", "--meta_file", str(META), "--config_file", str(TRAIN), "--device", "cpu"])


def test_server_and_site_build_the_same_vit(datalist):
    """Round 0: the server's network (fedseg.bundle.build_network -> this bundle for task classification)
    equals every site's (ClassificationEngine.build_network), tensor for tensor."""
    from fedseg.bundle import build_network
    from fedseg.config import resolve_profile
    from fedseg.engine.classification import ClassificationEngine
    from fedseg.foundation.networks import ViTClassifier

    cfg = {**resolve_profile("tiny")["train_config"], **CONFIG, "task": "classification", "in_channels": 3, "seed": 7}
    server = build_network(cfg)
    site = ClassificationEngine("site-a", datalist, cfg, device=torch.device("cpu")).build_network()
    assert isinstance(server, ViTClassifier) and server.img_size == (32, 32) and server.in_channels == 3
    assert server.state_dict().keys() == site.state_dict().keys()
    for k, v in server.state_dict().items():
        assert torch.equal(v, site.state_dict()[k]), k
    # vit_image_size None: the profile's size on both sides
    assert build_network({**cfg, "vit_image_size": None}).img_size == (96, 96)


def test_train_one_epoch_and_export(tmp_path, trained_ckpt):
    from fedseg.bundle import load_bundle

    net = load_bundle(BUNDLE, SMALL).get_parsed_content("network_def", lazy=False).eval()
    net.load_state_dict(torch.load(trained_ckpt, weights_only=True))
    ts_path = tmp_path / "model.ts"
    argv = ["network_def", "--filepath", str(ts_path), "--ckpt_file", str(trained_ckpt), "--meta_file", str(META),
            "--config_file", str(TRAIN), "--vit_image_size", "32"]  # fmt: skip
    _fire_cli("ckpt_export", argv)
    scripted = torch.jit.load(str(ts_path))
    x = torch.rand(3, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), net(x), rtol=1e-5, atol=1e-5)


def test_evaluate_matches_engine(tmp_path, trained_ckpt, datalist):
    """evaluate.json's accuracy and predictions.csv equal the ClassificationEngine's on the same weights."""
    from monai.bundle import ConfigWorkflow

    from fedseg.engine.classification import ClassificationEngine

    wf = ConfigWorkflow(config_file=[str(TRAIN), str(CONFIGS / "evaluate.json")], meta_file=str(META), logging_file=False, workflow_type=None)
    for k, v in {**SMALL, "bundle_root": str(BUNDLE), "datalist": str(datalist), "ckpt_path": str(trained_ckpt), "output_dir": str(tmp_path)}.items():
        wf.parser[k] = v
    wf.initialize()
    wf.run()
    accuracy = wf.parser.get_parsed_content("validate#evaluator").state.metrics["accuracy"]
    wf.finalize()
    engine = ClassificationEngine("site-a", datalist, CONFIG, device=torch.device("cpu"))
    model = engine.build_network()
    model.load_state_dict(torch.load(trained_ckpt, weights_only=True))
    means, rows = engine.evaluate(model, "test", per_image=True)
    assert accuracy == pytest.approx(means["accuracy"])
    with open(tmp_path / "predictions.csv") as f:
        written = {Path(r[0]).name: int(float(r[1])) for r in csv.reader(f)}
    assert written == {r["id"]: r["prediction"] for r in rows}


def test_inference_on_folder(tmp_path, trained_ckpt, datalist):
    """python -m monai.bundle run with inference.json on a folder: one class per image."""
    src = Path(datalist).parent / "img"
    out = tmp_path / "pred"
    argv = ["--config_file", json.dumps([str(TRAIN), str(CONFIGS / "inference.json")]), "--meta_file", str(META),
            "--logging_file", "False", "--bundle_root", str(BUNDLE), "--ckpt_path", str(trained_ckpt), "--input_dir", str(src),
            "--output_dir", str(out), "--vit_image_size", "32"]  # fmt: skip
    _fire_cli("run", argv)
    with open(out / "predictions.csv") as f:
        rows = list(csv.reader(f))
    assert len(rows) == len(list(src.glob("*.png"))) and {int(float(r[1])) for r in rows} <= {0, 1}
