"""The engine and the commands with several classes: a site's label space checked against the job, pooled datalists
mixing stored encodings, and fedseg run / bench refusing a federation before any job starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedseg.bench.runs import pooled_datalist
from fedseg.cli import main as cli_main
from fedseg.config import resolve_profile
from fedseg.data.checks import federation_label_config
from fedseg.data.labels import LabelSpaceError
from fedseg.data.synthetic import generate_site_data
from fedseg.engine import SegEngine


@pytest.fixture(scope="module")
def fundus_sites(tmp_path_factory):
    """Site a: the built-in fundus encoding (255 / 128 / 0). Site b: the same kind of data re-written with class
    indices (0 / 1 / 2) as its stored encoding."""
    root = tmp_path_factory.mktemp("mc")
    a = generate_site_data("fundus", "a", root, profile="tiny")
    src = generate_site_data("fundus", "b", root / "src", profile="tiny")
    data = json.loads(src.read_text())
    b_dir = root / "b"
    (b_dir / "labels").mkdir(parents=True)
    table = {255: 0, 128: 1, 0: 2}
    for split in ("training", "validation", "test"):
        for e in data[split]:
            stored = np.asarray(Image.open(src.parent / e["label"]))
            Image.fromarray(np.vectorize(table.get)(stored).astype(np.uint8)).save(b_dir / e["label"])
            e["image"] = str(src.parent / e["image"])
    data.update(label_values={"0": 0, "1": 1, "2": 2}, allow_external_paths=True)
    (b_dir / "datalist.json").write_text(json.dumps(data))
    return {"a": a, "b": b_dir / "datalist.json"}


@pytest.fixture(scope="module")
def cfg():
    return resolve_profile("tiny", **federation_label_config(family="fundus"))["train_config"]


def _labels(engine: SegEngine):
    return [batch["label"][0, 0].numpy() for batch in engine.loader("test")]


def test_pooled_datalist_keeps_each_sites_encoding(tmp_path, fundus_sites, cfg):
    fields = federation_label_config(fundus_sites)
    assert fields["num_classes"] == 3 and "label_values" not in fields  # the encodings differ; the classes do not
    pooled = pooled_datalist(fundus_sites, tmp_path / "pooled.json")
    engine = SegEngine("pooled", pooled, cfg)
    per_site = [lab for site in ("a", "b") for lab in _labels(SegEngine(site, fundus_sites[site], cfg))]
    pooled_labels = _labels(engine)
    assert len(pooled_labels) == len(per_site)
    for x, y in zip(pooled_labels, per_site):
        np.testing.assert_array_equal(x, y)
        assert set(np.unique(x).tolist()) == {0.0, 1.0, 2.0}


def test_a_site_whose_classes_differ_from_the_job_stops_before_training(fundus_sites, cfg):
    with pytest.raises(LabelSpaceError) as err:
        SegEngine("a", fundus_sites["a"], {**cfg, "num_classes": 2, "labels": None, "regions": None})
    assert "the job's train_config has 2 classes" in str(err.value) and str(fundus_sites["a"]) in str(err.value)


def test_evaluation_reports_every_class_and_region(fundus_sites, cfg):
    engine = SegEngine("a", fundus_sites["a"], cfg)
    means, rows = engine.evaluate(engine.build_network(), "test", per_image=True)
    keys = {"dice", "hd95", "assd"} | {f"{m}:{s}" for m in ("dice", "hd95", "assd") for s in ("rim", "cup", "disc")}
    assert set(means) == keys and all(set(r) == keys | {"id"} for r in rows)
    assert all(np.isfinite(v) for v in means.values())


def _write_map(tmp_path: Path, mapping) -> Path:
    path = tmp_path / "sites.json"
    path.write_text(json.dumps({k: str(v) for k, v in mapping.items()}))
    return path


def test_run_and_bench_refuse_mixed_label_spaces_before_any_job(tmp_path, fundus_sites):
    polyp = generate_site_data("polyp", "p", tmp_path, profile="tiny")
    mapping = _write_map(tmp_path, {"a": fundus_sites["a"], "p": polyp})
    for argv in (["run", "fedavg", "--site-datalists", str(mapping), "-w", str(tmp_path / "ws")],
                 ["bench", "--site-datalists", str(mapping), "--out", str(tmp_path / "bench")]):
        with pytest.raises(SystemExit) as err:
            cli_main(argv)
        message = str(err.value)
        assert "label spaces differ" in message and str(fundus_sites["a"]) in message and str(polyp) in message
    assert not (tmp_path / "ws").exists() and not (tmp_path / "bench" / "runs").exists()


def test_run_checks_every_sites_files_before_the_simulator(tmp_path, fundus_sites):
    data = json.loads(Path(fundus_sites["a"]).read_text())
    data["test"][0]["image"] = "images/missing.png"
    bad = tmp_path / "bad" / "datalist.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({**data, "allow_external_paths": True}))
    mapping = _write_map(tmp_path, {"a": fundus_sites["a"], "bad": bad})
    with pytest.raises(SystemExit, match=r"(?s)site bad: .*image file not found: .*missing\.png"):
        cli_main(["run", "fedavg", "--site-datalists", str(mapping), "-w", str(tmp_path / "ws")])
    assert not (tmp_path / "ws").exists()


def test_patch_mode_samples_every_class_and_slides_a_window(fundus_sites, cfg):
    """Native-resolution patches with RandCropByLabelClassesd: over a few batches every class is a patch centre's
    class; evaluation slides the window over whole images and scores each class."""
    patch_cfg = {**cfg, "spatial_mode": "patch", "patch_size": 16, "patch_samples": 3}
    engine = SegEngine("a", fundus_sites["a"], patch_cfg)
    assert engine.spatial_mode == "patch" and engine.train_config["patch_sampler"] == "classes"
    centres = set()
    for _ in range(3):
        for batch in engine.loader("training", shuffle=True, train=True):
            assert batch["label"].shape[-2:] == (16, 16)
            centres |= set(batch["label"][:, 0, 8, 8].long().tolist())
    assert centres == {0, 1, 2}
    means = engine.evaluate(engine.build_network(), "test")
    assert {"dice:rim", "dice:cup", "dice:disc"} <= set(means)


def test_fedseg_infer_writes_three_class_masks_in_the_stored_encoding(tmp_path, fundus_sites, cfg):
    small = {**cfg, "channels": [8, 16, 32, 64], "image_size": 32}
    engine = SegEngine("a", fundus_sites["a"], small)
    model = engine.build_network()
    ckpt = tmp_path / "FL_global_model.pt"
    torch.save({"model": model.state_dict(), "train_config": small}, ckpt)
    cli_main(["infer", "--checkpoint", str(ckpt), "--datalist", str(fundus_sites["b"]), "--output", str(tmp_path / "b")])
    cli_main(["infer", "--checkpoint", str(ckpt), "--datalist", str(fundus_sites["a"]), "--output", str(tmp_path / "a")])
    cli_main(["infer", "--checkpoint", str(ckpt), "--datalist", str(fundus_sites["a"]), "--output", str(tmp_path / "i"),
              "--class-indices"])
    test_a = json.loads(Path(fundus_sites["a"]).read_text())["test"]
    for folder, allowed in (("b", {0, 1, 2}), ("a", {0, 128, 255}), ("i", {0, 1, 2})):
        masks = sorted((tmp_path / folder).glob("*_seg.png"))
        assert masks and (folder == "b" or len(masks) == len(test_a))
        for m in masks:
            values = set(np.unique(np.asarray(Image.open(m))).tolist())
            assert values <= allowed, (folder, values)
    # site a's masks (255 = background) and the class-index masks say the same thing, at the input's size
    for entry in test_a:
        stem = Path(entry["image"]).stem
        stored = np.asarray(Image.open(tmp_path / "a" / f"{stem}_seg.png"))
        indices = np.asarray(Image.open(tmp_path / "i" / f"{stem}_seg.png"))
        assert stored.shape == np.asarray(Image.open(Path(fundus_sites["a"]).parent / entry["image"])).shape[:2]
        np.testing.assert_array_equal(np.array([255, 128, 0])[indices], stored)
