"""``fedseg data odoc``: one datalist per fundus / prostate domain, read in place, with the label space declared;
every mask decoded and checked against the manifest at import."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedseg.cli import main as cli_main
from fedseg.data.datalist import DatalistError, load_datalist
from fedseg.data.importers.odoc import ODOC_FOLDER, import_odoc
from fedseg.data.labels import LabelSpace
from real_data import real_data_folder

REAL_ROOT = real_data_folder(ODOC_FOLDER)
needs_real = pytest.mark.skipif(not (REAL_ROOT / "manifest.csv").is_file(), reason=f"no samples at {REAL_ROOT}")
COLUMNS = ["task", "site", "split", "image", "mask", "height", "width", "image_mode", "mask_shape", "mask_values", "source"]


def _fake_source(root: Path, mask_fn=None, n_train=3, n_test=3):
    """A two-domain fundus source in the sample layout: RGB 32 x 32 crops, RGB masks 0 / 128 / 255."""
    rows = []
    rng = np.random.default_rng(0)
    for site in ("DomA", "DomB"):
        for split, n in (("train", n_train), ("test", n_test)):
            for i in range(n):
                name = f"{split}{i}.png"
                (root / "fundus_odoc" / site / "images").mkdir(parents=True, exist_ok=True)
                (root / "fundus_odoc" / site / "masks").mkdir(parents=True, exist_ok=True)
                Image.fromarray((rng.random((32, 32, 3)) * 255).astype(np.uint8)).save(root / "fundus_odoc" / site / "images" / name)
                grey = np.full((32, 32), 255, np.uint8)
                grey[8:24, 8:24] = 128
                grey[12:20, 12:20] = 0
                mask = np.repeat(grey[..., None], 3, axis=-1)
                if mask_fn is not None:
                    mask = mask_fn(site, split, i, mask)
                Image.fromarray(mask).save(root / "fundus_odoc" / site / "masks" / name)
                rows.append({"task": "fundus_odoc", "site": site, "split": split,
                             "image": f"fundus_odoc/{site}/images/{name}", "mask": f"fundus_odoc/{site}/masks/{name}",
                             "height": "32", "width": "32", "image_mode": "RGB", "mask_shape": "32x32x3",
                             "mask_values": "0 128 255", "source": "test"})
    with open(root / "manifest.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return root


def test_import_writes_a_datalist_per_domain_with_the_label_space(tmp_path):
    src = _fake_source(tmp_path / "src")
    paths = import_odoc(src, tmp_path / "out", seed=3)
    assert list(paths) == ["DomA", "DomB"]
    for path in paths.values():
        data = json.loads(path.read_text())
        assert data["labels"] == {"background": 0, "rim": 1, "cup": 2}
        assert data["label_values"] == {"255": 0, "128": 1, "0": 2}
        assert data["regions"] == {"disc": ["rim", "cup"], "cup": ["cup"]} and data["allow_external_paths"] is True
        splits = load_datalist(path)
        assert [len(splits[s]) for s in ("training", "validation", "test")] == [2, 1, 3]
        assert all(e["image"].startswith(str(src)) for s in splits.values() for e in s)  # read in place
        assert all(e["label_values"] == data["label_values"] for s in splits.values() for e in s)
    assert json.loads((tmp_path / "out" / "site_datalists.json").read_text()) == {s: str(p.resolve()) for s, p in paths.items()}


def test_a_mask_with_an_undeclared_value_is_named_with_its_values(tmp_path):
    def stray(site, split, i, mask):
        if site == "DomB" and split == "test" and i == 1:
            mask[0, 0] = 7
        return mask

    src = _fake_source(tmp_path / "src", stray)
    with pytest.raises(DatalistError, match=r"DomB/masks/test1\.png has values \{7\} not declared"):
        import_odoc(src, tmp_path / "out")


def test_rgb_masks_whose_channels_differ_are_refused(tmp_path):
    def tinted(site, split, i, mask):
        if site == "DomA" and split == "train" and i == 2:
            mask[5, 5, 2] = 128
        return mask

    with pytest.raises(DatalistError, match=r"DomA/masks/train2\.png is an RGB mask whose channels differ"):
        import_odoc(_fake_source(tmp_path / "src", tinted), tmp_path / "out")


def test_a_mask_that_disagrees_with_the_manifest_is_refused(tmp_path):
    def no_cup(site, split, i, mask):
        if site == "DomA" and split == "test" and i == 0:
            mask[mask == 0] = 128
        return mask

    with pytest.raises(DatalistError, match="manifest records '0 128 255'"):
        import_odoc(_fake_source(tmp_path / "src", no_cup), tmp_path / "out")


def test_cli_and_unknown_site(tmp_path, capsys):
    src = _fake_source(tmp_path / "src")
    cli_main(["data", "odoc", "--src", str(src), "--out", str(tmp_path / "out"), "--sites", "DomB"])
    assert "DomB: 2/1/3 training/validation/test images" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"site\(s\) \['DomC'\]"):
        cli_main(["data", "odoc", "--src", str(src), "--out", str(tmp_path / "out2"), "--sites", "DomC"])


@needs_real
def test_real_samples_import_and_decode(tmp_path):
    paths = import_odoc(REAL_ROOT, tmp_path / "fundus")
    assert list(paths) == ["Drishti-GS", "RIM-ONE-r3", "REFUGE-train", "REFUGE-val"]
    for path in paths.values():
        splits = load_datalist(path)  # decodes every RGB mask under 255/128/0
        assert [len(splits[s]) for s in ("training", "validation", "test")] == [2, 1, 3]
    notes = []
    prostate = import_odoc(REAL_ROOT, tmp_path / "prostate", task="prostate", log=notes.append)
    assert len(prostate) == 6
    # the samples' train and test rows name the same files: each is used once, never in two splits
    assert any("listed in the manifest's train and test splits" in n for n in notes)
    for path in prostate.values():
        data = json.loads(path.read_text())
        assert LabelSpace.from_datalist(data).names == ("background", "prostate")
        splits = load_datalist(path)  # refuses an image listed in two splits
        images = [e["image"] for s in splits.values() for e in s]
        assert len(images) == len(set(images)) and all(len(v) >= 1 for v in splits.values())
