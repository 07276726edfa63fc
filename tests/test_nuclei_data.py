"""H&E nuclei: the MoNuSeg/TNBC importer (fake layout always, real data when present) and the built-in
synthetic ``nuclei`` family."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedseg.cli import FAMILY_CHOICES, main
from fedseg.data import (
    DEFAULT_NUCLEI_ROOT,
    FAMILIES,
    DatalistError,
    generate_federation,
    generate_site_data,
    import_nuclei,
    load_datalist,
)
from fedseg.data.synthetic import NUCLEI_FRACTION_BAND
from fedseg.data.synthetic.families import _RENDERERS
from real_data import real_data_folder

SPLITS = ("training", "validation", "test")
COLUMNS = ["site", "id", "split", "image", "mask", "height", "width", "fg_fraction", "slide", "organ", "magnification", "source"]

# MoNuSeg look-alike: organ -> (official train slides, official test slides); liver has two slides with
# two images each, as a patient with several tiles
MONUSEG = {
    "breast": (6, 2),
    "kidney": (4, 2),
    "liver": (5, 0),
    "stomach": (2, 0),
    "lung": (0, 2),
}
# TNBC look-alike: 6 patients with 1-3 tiles each, no official split
TNBC_TILES = [3, 1, 2, 3, 2, 1]


def _fake_layout(root: Path) -> Path:
    """Tiny MoNuSeg (jpg images, one row per tile, several tiles per liver slide) and TNBC (png) folders
    with 8x10 RGB images and 0/255 PNG masks, and their manifest.csv."""
    rng = np.random.default_rng(0)
    rows = []

    def pair(site, image_id, split, slide, organ, ext):
        (root / site / "images").mkdir(parents=True, exist_ok=True)
        (root / site / "masks").mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 256, (8, 10, 3), dtype=np.uint8)
        mask = (rng.random((8, 10)) > 0.8).astype(np.uint8) * 255
        Image.fromarray(image).save(root / site / "images" / f"{image_id}.{ext}")
        Image.fromarray(mask).save(root / site / "masks" / f"{image_id}.png")
        rows.append([site, image_id, split, f"{site}/images/{image_id}.{ext}", f"{site}/masks/{image_id}.png",
                     8, 10, round(mask.mean() / 255, 4), slide, organ, "40x", "fake"])

    for organ, (n_train, n_test) in MONUSEG.items():
        for split, n in (("train", n_train), ("test", n_test)):
            for i in range(n):
                slide = f"TCGA-{organ}-{split}-{i}"
                tiles = 2 if organ == "liver" and i < 2 else 1
                for t in range(tiles):
                    pair("MoNuSeg", f"{slide}-t{t}", split, slide, organ, "jpg")
    for p, n in enumerate(TNBC_TILES, start=1):
        for t in range(1, n + 1):
            pair("TNBC", f"{p:02d}_{t}", "", f"patient_{p:02d}", "breast", "png")
    with open(root / "manifest.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    (root / "TERMS.md").write_text("research use only\n")
    return root


@pytest.fixture()
def fake_root(tmp_path):
    return _fake_layout(tmp_path / "src")


def _manifest(root: Path):
    with open(root / "manifest.csv", newline="") as f:
        return list(csv.DictReader(f))


def _check_import(out_dir: Path, src_root: Path, result: dict) -> None:
    """Only the datalists and site_datalists.json are written; absolute paths into src; splits non-empty,
    disjoint and never sharing a slide; the datalist declares patch mode at rescale 1 and the nucleus label."""
    written = sorted(p for p in out_dir.rglob("*") if p.is_file())
    assert written == sorted([*result.values(), out_dir / "site_datalists.json"])
    assert json.loads((out_dir / "site_datalists.json").read_text()) == {s: str(p.resolve()) for s, p in result.items()}
    for site, path in result.items():
        data = json.loads(path.read_text())
        assert data["site"] == site and data["split_rule"] and data["labels"] == {"0": "background", "1": "nucleus"}
        assert data["spatial_mode"] == "patch" and data["rescale"] == 1.0
        assert all(data[s] for s in SPLITS), f"{site}: empty split"
        ids = [e["id"] for s in SPLITS for e in data[s]]
        assert len(ids) == len(set(ids)), f"{site}: splits overlap"
        slides = [{e["slide"] for e in data[s]} for s in SPLITS]
        for a in range(3):
            for b in range(a + 1, 3):
                assert not slides[a] & slides[b], f"{site}: slide in {SPLITS[a]} and {SPLITS[b]}"
        for split in SPLITS:
            for e in data[split]:
                assert os.path.isabs(e["image"]) and Path(e["image"]).is_relative_to(src_root)
                assert Path(e["label"]).is_file()


def _ids(path: Path, split: str):
    return sorted(e["id"] for e in json.loads(path.read_text())[split])


def test_source_layout(fake_root, tmp_path):
    out = tmp_path / "out"
    result = import_nuclei(fake_root, out, layout="source", check_files=True)
    assert list(result) == ["MoNuSeg", "TNBC"]
    _check_import(out, fake_root.absolute(), result)
    rows = _manifest(fake_root)
    official = {s: sorted(r["id"] for r in rows if r["site"] == "MoNuSeg" and r["split"] == s) for s in ("train", "test")}
    assert _ids(result["MoNuSeg"], "test") == official["test"]  # the official test split is kept
    assert sorted(_ids(result["MoNuSeg"], "training") + _ids(result["MoNuSeg"], "validation")) == official["train"]
    tnbc = json.loads(result["TNBC"].read_text())
    assert sum(len(tnbc[s]) for s in SPLITS) == sum(TNBC_TILES)
    assert "no official split" in tnbc["split_rule"]
    assert {e["dataset"] for s in SPLITS for e in tnbc[s]} == {"TNBC"}
    for path in result.values():
        load_datalist(path, check_files=True)


def test_organ_layout_default_organs_and_skips(fake_root, tmp_path):
    notices = []
    out = tmp_path / "out"
    result = import_nuclei(fake_root, out, layout="organ", log=notices.append)
    # breast 8 and liver 7 images; kidney 6 (= min_images 6); stomach and lung have 2 each
    assert list(result) == ["breast", "kidney", "liver"]
    assert any("stomach" in n and "min_images" in n for n in notices)
    assert any("lung" in n for n in notices)
    _check_import(out, fake_root.absolute(), result)
    breast = json.loads(result["breast"].read_text())
    assert [len(breast[s]) for s in SPLITS] == [5, 1, 2]  # validation = max(1, round(0.15 * 6)) slides
    assert _ids(result["breast"], "test") == sorted(f"TCGA-breast-test-{i}-t0" for i in range(2))
    liver = json.loads(result["liver"].read_text())  # no official test: slide-grouped 3-way split
    assert "no official test split" in liver["split_rule"]
    assert sum(len(liver[s]) for s in SPLITS) == 7
    assert {e["organ"] for s in SPLITS for e in liver[s]} == {"liver"}

    # with a lower bar the unsplittable organs are skipped with their reasons, the rest imported
    notices.clear()
    result = import_nuclei(fake_root, tmp_path / "low", layout="organ", min_images=2, log=notices.append)
    assert list(result) == ["breast", "kidney", "liver"]
    assert any("stomach" in n and "slide" in n for n in notices)
    assert any("lung" in n and "no official training" in n for n in notices)


def test_organ_layout_explicit_organs(fake_root, tmp_path):
    result = import_nuclei(fake_root, tmp_path / "a", layout="organ", organs=["liver", "breast"])
    assert list(result) == ["liver", "breast"]
    _check_import(tmp_path / "a", fake_root.absolute(), result)
    with pytest.raises(DatalistError, match="stomach.*2 slide"):
        import_nuclei(fake_root, tmp_path / "b", layout="organ", organs=["breast", "stomach"])
    with pytest.raises(DatalistError, match="lung.*no official training"):
        import_nuclei(fake_root, tmp_path / "b", layout="organ", organs=["lung"])
    with pytest.raises(DatalistError, match="heart"):
        import_nuclei(fake_root, tmp_path / "b", layout="organ", organs=["heart"])
    assert not (tmp_path / "b").exists()  # nothing written when a site fails


def test_import_is_deterministic_in_the_seed(fake_root, tmp_path):
    for layout in ("source", "organ"):
        a = import_nuclei(fake_root, tmp_path / f"{layout}_a", layout=layout, seed=3)
        b = import_nuclei(fake_root, tmp_path / f"{layout}_b", layout=layout, seed=3)
        assert list(a) == list(b) and all(a[s].read_bytes() == b[s].read_bytes() for s in a)
    splits_by_seed = {"TNBC": set(), "MoNuSeg": set()}
    for seed in range(6):
        result = import_nuclei(fake_root, tmp_path / f"s{seed}", seed=seed)
        splits_by_seed["TNBC"].add(tuple(_ids(result["TNBC"], "test")))
        splits_by_seed["MoNuSeg"].add(tuple(_ids(result["MoNuSeg"], "validation")))
    assert len(splits_by_seed["TNBC"]) > 1 and len(splits_by_seed["MoNuSeg"]) > 1


def test_import_errors_name_the_file(fake_root, tmp_path):
    with pytest.raises(DatalistError, match="manifest.csv"):
        import_nuclei(tmp_path / "nowhere", tmp_path / "out")
    missing = fake_root / "TNBC" / "masks" / "03_2.png"
    missing.unlink()
    with pytest.raises(DatalistError, match=str(missing)):
        import_nuclei(fake_root, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(DatalistError, match="GlaS"):
        import_nuclei(fake_root, tmp_path / "out", sites=("MoNuSeg", "GlaS"))
    with pytest.raises(ValueError):
        import_nuclei(fake_root, tmp_path / "out", layout="patient")
    with pytest.raises(ValueError, match="layout='organ'"):
        import_nuclei(fake_root, tmp_path / "out", organs=["breast"])
    with pytest.raises(ValueError):
        import_nuclei(fake_root, tmp_path / "out", val_fraction=0.6, test_fraction=0.5)
    # a manifest without the slide column (source layout) or the organ column (organ layout)
    rows = _manifest(fake_root)
    for drop, layout in (("slide", "source"), ("organ", "organ")):
        with open(fake_root / "manifest.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, [c for c in COLUMNS if c != drop], extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        with pytest.raises(DatalistError, match=f"lacks column.*{drop}"):
            import_nuclei(fake_root, tmp_path / "out", layout=layout)


def test_split_never_separates_a_slide_and_too_few_slides_fail(tmp_path):
    """TNBC-like site: every seed keeps each patient's tiles together; 2 patients cannot be split 3 ways."""
    root = _fake_layout(tmp_path / "src")
    for seed in range(10):
        result = import_nuclei(root, tmp_path / f"o{seed}", seed=seed, sites=("TNBC",))
        data = json.loads(result["TNBC"].read_text())
        for split in SPLITS:
            for slide in {e["slide"] for e in data[split]}:
                assert sum(e["slide"] == slide for e in data[split]) == TNBC_TILES[int(slide[-2:]) - 1]
    rows = [r for r in _manifest(root) if r["site"] != "TNBC" or r["slide"] in ("patient_01", "patient_03")]
    with open(root / "manifest.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(DatalistError, match="TNBC.*2 slide"):
        import_nuclei(root, tmp_path / "few")


def test_cli_nuclei(fake_root, tmp_path, capsys):
    main(["data", "nuclei", "--src", str(fake_root), "--out", str(tmp_path / "o"), "--layout", "organ"])
    out = capsys.readouterr().out
    assert "stomach: skipped" in out or "organ stomach: skipped" in out
    mapping = json.loads((tmp_path / "o" / "site_datalists.json").read_text())
    assert sorted(mapping) == ["breast", "kidney", "liver"]
    with pytest.raises(SystemExit, match="fedseg data nuclei: .*stomach"):
        main(["data", "nuclei", "--src", str(fake_root), "--out", str(tmp_path / "p"), "--layout", "organ",
              "--organs", "stomach"])


REAL_ROOT = real_data_folder(DEFAULT_NUCLEI_ROOT, "FEDSEG_NUCLEI_ROOT")


@pytest.mark.skipif(not (REAL_ROOT / "manifest.csv").is_file(), reason=f"no nuclei data at {REAL_ROOT}")
def test_import_real_nuclei(tmp_path):
    before = {p: p.stat().st_mtime_ns for p in REAL_ROOT.rglob("*") if p.is_file()}
    counts = lambda res: {s: [len(json.loads(p.read_text())[k]) for k in SPLITS] for s, p in res.items()}  # noqa: E731
    source = import_nuclei(REAL_ROOT, tmp_path / "source", layout="source")
    _check_import(tmp_path / "source", REAL_ROOT.absolute(), source)
    assert {s: sum(c) for s, c in counts(source).items()} == {"MoNuSeg": 44, "TNBC": 50}
    assert counts(source)["MoNuSeg"][2] == 14  # official test split
    organ = import_nuclei(REAL_ROOT, tmp_path / "organ", layout="organ", log=lambda _: None)
    _check_import(tmp_path / "organ", REAL_ROOT.absolute(), organ)
    assert {s: sum(c) for s, c in counts(organ).items()} == {"breast": 8, "kidney": 9, "liver": 6, "prostate": 8}
    assert {s: c[2] for s, c in counts(organ).items()} == {"breast": 2, "kidney": 3, "liver": 1, "prostate": 2}
    again = import_nuclei(REAL_ROOT, tmp_path / "again", layout="source")
    assert all(source[s].read_bytes() == again[s].read_bytes() for s in source)
    load_datalist(organ["liver"], check_files=True)  # spot-check: open the smallest site's files
    assert {p: p.stat().st_mtime_ns for p in REAL_ROOT.rglob("*") if p.is_file()} == before


# ----------------------------------------------------------------------------------------------
# synthetic "nuclei" family
# ----------------------------------------------------------------------------------------------

SITES = ["site-1", "site-2", "site-3", "site-4"]


def _read_site(datalist_path: Path):
    data = json.loads(datalist_path.read_text())
    entries = [e for s in SPLITS for e in data[s]]
    images = np.stack([np.asarray(Image.open(datalist_path.parent / e["image"])) for e in entries])
    labels = np.stack([np.asarray(Image.open(datalist_path.parent / e["label"])) for e in entries])
    return data, images, labels


@pytest.fixture(scope="module")
def nuclei_tiny(tmp_path_factory):
    return generate_federation("nuclei", SITES, tmp_path_factory.mktemp("nuclei"), seed=0, profile="tiny")


def test_family_is_registered_everywhere():
    assert "nuclei" in FAMILIES and tuple(_RENDERERS) == FAMILIES
    assert set(FAMILY_CHOICES) == set(FAMILIES)


def test_nuclei_same_arguments_give_identical_files(tmp_path):
    a = generate_site_data("nuclei", "site-1", tmp_path / "a", seed=3, profile="tiny", num_images=4)
    generate_site_data("nuclei", "site-1", tmp_path / "b", seed=3, profile="tiny", num_images=4)
    files = lambda root: {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}  # noqa: E731
    assert files(tmp_path / "a") == files(tmp_path / "b") and len(files(tmp_path / "a")) == 9
    c = generate_site_data("nuclei", "site-1", tmp_path / "c", seed=4, profile="tiny", num_images=4)
    assert (a.parent / "images/000.png").read_bytes() != (c.parent / "images/000.png").read_bytes()


def test_nuclei_rgb_binary_in_band_and_patch_mode(nuclei_tiny, tmp_path):
    lo, hi = NUCLEI_FRACTION_BAND
    assert (lo, hi) == (0.10, 0.35)
    default = generate_federation("nuclei", SITES[:2], tmp_path, profile="default", num_images=4)
    for datalists, size in ((nuclei_tiny, 32), (default, 96)):
        for path in datalists.values():
            data, images, labels = _read_site(path)
            assert data["spatial_mode"] == "patch" and data["labels"] == {"0": "background", "1": "nucleus"}
            assert images.dtype == np.uint8 and images.shape[1:] == (size, size, 3)
            assert labels.shape[1:] == (size, size) and set(np.unique(labels).tolist()) == {0, 255}
            fractions = (labels > 0).mean(axis=(1, 2))
            assert fractions.min() >= lo and fractions.max() <= hi, fractions
            # nuclei are dark (hematoxylin) on lighter stroma
            assert images[labels > 0].mean() < images[labels == 0].mean() - 20
            load_datalist(path, check_files=True)


def test_nuclei_band_holds_for_many_sites(tmp_path):
    lo, hi = NUCLEI_FRACTION_BAND
    paths = generate_federation("nuclei", [f"h{i}" for i in range(12)], tmp_path, profile="tiny", num_images=3)
    for path in paths.values():
        _, _, labels = _read_site(path)
        fractions = (labels > 0).mean(axis=(1, 2))
        assert fractions.min() >= lo and fractions.max() <= hi, (path, fractions)


def test_nuclei_sites_differ_in_stain(nuclei_tiny):
    colours, anatomies = [], []
    for path in nuclei_tiny.values():
        data, images, _ = _read_site(path)
        colours.append(images.reshape(-1, 3).mean(axis=0))
        anatomies.append(data["anatomy"])
    colours = np.array(colours)
    dists = np.linalg.norm(colours[:, None] - colours[None], axis=-1)
    assert dists[np.triu_indices(len(SITES), 1)].min() > 3.0, colours
    for key in ("hematoxylin_od", "eosin_od", "nucleus_radius_px"):
        assert len({json.dumps(a[key]) for a in anatomies}) == len(SITES), key
