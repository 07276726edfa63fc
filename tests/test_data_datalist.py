"""Datalist loading/validation: every failure is a DatalistError naming the offending file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fedseg.data import DatalistError, load_datalist, monai_reader_name, read_array, summarise_datalist, validate_pair


def _png(path: Path, arr: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return path


def _rgb(h: int = 16, w: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _mask(h: int = 16, w: int = 12, values=(0, 255)) -> np.ndarray:
    m = np.full((h, w), values[0], np.uint8)
    m[4:10, 3:8] = values[-1]
    return m


def _make_site(root: Path, n: int = 3) -> Path:
    """A valid datalist with n pairs per split, relative paths; returns the datalist path."""
    data = {}
    for split in ("training", "validation", "test"):
        entries = []
        for i in range(n):
            name = f"{split}_{i}.png"
            _png(root / "images" / name, _rgb(seed=i))
            _png(root / "labels" / name, _mask())
            entries.append({"image": f"images/{name}", "label": f"labels/{name}"})
        data[split] = entries
    path = root / "datalist.json"
    path.write_text(json.dumps(data))
    return path


def _edit(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def _raises_naming(fragment, fn, *args, **kw) -> str:
    with pytest.raises(DatalistError) as info:
        fn(*args, **kw)
    message = str(info.value)
    assert str(fragment) in message, message
    return message


# ---------------------------------------------------------------------------------------------
# the good path
# ---------------------------------------------------------------------------------------------


def test_valid_datalist_loads_with_absolute_paths(tmp_path):
    path = _make_site(tmp_path)
    loaded = load_datalist(path)
    assert set(loaded) == {"training", "validation", "test"}
    for entries in loaded.values():
        assert len(entries) == 3
        for e in entries:
            assert os.path.isabs(e["image"]) and Path(e["image"]).is_file()
            assert Path(e["label"]).parent == tmp_path / "labels"
    # the folder works as well as the file
    assert load_datalist(tmp_path) == loaded


def test_absolute_paths_are_kept_and_extra_keys_pass_through(tmp_path):
    other = tmp_path / "elsewhere"
    img, lab = _png(other / "x.png", _rgb()), _png(other / "y.png", _mask())
    path = _make_site(tmp_path / "site")
    _edit(path, lambda d: d["training"].append({"image": str(img), "label": str(lab), "id": "case-7"}))
    entry = load_datalist(path)["training"][-1]
    assert entry == {"image": str(img), "label": str(lab), "id": "case-7"}


def test_resolution_matches_monai(tmp_path):
    from monai.data import load_decathlon_datalist

    path = _make_site(tmp_path)
    _edit(path, lambda d: d["test"][0].update({"id": "nothing-here", "extra": "images/test_0.png"}))
    ours = load_datalist(path, check_files=False)
    for split in ("training", "validation", "test"):
        assert ours[split] == load_decathlon_datalist(str(path), True, split)


def test_splits_argument_limits_the_required_splits(tmp_path):
    path = _make_site(tmp_path)
    _edit(path, lambda d: d.pop("validation"))
    assert set(load_datalist(path, splits=("training", "test"))) == {"training", "test"}


def test_masks_01_and_all_zero_are_binary(tmp_path):
    img = _png(tmp_path / "i.png", _rgb())
    assert validate_pair(img, _png(tmp_path / "a.png", _mask(values=(0, 1))))["foreground_fraction"] > 0
    assert validate_pair(img, _png(tmp_path / "b.png", np.zeros((16, 12), np.uint8)))["foreground_fraction"] == 0
    info = validate_pair(img, _png(tmp_path / "c.png", _mask()))
    assert info == {"spatial_shape": (16, 12), "channels": 3, "foreground_fraction": 30 / 192}


# ---------------------------------------------------------------------------------------------
# error cases
# ---------------------------------------------------------------------------------------------


def test_missing_datalist(tmp_path):
    _raises_naming(tmp_path / "nope.json", load_datalist, tmp_path / "nope.json")


def test_invalid_json(tmp_path):
    path = tmp_path / "datalist.json"
    path.write_text('{"training": [')
    msg = _raises_naming(path, load_datalist, path)
    assert "invalid JSON" in msg
    path.write_text("[1, 2]")
    _raises_naming(path, load_datalist, path)


def test_missing_and_empty_split(tmp_path):
    path = _make_site(tmp_path)
    _edit(path, lambda d: d.update(validation=[]))
    msg = _raises_naming(path, load_datalist, path)
    assert f"split 'validation' in {path} is empty" in msg
    _edit(path, lambda d: (d.update(validation=d["training"][:1]), d["training"].pop(0), d.pop("test")))
    assert "split 'test' missing" in _raises_naming(path, load_datalist, path)


def test_entry_without_label(tmp_path):
    path = _make_site(tmp_path)
    _edit(path, lambda d: d["training"][1].pop("label"))
    assert "training[1]" in _raises_naming(path, load_datalist, path)


@pytest.mark.parametrize("check_files", [True, False])
def test_missing_image_file(tmp_path, check_files):
    path = _make_site(tmp_path)
    (tmp_path / "images" / "validation_2.png").unlink()
    msg = _raises_naming(tmp_path / "images" / "validation_2.png", load_datalist, path, check_files=check_files)
    assert "validation[2]" in msg and str(path) in msg


def test_truncated_png(tmp_path):
    path = _make_site(tmp_path)
    bad = tmp_path / "images" / "training_1.png"
    bad.write_bytes(bad.read_bytes()[:200])
    _raises_naming(bad, load_datalist, path)
    _raises_naming(bad, validate_pair, bad, tmp_path / "labels" / "training_1.png")
    # existence-only checking does not open files
    load_datalist(path, check_files=False)


def test_garbage_bytes_label(tmp_path):
    path = _make_site(tmp_path)
    bad = tmp_path / "labels" / "test_0.png"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 500, dtype=np.uint8).tobytes())
    assert "test[0]" in _raises_naming(bad, load_datalist, path)


def test_size_mismatch(tmp_path):
    img = _png(tmp_path / "img.png", _rgb(16, 12))
    lab = _png(tmp_path / "lab.png", _mask(12, 16))
    msg = _raises_naming(lab, validate_pair, img, lab)
    assert str(img) in msg and "mismatch" in msg


def test_non_binary_mask_names_values(tmp_path):
    img = _png(tmp_path / "img.png", _rgb())
    m = _mask()
    m[0, 0] = 128
    lab = _png(tmp_path / "lab.png", m)
    msg = _raises_naming(lab, validate_pair, img, lab)
    assert "0, 128, 255" in msg


def test_rgb_mask_is_refused(tmp_path):
    img = _png(tmp_path / "img.png", _rgb())
    lab = _png(tmp_path / "lab.png", np.repeat(_mask()[..., None], 3, axis=-1))
    assert "single-channel" in _raises_naming(lab, validate_pair, img, lab)


def test_unsupported_format(tmp_path):
    img = tmp_path / "img.xyz"
    img.write_bytes(b"abc")
    _raises_naming(img, validate_pair, img, _png(tmp_path / "lab.png", _mask()))


def test_same_image_in_two_splits(tmp_path):
    path = _make_site(tmp_path)
    _edit(path, lambda d: d["test"].append(d["training"][0]))
    msg = _raises_naming(tmp_path / "images" / "training_0.png", load_datalist, path, check_files=False)
    assert "training[0]" in msg and "test[3]" in msg


def test_bad_fov_mask(tmp_path):
    path = _make_site(tmp_path)
    fov = _png(tmp_path / "fov.png", np.full((10, 10), 255, np.uint8))
    _edit(path, lambda d: d["training"][0].update(fov="fov.png"))
    _raises_naming(fov, load_datalist, path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.sets(st.integers(0, 255), min_size=1, max_size=5))
def test_binary_rule(tmp_path, values):
    values = sorted(values)
    mask = np.resize(np.array(values, np.uint8), (16, 12))
    img = _png(tmp_path / "img.png", _rgb())
    lab = _png(tmp_path / "lab.png", mask)
    allowed = set(values) <= {0, 1} or set(values) <= {0, 255} or values == [0]
    if allowed:
        validate_pair(img, lab)
    else:
        _raises_naming(lab, validate_pair, img, lab)


# ---------------------------------------------------------------------------------------------
# formats
# ---------------------------------------------------------------------------------------------


def test_nifti_pair(tmp_path):
    rng = np.random.default_rng(0)
    image = rng.normal(size=(10, 12, 6)).astype(np.float32)
    label = (rng.random((10, 12, 6)) > 0.8).astype(np.uint8)
    nib.save(nib.Nifti1Image(image, np.eye(4)), tmp_path / "img.nii.gz")
    nib.save(nib.Nifti1Image(label, np.eye(4)), tmp_path / "lab.nii")
    info = validate_pair(tmp_path / "img.nii.gz", tmp_path / "lab.nii")
    assert info["spatial_shape"] == (10, 12, 6) and info["channels"] == 1
    assert info["foreground_fraction"] == pytest.approx(label.mean())
    (tmp_path / "bad.nii.gz").write_bytes(b"\x1f\x8b not really gzip")
    _raises_naming(tmp_path / "bad.nii.gz", validate_pair, tmp_path / "bad.nii.gz", tmp_path / "lab.nii")


def test_tiff_jpeg_gif_inputs(tmp_path):
    tifffile.imwrite(tmp_path / "img.tif", _rgb(), photometric="rgb")
    Image.fromarray(_rgb()).save(tmp_path / "img.jpg", quality=90)
    Image.fromarray(_mask(values=(0, 255))).convert("P").save(tmp_path / "lab.gif")
    for image in ("img.tif", "img.jpg"):
        info = validate_pair(tmp_path / image, tmp_path / "lab.gif")
        assert info["spatial_shape"] == (16, 12) and info["channels"] == 3


def test_reading_agrees_with_monai_loadimage(tmp_path):
    """What we accept is what the engine's LoadImage(reader=monai_reader_name(f)) loads."""
    from monai.transforms import LoadImage

    tifffile.imwrite(tmp_path / "a.tif", _rgb(), photometric="rgb")
    _png(tmp_path / "b.png", _mask())
    Image.fromarray(_mask(values=(0, 255))).convert("P").save(tmp_path / "c.gif")
    Image.fromarray(_rgb()).save(tmp_path / "d.jpg")
    nib.save(nib.Nifti1Image(np.arange(60, dtype=np.float32).reshape(3, 4, 5), np.eye(4)), tmp_path / "e.nii.gz")
    for name in ("a.tif", "b.png", "c.gif", "d.jpg", "e.nii.gz"):
        f = tmp_path / name
        reader = monai_reader_name(f)
        kwargs = {"reverse_indexing": False} if reader == "PILReader" else {}
        theirs = np.asarray(LoadImage(reader=reader, image_only=True, **kwargs)(str(f)))
        ours = read_array(f)
        assert theirs.shape == ours.shape, name
        np.testing.assert_array_equal(theirs, ours.astype(theirs.dtype))


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------


def test_summary_is_aggregate_only(tmp_path):
    path = _make_site(tmp_path, n=2)
    summary = summarise_datalist(path)
    assert summary["counts"] == {"training": 2, "validation": 2, "test": 2} and summary["total"] == 6
    assert summary["image_sizes"] == [[16, 12]] and summary["channels"] == [3]
    assert summary["foreground_fraction_mean"] == pytest.approx(30 / 192)
    assert str(tmp_path) not in json.dumps(summary)
    _edit(path, lambda d: d.pop("validation"))
    assert summarise_datalist(path)["counts"]["validation"] == 0
    (tmp_path / "labels" / "test_1.png").write_bytes(b"junk")
    _raises_naming(tmp_path / "labels" / "test_1.png", summarise_datalist, path)
