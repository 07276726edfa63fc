"""Bad files are found before training (``fedseg.data.checks``), each error naming its file; image modes
(16-bit, RGBA, palette) are brought to the pipeline's layout (``fedseg.data.image_modes``)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fedseg.data.checks import check_datalist, check_image_header
from fedseg.data.datalist import DatalistError
from fedseg.data.image_modes import ImageModeError, to_pipeline_mode

SIZE = 32


def _image(path: Path, mode: str = "RGB", size=(SIZE, SIZE)) -> Path:
    rng = np.random.default_rng(0)
    h, w = size
    if mode == "RGB":
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)
    elif mode == "L":
        Image.fromarray(rng.integers(0, 255, (h, w), dtype=np.uint8)).save(path)
    return path


def _mask(path: Path, values=(0, 255), size=(SIZE, SIZE)) -> Path:
    arr = np.full(size, values[0], dtype=np.uint8)
    arr[: size[0] // 2] = values[1]
    Image.fromarray(arr).save(path)
    return path


def _datalist(folder: Path, entries=None, **top) -> Path:
    """A datalist with one good pair per split unless ``entries`` ({split: [entry]}) is given."""
    folder.mkdir(parents=True, exist_ok=True)
    if entries is None:
        entries = {}
        for split in ("training", "validation", "test"):
            _image(folder / f"{split}.png")
            _mask(folder / f"{split}_mask.png")
            entries[split] = [{"image": f"{split}.png", "label": f"{split}_mask.png"}]
    path = folder / "datalist.json"
    path.write_text(json.dumps({**top, **entries}))
    return path


def _with_training(folder: Path, entry) -> Path:
    path = _datalist(folder)
    data = json.loads(path.read_text())
    data["training"] = [entry]
    path.write_text(json.dumps(data))
    return path


def test_good_datalist_passes(tmp_path):
    out = check_datalist(_datalist(tmp_path / "d"))
    assert out["counts"] == {"training": 1, "validation": 1, "test": 1} and out["files"] == 6


def test_not_json_and_missing_split(tmp_path):
    bad = tmp_path / "datalist.json"
    bad.write_text("{not json")
    with pytest.raises(DatalistError, match=f"invalid JSON in datalist {bad}"):
        check_datalist(bad)
    path = _datalist(tmp_path / "d")
    data = json.loads(path.read_text())
    del data["test"]
    path.write_text(json.dumps(data))
    with pytest.raises(DatalistError, match="split 'test' missing from datalist"):
        check_datalist(path)


def test_missing_and_corrupt_image(tmp_path):
    folder = tmp_path / "d"
    _mask(folder.mkdir(parents=True) or folder / "m.png")
    with pytest.raises(DatalistError, match=r"image file not found: .*nothere.png \(training\[0\]"):
        check_datalist(_with_training(folder, {"image": "nothere.png", "label": "m.png"}))
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    with pytest.raises(DatalistError, match=r"cannot read image .*corrupt.png"):
        check_datalist(_with_training(folder, {"image": "corrupt.png", "label": "m.png"}))
    # a valid header with truncated pixel data: found when decoding
    _image(folder / "full.png")
    (folder / "trunc.png").write_bytes((folder / "full.png").read_bytes()[:-200])
    with pytest.raises(DatalistError, match=r"trunc.png"):
        check_datalist(_with_training(folder, {"image": "trunc.png", "label": "m.png"}))


def test_3d_nifti_refused_and_2d_nifti_accepted(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    nib.save(nib.Nifti1Image(np.zeros((SIZE, SIZE, 5), np.float32), np.eye(4)), folder / "vol.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros((SIZE, SIZE, 5), np.uint8), np.eye(4)), folder / "vol_mask.nii.gz")
    with pytest.raises(DatalistError, match=r"vol.nii.gz is a 3-D volume of shape \(32, 32, 5\); the pipeline is 2-D"):
        check_datalist(_with_training(folder, {"image": "vol.nii.gz", "label": "vol_mask.nii.gz"}))
    nib.save(nib.Nifti1Image(np.zeros((SIZE, SIZE, 1), np.float32), np.eye(4)), folder / "slice.nii.gz")
    nib.save(nib.Nifti1Image(np.ones((SIZE, SIZE, 1), np.uint8), np.eye(4)), folder / "slice_mask.nii.gz")
    check_datalist(_with_training(folder, {"image": "slice.nii.gz", "label": "slice_mask.nii.gz"}))


def test_tiny_image_refused(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    _image(folder / "tiny.png", size=(3, 4))
    _mask(folder / "tiny_mask.png", size=(3, 4))
    with pytest.raises(DatalistError, match=r"tiny.png is only 3 x 4 pixels"):
        check_datalist(_with_training(folder, {"image": "tiny.png", "label": "tiny_mask.png"}))


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims ``width x height`` and whose pixel data is one empty zlib block: decoding
    it would take gigabytes, reading the header costs nothing."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    return path


@settings(deadline=None, max_examples=1)
@given(st.just(None))
def test_huge_image_refused_from_its_header_without_decoding(tmp_path_factory, _):
    folder = tmp_path_factory.mktemp("huge")
    _png_header_only(folder / "huge.png", 20000, 20000)
    _mask(folder / "m.png")
    import time

    started = time.perf_counter()
    with pytest.raises(DatalistError, match=r"huge.png is 20000 x 20000 pixels \(400,000,000\), above the limit .* refused before decoding"):
        check_datalist(_with_training(folder, {"image": "huge.png", "label": "m.png"}))
    assert time.perf_counter() - started < 5.0


def test_mask_with_labels_0_and_2_refused_naming_the_file(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    _image(folder / "img.png")
    _mask(folder / "two.png", values=(0, 2))
    with pytest.raises(DatalistError, match=r"label .*two.png is not a binary mask: found 2 distinct values \{0, 2\}"):
        check_datalist(_with_training(folder, {"image": "img.png", "label": "two.png"}))


def test_mask_image_size_mismatch(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    _image(folder / "img.png")
    _mask(folder / "small.png", size=(SIZE, SIZE - 8))
    with pytest.raises(DatalistError, match=r"size mismatch: image .*img.png .* label .*small.png"):
        check_datalist(_with_training(folder, {"image": "img.png", "label": "small.png"}))


def test_paths_outside_the_datalist_folder_refused_unless_allowed(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _image(outside / "img.png")
    _mask(outside / "m.png")
    folder = tmp_path / "d"
    path = _with_training(folder, {"image": "../elsewhere/img.png", "label": str(outside / "m.png")})
    with pytest.raises(DatalistError, match=r"image .*elsewhere/img.png is a path outside the datalist's folder") as err:
        check_datalist(path)
    assert "label" in str(err.value) and "2 problem(s)" in str(err.value)
    check_datalist(path, allow_external_paths=True)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "allow_external_paths": True}))  # what importers write
    check_datalist(path)
    # a symlink inside the folder pointing outside is the same thing
    os.symlink(outside / "img.png", folder / "link.png")
    path = _with_training(folder, {"image": "link.png", "label": "training_mask.png"})
    with pytest.raises(DatalistError, match=r"link.png is a symlink to a path outside"):
        check_datalist(path)
    os.symlink(folder / "training.png", folder / "inside_link.png")  # a symlink within the folder is fine
    check_datalist(_with_training(folder, {"image": "inside_link.png", "label": "training_mask.png"}))


def test_every_problem_listed_at_once(tmp_path):
    folder = tmp_path / "d"
    path = _datalist(folder)
    data = json.loads(path.read_text())
    data["training"] = [{"image": f"missing{i}.png", "label": "training_mask.png"} for i in range(25)]
    path.write_text(json.dumps(data))
    with pytest.raises(DatalistError, match=r"25 problem\(s\)") as err:
        check_datalist(path)
    assert "missing0.png" in str(err.value) and "... and 5 more" in str(err.value)


# ----------------------------------------------------------------------------------------- image modes
def test_16_bit_png_and_tiff_scaled_by_dtype(tmp_path):
    raw = (np.arange(SIZE * SIZE).reshape(SIZE, SIZE) * 60).astype(np.uint16)
    for suffix in (".png", ".tif"):
        Image.fromarray(raw).save(tmp_path / f"x{suffix}")
        with Image.open(tmp_path / f"x{suffix}") as img:
            assert img.mode.startswith("I")
            out = np.asarray(to_pipeline_mode(img))
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, raw / 65535.0 * 255.0, rtol=1e-6)  # not saturated at 255
        assert out.max() <= 255.0 and np.unique(out).size == np.unique(raw).size


def test_rgba_and_palette_become_rgb(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)
    rgba = np.dstack([rgb, np.full((SIZE, SIZE), 128, np.uint8)])
    Image.fromarray(rgba).save(tmp_path / "a.png")
    with Image.open(tmp_path / "a.png") as img:
        np.testing.assert_array_equal(np.asarray(to_pipeline_mode(img)), rgb)
    palette_img = Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=16)
    palette_img.save(tmp_path / "p.png")
    with Image.open(tmp_path / "p.png") as img:
        assert img.mode == "P"
        expected = np.asarray(img.convert("RGB"))
        out = np.asarray(to_pipeline_mode(img))
    assert out.shape == (SIZE, SIZE, 3) and np.array_equal(out, expected)
    grey = Image.fromarray(rgb[..., 0])
    assert to_pipeline_mode(grey) is grey  # grey stays grey; EnsureChannelsd repeats it as configured
    with pytest.raises(ImageModeError, match="not a 16-bit image"):
        to_pipeline_mode(Image.fromarray(np.full((4, 4), 70000, np.int32), mode="I"))


def test_loading_transforms_use_the_image_modes(tmp_path, tiny_train_config):
    """The bundle's loading transforms: a 16-bit and a palette image load into [0, 1] RGB, not saturated."""
    from fedseg.engine import SegEngine

    raw = (np.linspace(0, 65535, SIZE * SIZE).reshape(SIZE, SIZE)).astype(np.uint16)
    folder = tmp_path / "site"
    folder.mkdir()
    Image.fromarray(raw).save(folder / "training.png")
    Image.fromarray(raw).save(folder / "validation.png")
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)).convert("P").save(folder / "test.png")
    _mask(folder / "m.png")
    entries = {s: [{"image": f"{s}.png", "label": "m.png"}] for s in ("training", "validation", "test")}
    engine = SegEngine("s", _datalist(folder, entries), {**tiny_train_config, "spatial_mode": "resize"})
    batch = next(iter(engine.loader("validation")))
    image = batch["image"][0]  # (3, H, W) after EnsureChannelsd
    assert image.shape[0] == 3 and float(image.max()) == pytest.approx(1.0, abs=1e-3) and float(image.min()) == pytest.approx(0.0, abs=1e-3)
    assert float((image >= 0.999).float().mean()) < 0.05  # the old reading put every pixel above 255 at 1.0
    test_batch = next(iter(engine.loader("test")))
    assert test_batch["image"].shape[1] == 3


