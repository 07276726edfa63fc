"""Retina importer (fake layout always, real data when present) and FVAC participant splits."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from fedseg.data import (
    DEFAULT_RETINA_ROOT,
    DatalistError,
    generate_federation,
    import_retina,
    load_datalist,
    participant_split,
)
from real_data import real_data_folder

SPLITS = ("training", "validation", "test")
COLUMNS = ["site", "id", "split", "image", "mask", "fov", "height", "width", "vessel_fraction"]


def _fake_layout(root: Path) -> Path:
    """A tiny DRIVE/STARE/CHASE_DB1 look-alike: DRIVE 4 test + 6 train (tif + fov), STARE 6 png,
    CHASE_DB1 4 subjects x L/R jpg. Images are 8x10 RGB, masks 0/255 PNG."""
    rng = np.random.default_rng(0)
    rows = []

    def pair(site, image_id, split, ext, fov=False):
        (root / site / "images").mkdir(parents=True, exist_ok=True)
        (root / site / "masks").mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 256, (8, 10, 3), dtype=np.uint8)
        mask = (rng.random((8, 10)) > 0.85).astype(np.uint8) * 255
        rel_img = f"{site}/images/{image_id}.{ext}"
        if ext == "tif":
            tifffile.imwrite(root / rel_img, image, photometric="rgb")
        else:
            Image.fromarray(image).save(root / rel_img)
        Image.fromarray(mask).save(root / site / "masks" / f"{image_id}.png")
        rel_fov = ""
        if fov:
            (root / site / "fov").mkdir(exist_ok=True)
            Image.fromarray(np.full((8, 10), 255, np.uint8)).save(root / site / "fov" / f"{image_id}.png")
            rel_fov = f"{site}/fov/{image_id}.png"
        rows.append([site, image_id, split, rel_img, f"{site}/masks/{image_id}.png", rel_fov, 8, 10, mask.mean() / 255])

    for i in range(1, 5):
        pair("DRIVE", f"{i:02d}_test", "test", "tif", fov=True)
    for i in range(21, 27):
        pair("DRIVE", f"{i:02d}_training", "train", "tif", fov=True)
    for i in range(1, 7):
        pair("STARE", f"im{i:04d}", "", "png")
    for i in range(1, 5):
        for eye in "LR":
            pair("CHASE_DB1", f"Image_{i:02d}{eye}", "", "jpg")
    with open(root / "manifest.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    (root / "TERMS.md").write_text("research use only\n")
    return root


@pytest.fixture()
def fake_root(tmp_path):
    return _fake_layout(tmp_path / "src")


def _ids(entries):
    return [e["id"] for e in entries]


def _check_import(out_dir: Path, src_root: Path, result: dict) -> None:
    """Common invariants: only datalist.json written, absolute paths into src, disjoint non-empty splits."""
    written = [p for p in out_dir.rglob("*") if p.is_file()]
    assert sorted(written) == sorted(result.values())
    assert all(p.name == "datalist.json" for p in written)
    for site, path in result.items():
        data = json.loads(path.read_text())
        assert data["seed"] == 0 and data["split_rule"] and data["site"] == site
        ids = [_ids(data[s]) for s in SPLITS]
        assert all(ids), f"{site}: empty split"
        flat = [i for part in ids for i in part]
        assert len(flat) == len(set(flat)), f"{site}: splits overlap"
        for split in SPLITS:
            for e in data[split]:
                assert os.path.isabs(e["image"]) and Path(e["image"]).is_relative_to(src_root)
                assert Path(e["label"]).is_file()


def test_import_fake_layout(fake_root, tmp_path):
    out = tmp_path / "out"
    result = import_retina(fake_root, out, seed=0, check_files=True)
    assert list(result) == ["DRIVE", "STARE", "CHASE_DB1"]
    _check_import(out, fake_root.absolute(), result)
    drive = json.loads(result["DRIVE"].read_text())
    assert sorted(_ids(drive["test"])) == [f"{i:02d}_test" for i in range(1, 5)]
    assert sorted(_ids(drive["training"] + drive["validation"])) == [f"{i:02d}_training" for i in range(21, 27)]
    assert len(drive["validation"]) == 1  # max(1, round(0.1 * 6))
    assert all("fov" in e and Path(e["fov"]).is_file() for e in drive["training"])
    stare = json.loads(result["STARE"].read_text())
    assert [len(stare[s]) for s in SPLITS] == [4, 1, 1]
    assert all("fov" not in e for e in stare["test"])
    # both eyes of a CHASE_DB1 subject land in the same split
    chase = json.loads(result["CHASE_DB1"].read_text())
    for split in SPLITS:
        subjects = [i[:-1] for i in _ids(chase[split])]
        assert all(subjects.count(s) == 2 for s in subjects)
    for path in result.values():
        load_datalist(path, check_files=True)


def test_import_is_deterministic(fake_root, tmp_path):
    a = import_retina(fake_root, tmp_path / "a", seed=5)
    b = import_retina(fake_root, tmp_path / "b", seed=5)
    assert all(a[s].read_bytes() == b[s].read_bytes() for s in a)
    splits_by_seed = set()
    for seed in range(6):
        d = json.loads(import_retina(fake_root, tmp_path / f"s{seed}", seed=seed, sites=("STARE",))["STARE"].read_text())
        splits_by_seed.add(tuple(_ids(d["test"])))
    assert len(splits_by_seed) > 1


def test_import_errors_name_the_file(fake_root, tmp_path):
    with pytest.raises(DatalistError, match="manifest.csv"):
        import_retina(tmp_path / "nowhere", tmp_path / "out")
    missing = fake_root / "STARE" / "masks" / "im0003.png"
    missing.unlink()
    with pytest.raises(DatalistError, match=str(missing)):
        import_retina(fake_root, tmp_path / "out")
    # nothing is written when validation fails
    assert not (tmp_path / "out").exists()
    with pytest.raises(DatalistError, match="HRF"):
        import_retina(fake_root, tmp_path / "out", sites=("DRIVE", "HRF"))
    (fake_root / "manifest.csv").write_text("site,id\nDRIVE,01\n")
    with pytest.raises(DatalistError, match="lacks column"):
        import_retina(fake_root, tmp_path / "out")


def _check_shares(domain_path: Path, shares: list[Path], k: int) -> None:
    domain = load_datalist(domain_path, check_files=False)
    parts = [load_datalist(p, check_files=False) for p in shares]
    assert len(parts) == k
    train = [e["image"] for part in parts for e in part["training"]]
    assert len(train) == len(set(train)), "training shares overlap"
    assert sorted(train) == sorted(e["image"] for e in domain["training"])
    sizes = [len(p["training"]) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for part in parts:
        assert part["test"] == domain["test"]
        assert part["validation"]
    if len(domain["validation"]) >= k:
        val = [e["image"] for part in parts for e in part["validation"]]
        assert sorted(val) == sorted(e["image"] for e in domain["validation"])


def test_participant_split_fvac_setting(fake_root, tmp_path):
    datalists = import_retina(fake_root, tmp_path / "domains")
    counts = {"DRIVE": 3, "STARE": 1, "CHASE_DB1": 1}
    parts = participant_split(datalists, counts, tmp_path / "participants", seed=1)
    assert list(parts) == ["DRIVE_1", "DRIVE_2", "DRIVE_3", "STARE", "CHASE_DB1"]
    _check_shares(datalists["DRIVE"], [parts[f"DRIVE_{i}"] for i in (1, 2, 3)], 3)
    _check_shares(datalists["STARE"], [parts["STARE"]], 1)
    again = participant_split(datalists, counts, tmp_path / "again", seed=1)
    assert all(parts[n].read_bytes() == again[n].read_bytes() for n in parts)
    with pytest.raises(DatalistError):
        participant_split(datalists, {"STARE": 5}, tmp_path / "p2")
    with pytest.raises(ValueError):
        participant_split(datalists, {"HRF": 2}, tmp_path / "p3")


def test_participant_split_on_synthetic(tmp_path):
    domains = generate_federation("polyp", ["a", "b"], tmp_path / "syn", profile="tiny", num_images=12)
    parts = participant_split(domains, {"a": 2}, tmp_path / "parts")
    assert list(parts) == ["a_1", "a_2", "b"]
    _check_shares(domains["a"], [parts["a_1"], parts["a_2"]], 2)
    for path in parts.values():
        load_datalist(path, check_files=True)


REAL_ROOT = real_data_folder(DEFAULT_RETINA_ROOT, "FEDSEG_RETINA_ROOT")


@pytest.mark.skipif(not (REAL_ROOT / "manifest.csv").is_file(), reason=f"no retina data at {REAL_ROOT}")
def test_import_real_retina(tmp_path):
    before = {p: p.stat().st_mtime_ns for p in REAL_ROOT.rglob("*") if p.is_file()}
    result = import_retina(REAL_ROOT, tmp_path / "a", seed=0)
    _check_import(tmp_path / "a", REAL_ROOT.absolute(), result)
    drive = json.loads(result["DRIVE"].read_text())
    assert sorted(_ids(drive["test"])) == [f"{i:02d}_test" for i in range(1, 21)]
    assert len(drive["training"]) + len(drive["validation"]) == 20 and len(drive["validation"]) >= 1
    counts = {s: sum(len(json.loads(p.read_text())[k]) for k in SPLITS) for s, p in result.items()}
    assert counts == {"DRIVE": 40, "STARE": 20, "CHASE_DB1": 28}
    again = import_retina(REAL_ROOT, tmp_path / "b", seed=0)
    assert all(result[s].read_bytes() == again[s].read_bytes() for s in result)
    # spot-check contents: one full pass over STARE (20 pairs), the smallest domain
    load_datalist(result["STARE"], check_files=True)
    parts = participant_split(result, {"DRIVE": 3, "STARE": 1, "CHASE_DB1": 1}, tmp_path / "fvac")
    _check_shares(result["DRIVE"], [parts[f"DRIVE_{i}"] for i in (1, 2, 3)], 3)
    assert {p: p.stat().st_mtime_ns for p in REAL_ROOT.rglob("*") if p.is_file()} == before
