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
from fedseg.data.labels import LabelSpaceError, federation_label_config
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
