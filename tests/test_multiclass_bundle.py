"""The segmentation bundle with C = 3 classes: network I/O check, inference writing masks at each input's size in
the stored encoding (or class indices on request) through fedseg infer and MONAI's own ``run``, and evaluate.json
scoring as the engine does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedseg.bundle import load_bundle
from fedseg.config import resolve_profile
from fedseg.data.labels import federation_label_config
from fedseg.data.synthetic import generate_site_data
from fedseg.inference import evaluate_checkpoint, run_inference

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "bundles" / "unet2d_seg"
CONFIGS = BUNDLE / "configs"
FUNDUS_VALUES = {"255": 0, "128": 1, "0": 2}
#: a 1x1 convolution as the "network": background where red < 1/3, rim for mid red, cup for bright red
ORACLE_DEF = {"_target_": "torch.nn.Conv2d", "in_channels": 3, "out_channels": 3, "kernel_size": 1}


def _oracle_checkpoint(path: Path, train_config: dict) -> Path:
    conv = torch.nn.Conv2d(3, 3, kernel_size=1)
    with torch.no_grad():
        conv.weight.zero_()
        conv.bias.zero_()
        conv.weight[1, 0], conv.bias[1] = 10.0, -3.3   # rim logit 10 (r - 0.33)
        conv.weight[2, 0], conv.bias[2] = 20.0, -10.0  # cup logit 20 (r - 0.5)
    torch.save({"model": conv.state_dict(), "train_config": train_config}, path)
    return path


def _zones_image(folder: Path, name="zones.png", h=36, w=60):
    """Red 0 (background) everywhere, 0.5 (rim) in a top-right block, 1.0 (cup) inside it: classes by position."""
    img = np.zeros((h, w, 3), np.uint8)
    img[2:20, 30:58, 0] = 128
    img[6:14, 40:50, 0] = 255
    folder.mkdir(exist_ok=True)
    Image.fromarray(img).save(folder / name)
    classes = np.zeros((h, w), np.int64)
    classes[2:20, 30:58] = 1
    classes[6:14, 40:50] = 2
    return classes


@pytest.mark.parametrize("how", ["checkpoint", "explicit", "indices"])
def test_inference_writes_the_stored_encoding_at_the_input_size(tmp_path, how):
    classes = _zones_image(tmp_path / "new")
    cfg = {"num_classes": 3, "image_size": 32, "spatial_mode": "resize",
           **({"label_values": FUNDUS_VALUES} if how == "checkpoint" else {})}
    ckpt = _oracle_checkpoint(tmp_path / "FL_global_model.pt", cfg)
    kwargs = {"label_values": FUNDUS_VALUES} if how == "explicit" else {"class_indices": True} if how == "indices" else {}
    (mask_path,) = run_inference(ckpt, tmp_path / "out", input_dir=tmp_path / "new",
                                 overrides={"network_def": ORACLE_DEF}, **kwargs)
    mask = np.asarray(Image.open(mask_path))
    assert mask.shape == classes.shape and mask.dtype == np.uint8
    expected = classes if how == "indices" else np.array([255, 128, 0])[classes]
    # the 32 px grid and the inverse resize blur the block borders by a pixel or two; the classes must sit in place
    assert (mask == expected).mean() > 0.95
    assert set(np.unique(mask).tolist()) == set(np.unique(expected).tolist())


def test_inference_on_a_datalist_writes_that_sites_own_encoding(tmp_path):
    classes = _zones_image(tmp_path / "site", "img.png")
    Image.fromarray(classes.astype(np.uint8)).save(tmp_path / "site" / "lab.png")
    datalist = tmp_path / "site" / "datalist.json"
    entry = [{"image": "img.png", "label": "lab.png"}]
    datalist.write_text(json.dumps({"labels": {"background": 0, "rim": 1, "cup": 2}, "label_values": {"10": 0, "20": 1, "30": 2},
                                    "training": entry, "validation": entry, "test": entry}))
    ckpt = _oracle_checkpoint(tmp_path / "m.pt", {"num_classes": 3, "image_size": 32, "label_values": FUNDUS_VALUES})
    (mask_path,) = run_inference(ckpt, tmp_path / "out", datalist=datalist, overrides={"network_def": ORACLE_DEF})
    mask = np.asarray(Image.open(mask_path))
    assert set(np.unique(mask).tolist()) == {10, 20, 30}
    assert (mask == np.array([10, 20, 30])[classes]).mean() > 0.95


def test_monai_bundle_run_writes_multiclass_masks(tmp_path):
    """MONAI's own ``run`` on train.json + inference.json with the class count and encoding as overrides."""
    from monai.bundle import run

    classes = _zones_image(tmp_path / "new")
    ckpt = _oracle_checkpoint(tmp_path / "m.pt", {})
    run(config_file=[str(CONFIGS / "train.json"), str(CONFIGS / "inference.json")], meta_file=str(CONFIGS / "metadata.json"),
        logging_file=False, bundle_root=str(BUNDLE), ckpt_path=str(ckpt), input_dir=str(tmp_path / "new"),
        output_dir=str(tmp_path / "out"), num_classes=3, image_size=32, network_def=ORACLE_DEF, label_values=FUNDUS_VALUES)
    mask = np.asarray(Image.open(tmp_path / "out" / "zones_seg.png"))
    assert mask.shape == classes.shape and (mask == np.array([255, 128, 0])[classes]).mean() > 0.95


def test_verify_net_in_out_with_three_classes():
    import fire
    import monai.bundle.__main__ as cli

    argv = ["network_def", "--meta_file", str(CONFIGS / "metadata.json"), "--config_file", str(CONFIGS / "train.json"),
            "--device", "cpu", "--num_classes", "3", "--_meta_#network_data_format#outputs#pred#num_channels", "3"]
    fire.Fire(cli.verify_net_in_out, command=argv, name="verify_net_in_out")
    with pytest.raises(ValueError, match="output channel number `3` doesn't match: `2`"):
        fire.Fire(cli.verify_net_in_out, command=argv[:-2], name="verify_net_in_out")


def test_evaluate_json_scores_three_classes_as_the_engine(tmp_path):
    from fedseg.engine import SegEngine

    datalist = generate_site_data("fundus", "site-1", tmp_path, profile="tiny")
    small = {"channels": [8, 16, 32, 64], "image_size": 32}
    cfg = resolve_profile("tiny", **federation_label_config(family="fundus"), **small)["train_config"]
    net = load_bundle(BUNDLE, cfg).get_parsed_content("network_def", lazy=False)
    ckpt = tmp_path / "model.pt"
    torch.save({"model": net.state_dict(), "train_config": cfg}, ckpt)
    metrics = evaluate_checkpoint(ckpt, datalist, split="test", output_dir=tmp_path / "eval")
    engine = SegEngine("site-1", datalist, cfg, device=torch.device("cpu"))
    model = engine.build_network()
    model.load_state_dict(net.state_dict())
    means = engine.evaluate(model, "test")
    # evaluate.json's Dice: mean over images and the two foreground classes, as the engine's headline Dice
    assert metrics["mean_dice"] == pytest.approx(means["dice"], abs=1e-5)
    assert means["dice"] == pytest.approx((means["dice:rim"] + means["dice:cup"]) / 2, abs=1e-6)
