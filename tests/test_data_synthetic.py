"""Synthetic multi-site generators: determinism, heterogeneity, bands, splits and caching."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from scipy import ndimage

from fedseg.data import PROFILES, generate_federation, generate_site_data, load_datalist
from fedseg.data.synthetic.files import split_counts as _split_counts

SITES = ["site-1", "site-2", "site-3", "site-4"]


def _entries(datalist_path: Path):
    data = json.loads(datalist_path.read_text())
    return data, [e for split in ("training", "validation", "test") for e in data[split]]


def _read_site(datalist_path: Path):
    """(images uint8 (N, H, W, 3), labels uint8 (N, H, W)) in datalist order."""
    _, entries = _entries(datalist_path)
    images = np.stack([np.asarray(Image.open(datalist_path.parent / e["image"])) for e in entries])
    labels = np.stack([np.asarray(Image.open(datalist_path.parent / e["label"])) for e in entries])
    return images, labels


def _files(root: Path):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def vessel_tiny(tmp_path_factory):
    return generate_federation("vessel", SITES, tmp_path_factory.mktemp("vessel"), seed=0, profile="tiny")


@pytest.fixture(scope="module")
def polyp_tiny(tmp_path_factory):
    return generate_federation("polyp", SITES, tmp_path_factory.mktemp("polyp"), seed=0, profile="tiny")


@pytest.fixture(scope="module")
def vessel_default(tmp_path_factory):
    """Default image size (96 px), fewer images than the profile draws to keep the test light."""
    return generate_federation("vessel", SITES[:2], tmp_path_factory.mktemp("vd"), profile="default", num_images=8)


@pytest.fixture(scope="module")
def polyp_default(tmp_path_factory):
    return generate_federation("polyp", SITES[:2], tmp_path_factory.mktemp("pd"), profile="default", num_images=8)


@pytest.mark.parametrize("family", ["vessel", "polyp"])
def test_same_arguments_give_byte_identical_files(tmp_path, family):
    a = generate_site_data(family, "site-1", tmp_path / "a", seed=3, profile="tiny")
    b = generate_site_data(family, "site-1", tmp_path / "b", seed=3, profile="tiny")
    assert a.relative_to(tmp_path / "a") == b.relative_to(tmp_path / "b")
    files_a, files_b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert files_a.keys() == files_b.keys() and len(files_a) > 10
    assert files_a == files_b


@pytest.mark.parametrize("family", ["vessel", "polyp"])
def test_different_seed_or_site_gives_different_images(tmp_path, family):
    kw = dict(profile="tiny", num_images=4)
    base = generate_site_data(family, "site-1", tmp_path / "base", seed=0, **kw)
    other_seed = generate_site_data(family, "site-1", tmp_path / "seed", seed=1, **kw)
    other_site = generate_site_data(family, "site-2", tmp_path / "site", seed=0, **kw)
    img = lambda p: (p.parent / "images" / "000.png").read_bytes()  # noqa: E731
    assert img(base) != img(other_seed)
    assert img(base) != img(other_site)


def test_sites_differ_measurably(vessel_tiny, polyp_tiny):
    for datalists in (vessel_tiny, polyp_tiny):
        colours, fractions, counts = [], [], []
        for path in datalists.values():
            images, labels = _read_site(path)
            colours.append(images.reshape(-1, 3).mean(axis=0))
            fractions.append((labels > 0).mean())
            counts.append(len(images))
        colours = np.array(colours)
        # every pair of sites differs in mean colour by more than a few grey levels
        dists = np.linalg.norm(colours[:, None] - colours[None], axis=-1)
        assert dists[np.triu_indices(len(SITES), 1)].min() > 3.0, colours
        assert len(set(counts)) > 1, counts
        assert np.ptp(fractions) > 0.005, fractions
        lo, hi = PROFILES["tiny"]["num_images"]
        assert all(lo <= c <= hi for c in counts)


def test_style_recorded_and_differs(vessel_tiny):
    styles = [json.loads(p.read_text())["style"] for p in vessel_tiny.values()]
    for style in styles:
        assert set(style) >= {"gain", "brightness", "contrast", "gamma", "noise_sigma", "blur_sigma"}
    assert len({json.dumps(s, sort_keys=True) for s in styles}) == len(styles)


def _fov(image: np.ndarray) -> np.ndarray:
    """The generator keeps the outside of the aperture exactly black."""
    return ndimage.binary_fill_holes(image.max(axis=-1) > 0)


def test_vessel_masks_binary_and_in_band(vessel_default):
    for path in vessel_default.values():
        images, labels = _read_site(path)
        assert images.dtype == np.uint8 and images.shape[1:] == (96, 96, 3)
        assert labels.dtype == np.uint8 and labels.shape[1:] == (96, 96)
        assert set(np.unique(labels).tolist()) == {0, 255}
        for image, label in zip(images, labels):
            fov = _fov(image)
            assert not (label.astype(bool) & ~fov).any()
            fraction = (label > 0).sum() / fov.sum()
            assert 0.05 <= fraction <= 0.15, (path, fraction)


def test_vessel_band_holds_at_tiny_size(vessel_tiny):
    for path in vessel_tiny.values():
        images, labels = _read_site(path)
        assert labels.shape[1:] == (32, 32) and set(np.unique(labels).tolist()) == {0, 255}
        for image, label in zip(images, labels):
            assert 0.05 <= (label > 0).sum() / _fov(image).sum() <= 0.15


def test_polyp_masks_binary_and_in_band(polyp_default):
    for path in polyp_default.values():
        images, labels = _read_site(path)
        assert set(np.unique(labels).tolist()) == {0, 255}
        fractions = (labels > 0).mean(axis=(1, 2))
        assert fractions.min() >= 0.03 and fractions.max() <= 0.30, fractions


def test_splits_nonempty_disjoint_and_complete(vessel_tiny):
    for path in vessel_tiny.values():
        data, entries = _entries(path)
        sizes = [len(data[s]) for s in ("training", "validation", "test")]
        assert min(sizes) >= 1 and sum(sizes) == data["num_images"]
        images = [e["image"] for e in entries]
        assert len(set(images)) == len(images)
        on_disk = sorted(p.name for p in (path.parent / "images").iterdir())
        assert sorted(Path(i).name for i in images) == on_disk
        assert all(not Path(e["image"]).is_absolute() for e in entries)
        loaded = load_datalist(path, check_files=True)
        assert all(Path(e["image"]).is_absolute() for e in loaded["training"])


def test_second_call_is_a_noop(tmp_path):
    path = generate_site_data("polyp", "site-1", tmp_path, profile="tiny")
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    start = time.perf_counter()
    again = generate_site_data("polyp", "site-1", tmp_path, profile="tiny")
    assert time.perf_counter() - start < 0.5
    assert again == path
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == stamps


def test_regenerates_on_changed_fingerprint_and_removes_stale_files(tmp_path):
    generate_site_data("vessel", "s", tmp_path, profile="tiny", num_images=6)
    path = generate_site_data("vessel", "s", tmp_path, profile="tiny", num_images=4)
    assert sorted(p.name for p in (path.parent / "images").iterdir()) == ["000.png", "001.png", "002.png", "003.png"]
    assert json.loads(path.read_text())["num_images"] == 4
    load_datalist(path)


def test_incomplete_folder_is_regenerated(tmp_path):
    path = generate_site_data("vessel", "s", tmp_path, profile="tiny", num_images=4)
    reference = _files(tmp_path)
    # a crash after some images but before the datalist: no datalist, a truncated PNG
    path.unlink()
    (path.parent / "images" / "001.png").write_bytes(b"\x89PNG")
    assert generate_site_data("vessel", "s", tmp_path, profile="tiny", num_images=4) == path
    assert _files(tmp_path) == reference
    # a missing image behind an intact datalist is also noticed
    (path.parent / "labels" / "002.png").unlink()
    generate_site_data("vessel", "s", tmp_path, profile="tiny", num_images=4)
    assert _files(tmp_path) == reference


def test_image_count_override_keeps_style(tmp_path):
    a = json.loads(generate_site_data("polyp", "x", tmp_path / "a", profile="tiny").read_text())
    b = json.loads(generate_site_data("polyp", "x", tmp_path / "b", profile="tiny", num_images=5).read_text())
    assert a["style"] == b["style"] and b["num_images"] == 5
    # image i does not depend on how many images the site has
    assert (tmp_path / "a/polyp/x/images/003.png").read_bytes() == (tmp_path / "b/polyp/x/images/003.png").read_bytes()


def test_image_size_override(tmp_path):
    path = generate_site_data("vessel", "site-9", tmp_path, profile="tiny", image_size=48, num_images=3)
    images, labels = _read_site(path)
    assert images.shape == (3, 48, 48, 3) and labels.shape == (3, 48, 48)


def test_federation_of_many_sites_and_bad_names(tmp_path):
    sites = [f"site-{i}" for i in range(1, 8)] + ["hospital_a"]
    out = generate_federation("polyp", sites, tmp_path, profile="tiny", num_images=3)
    assert list(out) == sites
    assert all(p == tmp_path / "polyp" / s / "datalist.json" for s, p in out.items())
    with pytest.raises(ValueError):
        generate_federation("polyp", ["a", "a"], tmp_path, profile="tiny")
    for bad in ["", "a/b", "..", "x\\y"]:
        with pytest.raises(ValueError):
            generate_site_data("polyp", bad, tmp_path, profile="tiny")
    with pytest.raises(ValueError):
        generate_site_data("nope", "a", tmp_path)
    with pytest.raises(ValueError):
        generate_site_data("vessel", "a", tmp_path, profile="huge")
    with pytest.raises(ValueError):
        generate_site_data("vessel", "a", tmp_path, profile="tiny", num_images=2)


@pytest.mark.parametrize("family", ["vessel", "polyp"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(site=st.text(st.characters(codec="ascii", categories=["L", "N"], include_characters="-_."), min_size=1, max_size=12).filter(lambda s: s not in (".", "..")))
def test_any_site_name_yields_a_valid_in_band_site(tmp_path, family, site):
    path = generate_site_data(family, site, tmp_path, profile="tiny", num_images=3)
    data = json.loads(path.read_text())
    assert data["site"] == site and path.parent.name == site
    loaded = load_datalist(path, check_files=True)
    assert all(len(v) >= 1 for v in loaded.values())
    images, labels = _read_site(path)
    for image, label in zip(images, labels):
        if family == "vessel":
            assert 0.05 <= (label > 0).sum() / _fov(image).sum() <= 0.15
        else:
            assert 0.03 <= (label > 0).mean() <= 0.30


@given(n=st.integers(3, 500), val=st.floats(0.0, 0.4), test=st.floats(0.0, 0.4))
def test_split_counts_always_nonempty(n, val, test):
    counts = _split_counts(n, (1.0 - val - test, val, test))
    assert sum(counts) == n and min(counts) >= 1