# ------------------------------------------------------------------------------------------- fuzz
FILE_KINDS = ("good", "missing", "corrupt", "tiny", "mask02", "mismatch", "outside", "volume", "text", "empty")


def _make(folder: Path, kind: str, i: int, role: str) -> str:
    name = f"{role}{i}_{kind}"
    if kind == "missing":
        return f"{name}.png"
    if kind == "outside":
        return "../../etc_like/passwd.png"
    if kind == "corrupt":
        (folder / f"{name}.png").write_bytes(os.urandom(40))
        return f"{name}.png"
    if kind == "text":
        (folder / f"{name}.txt").write_text("hello")
        return f"{name}.txt"
    if kind == "empty":
        (folder / f"{name}.png").write_bytes(b"")
        return f"{name}.png"
    if kind == "volume":
        nib.save(nib.Nifti1Image(np.zeros((SIZE, SIZE, 3), np.uint8), np.eye(4)), folder / f"{name}.nii.gz")
        return f"{name}.nii.gz"
    size = {"tiny": (2, 2), "mismatch": (SIZE, SIZE + 4)}.get(kind, (SIZE, SIZE))
    if role == "image":
        _image(folder / f"{name}.png", size=size)
    else:
        _mask(folder / f"{name}.png", values=(0, 2) if kind == "mask02" else (0, 1), size=size)
    return f"{name}.png"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6
)


