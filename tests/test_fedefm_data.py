"""FedEFM data: synthetic X-ray family, label-space silos, built-in phase-1/phase-2 data, importers."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from fedseg.data import DEFAULT_NUCLEI_ROOT, DEFAULT_RETINA_ROOT, DatalistError, generate_site_data, load_datalist
from fedseg.data.classification import load_classification_datalist
from fedseg.data.importers.foundation import build_foundation
from fedseg.data.importers.xray_angio import ARCADE_CLASSES, DEFAULT_XRAY_ANGIO_ROOT, arcade_crops, import_dca1
from fedseg.data.silos import (
    MIN_CLASSES_PER_SILO,
    assign_classes,
    make_silos,
    shared_count,
    write_silos,
)
from fedseg.data.synthetic import FAMILIES
from fedseg.data.synthetic.xray import DEVICES, _acquire, draw_xray_anatomy, xray_frame
from fedseg.data.synthetic.xray_builtin import (
    builtin_assignment,
    builtin_downstream_sites,
    builtin_foundation_silos,
    builtin_label_space,
    builtin_probe_sites,
    probe_label_space,
    scanner_anatomy,
    scanner_names,
)
from real_data import real_data_folder


def _files(root: Path):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _load(path: Path) -> dict:
    """A classification datalist: its JSON with the splits as the classification engine loads them."""
    return {**json.loads(Path(path).read_text()), **load_classification_datalist(path)}


def _png(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


# ---------------------------------------------------------------------------------------------
# synthetic family "xray"
# ---------------------------------------------------------------------------------------------


def test_xray_is_a_registered_family_with_native_size_patches(tmp_path):
    assert "xray" in FAMILIES
    path = generate_site_data("xray", "site-1", tmp_path, profile="tiny", num_images=4)
    data = json.loads(path.read_text())
    assert data["spatial_mode"] == "patch" and data["labels"]["1"] == "device"
    assert data["image_size"] == 64  # the family's own tiny size, not the generic 32 px
    assert data["style"] is None and "photons" in data["anatomy"]  # its acquisition chain is in the anatomy


def test_xray_same_site_is_byte_identical_and_sites_differ(tmp_path):
    kw = dict(profile="tiny", num_images=4)
    a = generate_site_data("xray", "site-1", tmp_path / "a", seed=2, **kw)
    generate_site_data("xray", "site-1", tmp_path / "b", seed=2, **kw)
    c = generate_site_data("xray", "site-2", tmp_path / "c", seed=2, **kw)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    da, dc = json.loads(a.read_text()), json.loads(c.read_text())
    # per-site contrast, dose (noise) and device thickness come from the site name
    for key in ("vessel_contrast", "photons", "catheter_width_px", "guidewire_width_px"):
        assert da["anatomy"][key] != dc["anatomy"][key]
    assert (a.parent / "images/000.png").read_bytes() != (c.parent / "images/000.png").read_bytes()


def test_xray_masks_binary_nonempty_and_aligned_with_dark_devices(tmp_path):
    path = generate_site_data("xray", "site-3", tmp_path, profile="tiny", num_images=6)
    for e in load_datalist(path)["training"] + load_datalist(path)["test"]:
        img, lab = _png(Path(e["image"])), _png(Path(e["label"]))
        assert img.ndim == 2 and img.shape == lab.shape and img.dtype == np.uint8
        assert set(np.unique(lab)) == {0, 255}
        # aligned: the devices are radio-opaque, darker than the frame under the mask
        assert img[lab > 0].mean() < np.median(img[lab == 0])


@pytest.mark.parametrize("device", DEVICES)
def test_xray_frame_masks_follow_the_device_class(device):
    anatomy = draw_xray_anatomy(np.random.default_rng(5))
    image, masks = xray_frame(np.random.default_rng([5, DEVICES.index(device)]), 96, anatomy, device)
    assert image.shape == (96, 96)
    assert np.array_equal(masks["device"], masks["catheter"] | masks["guidewire"])
    assert masks["catheter"].any() == (device in ("catheter", "both"))
    assert masks["guidewire"].any() == (device in ("guidewire", "both"))
    assert masks["vessel"].any()


def test_catheter_is_thicker_than_guidewire():
    """Distance-to-background inside the mask: twice the catheter's half width exceeds the wire's."""
    from scipy import ndimage

    anatomy = draw_xray_anatomy(np.random.default_rng(1))
    _, cath = xray_frame(np.random.default_rng(11), 256, anatomy, "catheter")
    _, wire = xray_frame(np.random.default_rng(12), 256, anatomy, "guidewire")
    thick = lambda m: ndimage.distance_transform_edt(m).max()  # noqa: E731
    assert thick(cath["catheter"]) > thick(wire["guidewire"]) + 1.0


def test_acquisition_noise_is_poisson_gaussian():
    """On a flat frame with identity tone curve: variance = level / photons + read_noise ** 2."""
    anatomy = {"blur_px": 0.0, "photons": 200.0, "read_noise": 0.02, "edge_enhance": 0.0, "contrast": 1.0, "gamma": 1.0}
    level = 0.5
    out = _acquire(np.random.default_rng(0), np.full((256, 256), level, np.float32), anatomy, 256)
    expected = level / anatomy["photons"] + anatomy["read_noise"] ** 2
    assert out.mean() == pytest.approx(level, abs=2e-3)
    assert out.var() == pytest.approx(expected, rel=0.03)


# ---------------------------------------------------------------------------------------------
# label-space silos
# ---------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    n_classes=st.integers(2, 40),
    n_silos=st.integers(1, 8),
    unseen=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31),
)
def test_assign_classes_partition_properties(n_classes, n_silos, unseen, seed):
    classes = [f"c{i}" for i in range(n_classes)]
    try:
        silos = assign_classes(classes, n_silos, unseen, seed)
    except ValueError as e:
        assert "at least" in str(e)
        # refused only when some silo really would hold too few classes
        s = shared_count(n_classes, n_silos, unseen)
        assert s + (n_classes - s) // n_silos < MIN_CLASSES_PER_SILO
        return
    assert silos == assign_classes(classes, n_silos, unseen, seed)  # deterministic
    assert len(silos) == n_silos
    held = [set(s) for s in silos]
    assert set().union(*held) == set(classes)  # each class somewhere
    counts = {c: sum(c in h for h in held) for c in classes}
    shared = {c for c, k in counts.items() if k == n_silos and n_silos > 1}
    private = {c for c, k in counts.items() if k == 1}
    if n_silos > 1:
        assert shared | private == set(classes)  # a class is in one silo or in all of them
    # S = round(C (1 - u) / (M u + 1 - u)), halves up, written out here rather than calling shared_count
    n_shared = n_classes if unseen == 0 else int(math.floor(n_classes * (1 - unseen) / (n_silos * unseen + 1 - unseen) + 0.5))
    assert shared_count(n_classes, n_silos, unseen) == n_shared
    assert len(shared) == (n_shared if n_silos > 1 else 0)
    priv_counts = [len(h - shared) for h in held]
    assert max(priv_counts) - min(priv_counts) <= 1  # round robin
    for s, h in zip(silos, held):
        assert len(h) >= MIN_CLASSES_PER_SILO
        assert s == [c for c in classes if c in h]  # in global order
        if n_silos > 1:
            # private share of each silo is the unseen proportion up to rounding (two counts off by < 1 each)
            frac = len(h - shared) / len(h)
            assert abs(frac - unseen) <= 2.0 / len(h) + 1e-9


@pytest.mark.parametrize("n_silos", [2, 3, 4])
def test_assign_classes_closed_forms(n_silos):
    classes = [f"c{i}" for i in range(4 * n_silos)]
    disjoint = assign_classes(classes, n_silos, 1.0, seed=3)
    assert sum(len(s) for s in disjoint) == len(classes) and all(len(s) == 4 for s in disjoint)
    assert all(s == classes for s in assign_classes(classes, n_silos, 0.0, seed=3))
    half = assign_classes(classes, n_silos, 0.5, seed=3)
    # C = 4M, u = 1/2: S* = 4M / (M + 1); every silo holds S shared + (C - S) / M private
    s = round(4 * n_silos / (n_silos + 1))
    shared = set.intersection(*map(set, half))
    assert len(shared) == s
    for silo in half:
        assert abs((len(silo) - s) / len(silo) - 0.5) <= 1.0 / len(silo)


def test_assign_classes_rejects_bad_input():
    with pytest.raises(ValueError, match="unseen"):
        assign_classes(["a", "b"], 1, 1.5)
    with pytest.raises(ValueError, match="duplicate"):
        assign_classes(["a", "a"], 1, 1.0)
    with pytest.raises(ValueError, match="at least 2"):
        assign_classes(["a", "b", "c"], 2, 1.0)  # disjoint: one silo would hold one class
    with pytest.raises(ValueError, match="n_silos"):
        assign_classes(["a", "b"], 0, 1.0)


def test_make_and_write_silos_keep_groups_together_and_share_the_label_space(tmp_path):
    items = []
    for c in "abcdef":
        for g in range(8):  # 8 patients per class, 2 images each
            for j in range(2):
                items.append({"image": str(tmp_path / "src" / f"{c}_{g}_{j}.png"), "label": c, "group": f"{c}{g}"})
    silos = make_silos(items, ["s1", "s2"], unseen=0.5, seed=1)
    space = list("abcdef")
    seen = {}
    for site, d in silos.items():
        assert d["label_space"] == space and d["task"] == "classification"
        for split in ("training", "validation", "test"):
            assert d[split], (site, split)
            for e in d[split]:
                assert space[e["label"]] in d["classes"]
                group = Path(e["image"]).stem.rsplit("_", 1)[0]
                # one patient: one silo, one split; no image twice
                assert seen.setdefault(group, (site, split)) == (site, split)
    all_images = [e["image"] for d in silos.values() for sp in ("training", "validation", "test") for e in d[sp]]
    assert len(all_images) == len(set(all_images)) == len(items)
    (tmp_path / "src").mkdir()
    for it in items:
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(it["image"])
    paths = write_silos(silos, tmp_path / "out")
    index = json.loads((tmp_path / "out" / "site_datalists.json").read_text())
    assert set(index) == {"s1", "s2"}
    loaded = _load(paths["s1"])
    assert loaded["label_space"] == space
    assert all(Path(e["image"]).is_file() for e in loaded["training"])


def test_make_silos_errors_name_the_problem(tmp_path):
    items = [{"image": f"/x/{c}{i}.png", "label": c} for c in "ab" for i in range(2)]
    with pytest.raises(ValueError, match="need at least 3"):
        make_silos(items, ["s1"], unseen=1.0)
    with pytest.raises(ValueError, match="not in the label space"):
        make_silos(items, ["s1"], label_space=["a"])


# ---------------------------------------------------------------------------------------------
# built-in phase-1 silos and phase-2 sites
# ---------------------------------------------------------------------------------------------

SITES = ["site-1", "site-2", "site-3"]


@pytest.fixture(scope="module")
def foundation_full(tmp_path_factory):
    root = tmp_path_factory.mktemp("foundation")
    return root, builtin_foundation_silos(root, SITES, unseen=0.5, seed=4, profile="tiny")


def test_builtin_label_space_is_scanners_times_devices():
    space = builtin_label_space(3)
    assert len(space) == 12 and space[0] == "xray/scanner-1/none" and space[-1] == "xray/scanner-3/both"
    assert scanner_names(2) == ["scanner-1", "scanner-2"]


def test_foundation_silos_balanced_and_labelled_in_the_global_space(foundation_full):
    root, paths = foundation_full
    assignment = builtin_assignment(SITES, unseen=0.5, seed=4)
    space = builtin_label_space(3)
    for site, path in paths.items():
        d = _load(path)
        assert d["label_space"] == space and d["classes"] == assignment[site]
        for split, n_expected in (("training", 2), ("validation", 1), ("test", 1)):  # tiny: 4 per class
            labels = [e["label"] for e in d[split]]
            assert sorted(set(labels)) == sorted(space.index(c) for c in assignment[site])
            assert all(labels.count(l) == n_expected for l in set(labels))
        for e in d["training"][:3]:
            assert _png(Path(e["image"])).shape == (64, 64)
    assert json.loads((root / "site_datalists.json").read_text()).keys() == set(SITES)


def test_only_site_agrees_with_the_full_generation(foundation_full, tmp_path):
    root, paths = foundation_full
    one = builtin_foundation_silos(tmp_path, SITES, unseen=0.5, seed=4, profile="tiny", only_site="site-2")
    assert list(one) == ["site-2"]
    assert not (tmp_path / "site-1").exists() and not (tmp_path / "site_datalists.json").exists()
    assert _files(tmp_path / "site-2") == _files(root / "site-2")
    with pytest.raises(ValueError, match="only_site"):
        builtin_foundation_silos(tmp_path, SITES, only_site="site-9", profile="tiny")


def test_shared_class_gets_different_images_in_each_silo(tmp_path):
    paths = builtin_foundation_silos(tmp_path, SITES[:2], unseen=0.0, profile="tiny", n_per_class=3)
    a = _files(paths["site-1"].parent / "images")
    b = _files(paths["site-2"].parent / "images")
    assert a.keys() == b.keys() and all(a[k] != b[k] for k in a)


def test_foundation_generation_is_reused_when_complete(foundation_full):
    root, paths = foundation_full
    before = paths["site-1"].stat().st_mtime_ns
    builtin_foundation_silos(root, SITES, unseen=0.5, seed=4, profile="tiny", only_site="site-1")
    assert paths["site-1"].stat().st_mtime_ns == before


def test_downstream_sites_use_unseen_scanner_styles_and_binary_masks(tmp_path):
    paths = builtin_downstream_sites(tmp_path, ["scanner-1", "hospital"], profile="tiny", target="guidewire")
    phase1 = [scanner_anatomy(s) for s in scanner_names(3)]
    for site, path in paths.items():
        data = json.loads(path.read_text())
        assert data["anatomy"] not in phase1  # even a site named like a phase-1 scanner gets its own style
        assert data["spatial_mode"] == "patch"
        dl = load_datalist(path)
        for e in dl["training"] + dl["validation"] + dl["test"]:
            lab = _png(Path(e["label"]))
            assert set(np.unique(lab)) == {0, 255}
    with pytest.raises(ValueError, match="target"):
        builtin_downstream_sites(tmp_path, ["x"], target="stent")


def test_probe_sites_hold_every_device_class_on_the_downstream_style(tmp_path):
    probe = builtin_probe_sites(tmp_path / "p", ["h1", "h2"], profile="tiny", n_per_class=3)
    seg = builtin_downstream_sites(tmp_path / "s", ["h1"], profile="tiny", num_images=3)
    d = _load(probe["h1"])
    assert d["label_space"] == d["classes"] == probe_label_space() == [f"device/{x}" for x in DEVICES]
    assert sorted({e["label"] for e in d["training"]}) == [0, 1, 2, 3]
    assert d["scanners"]["h1"] == json.loads(seg["h1"].read_text())["anatomy"]  # same scanner style
    one = builtin_probe_sites(tmp_path / "one", ["h1", "h2"], profile="tiny", n_per_class=3, only_site="h2")
    assert _files(one["h2"].parent) == _files(probe["h2"].parent)


def test_builtin_bad_input(tmp_path):
    with pytest.raises(ValueError, match="n_per_class"):
        builtin_foundation_silos(tmp_path, SITES, profile="tiny", n_per_class=2)
    with pytest.raises(ValueError, match="profile"):
        builtin_foundation_silos(tmp_path, SITES, profile="huge")
    with pytest.raises(ValueError, match="duplicate"):
        builtin_foundation_silos(tmp_path, ["a", "a"], profile="tiny")


# ---------------------------------------------------------------------------------------------
# real-data importers (skipped where the shared data is absent) and the phase-1 assembly
# ---------------------------------------------------------------------------------------------

XRAY_ROOT = real_data_folder(DEFAULT_XRAY_ANGIO_ROOT, "FEDSEG_XRAY_ANGIO_ROOT")
RETINA_ROOT = real_data_folder(DEFAULT_RETINA_ROOT, "FEDSEG_RETINA_ROOT")
NUCLEI_ROOT = real_data_folder(DEFAULT_NUCLEI_ROOT, "FEDSEG_NUCLEI_ROOT")
needs_xray = pytest.mark.skipif(not (XRAY_ROOT / "manifest.csv").is_file(), reason="xray_angio data not available")
needs_all = pytest.mark.skipif(
    not all((r / "manifest.csv").is_file() for r in (XRAY_ROOT, RETINA_ROOT, NUCLEI_ROOT)), reason="shared data not available"
)


@needs_xray
def test_dca1_import_reads_in_place_with_image_level_disjoint_splits(tmp_path):
    paths = import_dca1(XRAY_ROOT, tmp_path, sites=["a", "b"], seed=1, limit=12)
    ids = []
    for site, path in paths.items():
        data = json.loads(path.read_text())
        assert data["spatial_mode"] == "patch" and "image-level" in data["split_rule"]
        dl = load_datalist(path, check_files=True)  # binary masks, sizes agree
        for split in ("training", "validation", "test"):
            assert dl[split]
            for e in dl[split]:
                assert Path(e["image"]).is_relative_to(XRAY_ROOT.absolute())  # referenced, never copied
                ids.append(e["id"])
    assert len(ids) == len(set(ids)) == 12
    again = import_dca1(XRAY_ROOT, tmp_path / "again", sites=["a", "b"], seed=1, limit=12)
    assert json.loads(again["a"].read_text())["training"] == json.loads(paths["a"].read_text())["training"]
    assert not any(p.suffix == ".png" for p in tmp_path.rglob("*"))


@needs_xray
def test_dca1_mask_check_catches_a_mispaired_mask(tmp_path):
    """A copy of the source folder (in tmp) whose manifest pairs image 1 with mask 2."""
    import csv

    rows = [r for r in csv.DictReader(open(XRAY_ROOT / "manifest.csv")) if r["site"] == "DCA1"][:4]
    rows[0]["mask"] = rows[1]["mask"]
    with open(tmp_path / "manifest.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "DCA1").symlink_to(XRAY_ROOT / "DCA1")
    with pytest.raises(DatalistError, match="foreground fraction"):
        import_dca1(tmp_path, tmp_path / "out")


@needs_xray
def test_arcade_crops_one_class_per_angiogram_and_stenosis_inside(tmp_path):
    items = arcade_crops(XRAY_ROOT, tmp_path, crop_size=96, seed=0, limit=8)
    labels = [it["label"] for it in items]
    assert set(labels) == set(ARCADE_CLASSES) and abs(labels.count(ARCADE_CLASSES[0]) - labels.count(ARCADE_CLASSES[1])) <= 1
    by_group = {}
    for it in items:
        assert by_group.setdefault(it["group"], it["label"]) == it["label"]
        crop = _png(Path(it["image"]))
        y0, x0, size = it["box"]
        assert crop.shape == (96, 96) and Path(it["image"]).is_relative_to(tmp_path)
        angiogram_id = it["id"].split("/")[0]
        mask = _png(XRAY_ROOT / "ARCADE" / "masks" / f"{angiogram_id}.png")[y0 : y0 + size, x0 : x0 + size] > 0
        source = _png(XRAY_ROOT / "ARCADE" / "images" / f"{angiogram_id}.jpg")[y0 : y0 + size, x0 : x0 + size]
        assert np.array_equal(crop, source)  # the crop is exactly that window of the angiogram
        assert mask.any() == (it["label"] == "arcade/stenosis")


@needs_all
def test_build_foundation_from_real_labels(tmp_path):
    paths = build_foundation(
        tmp_path, ["s1", "s2", "s3"], unseen=1.0, retina=RETINA_ROOT, nuclei=NUCLEI_ROOT, arcade=XRAY_ROOT,
        profile="tiny", n_per_class=3, arcade_limit=12, log=lambda line: None,
    )
    meta = json.loads((tmp_path / "label_space.json").read_text())
    space = meta["label_space"]
    assert {"retina/DRIVE", "nuclei/tnbc", "arcade/stenosis", "xray/scanner-3/both"} <= set(space)
    assert "nuclei/monuseg-brain" in meta["skipped"]  # 2 slides cannot fill three splits
    held = [set(_load(p)["classes"]) for p in paths.values()]
    assert set().union(*held) == set(space) and sum(map(len, held)) == len(space)  # unseen 1.0: disjoint
    for p in paths.values():
        d = _load(p)
        assert d["label_space"] == space
        images = [e["image"] for s in ("training", "validation", "test") for e in d[s]]
        assert all(Path(i).is_file() for i in images)
        # real images are referenced in place; only ARCADE crops and built-in images are generated under out
        for i in images:
            inside = Path(i).is_relative_to(tmp_path)
            assert inside or any(Path(i).is_relative_to(r.absolute()) for r in (RETINA_ROOT, NUCLEI_ROOT))


def test_cli_foundation_builtin_only_and_clear_errors(tmp_path, capsys):
    from fedseg.cli import main

    main(["data", "foundation", "--out", str(tmp_path / "f"), "--sites", "2", "--profile", "tiny", "--n-per-class", "3"])
    index = json.loads((tmp_path / "f" / "site_datalists.json").read_text())
    assert set(index) == {"silo-1", "silo-2"}
    assert len(json.loads((tmp_path / "f" / "label_space.json").read_text())["label_space"]) == 8
    with pytest.raises(SystemExit, match="at least 2"):
        main(["data", "foundation", "--out", str(tmp_path / "g"), "--sites", "5", "--xray-scanners", "1"])


def test_no_source_images_in_the_repository():
    """No tracked file has the bytes of a shared source image (data is read by path, never copied)."""
    repo = Path(__file__).resolve().parents[1]
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout.split()
        files = [repo / f for f in tracked]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in repo.rglob("*") if ".git" not in p.parts]
    suffixes = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".bmp"}
    ours = {hashlib.sha1(p.read_bytes()).hexdigest() for p in files if p.suffix.lower() in suffixes and p.is_file()}
    shared = [r for r in (XRAY_ROOT, RETINA_ROOT, NUCLEI_ROOT) if r.is_dir()]
    if not shared or not ours:
        return
    sources = {hashlib.sha1(p.read_bytes()).hexdigest() for r in shared for p in r.rglob("*") if p.suffix.lower() in suffixes}
    assert not ours & sources


@needs_xray
def test_arcade_pixel_identical_duplicates_share_a_group(tmp_path):
    """A manifest listing one angiogram under two ids (as the source does for some): one group, one class."""
    import csv

    rows = [r for r in csv.DictReader(open(XRAY_ROOT / "manifest.csv")) if r["site"] == "ARCADE"][:3]
    rows.append({**rows[0], "id": "train_9999"})
    with open(tmp_path / "manifest.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "ARCADE").symlink_to(XRAY_ROOT / "ARCADE")
    items = arcade_crops(tmp_path, tmp_path / "out", crop_size=64, limit=None)
    groups = {it["id"].split("/")[0]: (it["group"], it["label"]) for it in items}
    assert groups["train_9999"] == groups[rows[0]["id"]]
    assert len({g for g, _ in groups.values()}) == 3