@settings(max_examples=40, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_fuzz_generated_datalists_pass_or_fail_with_a_clear_error(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("fuzz")
    doc: dict = {}
    for split in ("training", "validation", "test"):
        shape = data.draw(st.sampled_from(["entries", "entries", "entries", "absent", "empty", "junk"]), label=split)
        if shape == "absent":
            continue
        if shape == "junk":
            doc[split] = data.draw(json_values)
            continue
        n = 0 if shape == "empty" else data.draw(st.integers(1, 3))
        entries = []
        for i in range(n):
            kinds = data.draw(st.tuples(st.sampled_from(FILE_KINDS), st.sampled_from(FILE_KINDS)))
            entry = {"image": _make(folder, kinds[0], i, f"{split}_image"), "label": _make(folder, kinds[1], i, f"{split}_label")}
            if data.draw(st.booleans()):
                entry[data.draw(st.sampled_from(["image", "label", "id"]))] = data.draw(json_values)
            entries.append(entry)
        doc[split] = entries
    raw = json.dumps(doc)
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    path = folder / "datalist.json"
    path.write_text(raw)
    try:
        out = check_datalist(path)
    except DatalistError as e:
        message = str(e)
        assert str(path) in message or str(folder) in message, message  # names the datalist or a file in it
        assert len(message) < 20000
    else:
        assert set(out["counts"]) == {"training", "validation", "test"}


def test_header_check_on_its_own(tmp_path):
    _image(tmp_path / "ok.png", mode="L")
    assert check_image_header(tmp_path / "ok.png") == (SIZE, SIZE)
    (tmp_path / "x.webp").write_bytes(b"RIFF")
    with pytest.raises(DatalistError, match="unsupported image format"):
        check_image_header(tmp_path / "x.webp")


def test_fedseg_data_check_command(tmp_path, capsys):
    from fedseg.cli import main

    good = _datalist(tmp_path / "good")
    main(["data", "check", str(good)])
    assert capsys.readouterr().out.startswith(f"OK {good}: training 1, validation 1, test 1; 6 files checked")
    folder = tmp_path / "bad"
    folder.mkdir()
    _image(folder / "img.png")
    _mask(folder / "two.png", values=(0, 2))
    with pytest.raises(SystemExit, match=r"(?s)fedseg data check: .*two.png is not a binary mask"):
        main(["data", "check", str(_with_training(folder, {"image": "img.png", "label": "two.png"}))])


def test_site_start_refuses_a_bad_datalist_before_training(tmp_path):
    """The site loop runs the checks when it first sets up; the error names the file (site log only)."""
    import argparse

    from fedseg.fl.client import SiteRunner

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _image(outside / "img.png")
    path = _with_training(tmp_path / "d", {"image": str(outside / "img.png"), "label": "training_mask.png"})
    runner = SiteRunner("s", argparse.Namespace(datalist=str(path), site_datalists=None, data_root=None, bundle_dir=None), str(tmp_path))
    with pytest.raises(DatalistError, match=r"img.png is a path outside the datalist's folder"):
        runner._setup({"objective": "fedavg", "objective_args": {}, "train_config": {}})
    assert runner.engine is None  # nothing was built, nothing trained
