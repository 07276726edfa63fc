"""Label spaces (fedseg.data.labels): parsing, decoding stored masks, compatibility across sites, and the real fundus
OD/OC encoding (0 = cup, 128 = rim, 255 = background, RGB with equal channels)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedseg.data.datalist import DatalistError, validate_pair
from fedseg.data.checks import federation_label_config
from fedseg.data.labels import (
    BINARY,
    LabelSpace,
    LabelSpaceError,
    metric_key,
    order_structure_keys,
    site_label_space,
    split_metric_key,
)
from real_data import real_data_folder

ODOC_ROOT = real_data_folder("odoc_prostate_samples")
needs_odoc = pytest.mark.skipif(not (ODOC_ROOT / "manifest.csv").is_file(), reason=f"no samples at {ODOC_ROOT}")

FUNDUS = {
    "labels": {"background": 0, "rim": 1, "cup": 2},
    "label_values": {"255": 0, "128": 1, "0": 2},
    "regions": {"disc": ["rim", "cup"], "cup": ["cup"]},
}


def _png(path: Path, arr: np.ndarray) -> Path:
    Image.fromarray(arr).save(path)
    return path


# ------------------------------------------------------------------------------------------ parsing
def test_both_label_orientations_give_the_same_space():
    a = LabelSpace.from_datalist({"labels": {"background": 0, "rim": 1, "cup": 2}})
    b = LabelSpace.from_datalist({"labels": {"0": "background", "2": "cup", "1": "rim"}})
    assert a.names == b.names == ("background", "rim", "cup")
    assert a.num_classes == 3 and a.foreground == ("rim", "cup") and a.multi_class


def test_no_fields_is_the_historic_binary_space():
    space = LabelSpace.from_datalist({"name": "x"})
    assert space == BINARY and not space.declared and not space.multi_class
    assert space.to_config() == {"num_classes": 2}


@pytest.mark.parametrize(
    "info, match",
    [
        ({"labels": {"background": 0, "rim": 1, "cup": 2}, "num_classes": 2}, "num_classes=2 but its labels name 3"),
        ({"labels": {"background": 0, "cup": 2}}, "indices 0..1"),
        ({"labels": {"background": 0, "rim": 1}, "label_values": {"255": 0, "0": 2}}, "class indices \\[2\\]"),
        ({"labels": {"background": 0, "rim": 1, "cup": 2}, "label_values": {"255": 0, "0": 2}}, "no stored value for classes \\['rim'\\]"),
        ({"labels": {"background": 0, "rim": 1}, "regions": {"disc": ["rim", "cup"]}}, "unknown classes \\['cup'\\]"),
        ({"labels": {"background": 0, "rim": 1}, "regions": {"all": ["background", "rim"]}}, "background"),
        ({"labels": {"background": 0, "rim": 1, "cup": 2}, "regions": {"cup": ["rim", "cup"]}}, "class's name"),
        ({"labels": {"background": 0, "1 bad": 1}}, "must start with a letter"),
        ({"label_values": {"white": 0, "0": 1}}, "not a number"),
    ],
)
def test_malformed_spaces_are_refused_naming_the_source(info, match):
    with pytest.raises(LabelSpaceError, match=match) as err:
        LabelSpace.from_datalist(info, "/data/site-a/datalist.json")
    assert "/data/site-a/datalist.json" in str(err.value)
    assert isinstance(err.value, DatalistError)  # collected by fedseg data check like any datalist problem


def test_structures_classes_then_regions_and_metric_keys():
    space = LabelSpace.from_datalist(FUNDUS)
    assert space.evaluated_structures() == {"rim": (1,), "cup": (2,), "disc": (1, 2)}
    assert metric_key("hd95_mm", "disc") == "hd95_mm:disc"
    assert split_metric_key("dice_fov:cup") == ("dice_fov", "cup") and split_metric_key("dice") == ("dice", None)
    cfg = space.to_config()
    assert order_structure_keys(["dice:disc", "dice:cup", "dice:rim"], cfg) == ["dice:rim", "dice:cup", "dice:disc"]


# ----------------------------------------------------------------------------------------- decoding
def test_decode_matches_a_lookup_by_hand():
    rng = np.random.default_rng(0)
    values = {"7": 0, "30": 1, "31": 1, "200": 2, "65535": 3}
    space = LabelSpace.from_datalist({"labels": {"bg": 0, "a": 1, "b": 2, "c": 3}, "label_values": values})
    stored = rng.choice([7, 30, 31, 200, 65535], size=(9, 11)).astype(np.uint16)
    expected = np.vectorize(lambda v: values[str(int(v))])(stored)
    np.testing.assert_array_equal(space.decode(stored), expected)
    # writing back uses the first stored value listed for each class
    np.testing.assert_array_equal(space.encode(expected), np.vectorize(lambda c: [7, 30, 200, 65535][c])(expected))


def test_undeclared_values_are_named_with_the_file():
    space = LabelSpace.from_datalist(FUNDUS)
    with pytest.raises(LabelSpaceError, match=r"label /x/m\.png has values \{1, 254\} not declared"):
        space.decode(np.array([[0, 1], [128, 254]], np.uint8), "/x/m.png")


def test_without_values_masks_store_class_indices_and_binary_keeps_0_255():
    three = LabelSpace.from_datalist({"labels": {"background": 0, "a": 1, "b": 2}})
    np.testing.assert_array_equal(three.decode(np.array([0, 2, 1])), [0, 2, 1])
    with pytest.raises(LabelSpaceError, match="outside the class indices 0..2"):
        three.decode(np.array([0, 255]))
    np.testing.assert_array_equal(BINARY.decode(np.array([0, 255, 255])), [0, 1, 1])
    with pytest.raises(LabelSpaceError, match="not a binary mask"):
        BINARY.decode(np.array([0, 1, 255]))


def test_rgb_masks_need_declared_values_and_equal_channels(tmp_path):
    img = _png(tmp_path / "img.png", np.full((8, 8, 3), 90, np.uint8))
    grey = np.full((8, 8), 255, np.uint8)
    grey[2:6, 2:6] = 128
    grey[3:5, 3:5] = 0
    rgb = _png(tmp_path / "rgb.png", np.repeat(grey[..., None], 3, axis=-1))
    space = LabelSpace.from_datalist(FUNDUS)
    info = validate_pair(img, rgb, space)
    assert info["spatial_shape"] == (8, 8) and info["foreground_fraction"] == pytest.approx(16 / 64)
    with pytest.raises(DatalistError, match="single-channel"):
        validate_pair(img, rgb)  # no declared encoding: an RGB mask is refused, as it always was
    bad = np.repeat(grey[..., None], 3, axis=-1)
    bad[0, 0, 1] = 128
    with pytest.raises(DatalistError, match=r"bad\.png is an RGB mask whose channels differ at 1 pixels"):
        validate_pair(img, _png(tmp_path / "bad.png", bad), space)


def test_monai_pipeline_decodes_as_the_datalist_check(tmp_path):
    """The bundle's transform (LoadImaged + LabelsToClassesd) and the numpy path agree on an RGB mask."""
    from monai.transforms import EnsureChannelFirstd, LoadImaged

    from fedseg.data.transforms import LabelsToClassesd, SegImageReader

    grey = np.random.default_rng(1).choice([0, 128, 255], size=(12, 10)).astype(np.uint8)
    path = _png(tmp_path / "m.png", np.repeat(grey[..., None], 3, axis=-1))
    item = {"label": str(path), "label_values": FUNDUS["label_values"]}
    item = EnsureChannelFirstd("label")(LoadImaged("label", reader=SegImageReader(), image_only=True)(item))
    out = LabelsToClassesd("label", num_classes=3)(item)
    assert "label_values" not in out  # consumed: never reaches collation
    # MONAI's PIL reader indexes (x, y): transpose back to PIL's (row, column)
    np.testing.assert_array_equal(out["label"][0].numpy().T, LabelSpace.from_datalist(FUNDUS).decode(grey))


# ------------------------------------------------------------------------------------ across sites
def _datalist(tmp_path: Path, name: str, fields: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    img = _png(folder / "i.png", np.zeros((16, 16, 3), np.uint8))
    lab = _png(folder / "l.png", np.full((16, 16), 255, np.uint8))
    entries = lambda k: [{"image": img.name, "label": lab.name, "id": k}]  # noqa: E731
    data = {**fields, "training": entries("a"), "validation": [], "test": []}
    path = folder / "datalist.json"
    path.write_text(json.dumps(data))
    return path


def test_sites_with_different_spaces_are_refused_naming_both(tmp_path):
    a = _datalist(tmp_path, "a", FUNDUS)
    b = _datalist(tmp_path, "b", {"labels": {"background": 0, "disc": 1, "cup": 2}, "label_values": {"255": 0, "128": 1, "0": 2}})
    with pytest.raises(LabelSpaceError) as err:
        federation_label_config({"site-a": a, "site-b": b})
    assert str(a) in str(err.value) and str(b) in str(err.value)
    # another encoding of the same classes is fine: each site decodes its own masks
    c = _datalist(tmp_path, "c", {**FUNDUS, "label_values": {"0": 0, "1": 1, "2": 2}})
    fields = federation_label_config({"site-a": a, "site-c": c})
    assert fields["num_classes"] == 3 and fields["labels"] == FUNDUS["labels"] and "label_values" not in fields


def test_binary_federations_add_nothing_to_the_job(tmp_path):
    a = _datalist(tmp_path, "a", {"labels": {"0": "background", "1": "vessel"}})
    b = _datalist(tmp_path, "b", {})
    assert federation_label_config({"a": a, "b": b}) == {}
    assert federation_label_config(family="polyp") == {}
    fields = federation_label_config(family="fundus")
    assert fields == {"num_classes": 3, **FUNDUS}


def test_job_overrides_must_agree_with_the_data(tmp_path):
    a = _datalist(tmp_path, "a", FUNDUS)
    with pytest.raises(LabelSpaceError, match="--set options"):
        federation_label_config({"a": a}, explicit={"num_classes": 2})


def test_a_site_checks_its_datalist_against_the_job():
    info = dict(FUNDUS)
    with pytest.raises(LabelSpaceError, match="the job's train_config has 2 classes.*site-x's datalist has 3 classes"):
        site_label_space({"num_classes": 2}, info, "site-x's datalist")
    space = site_label_space({"num_classes": 3, "labels": FUNDUS["labels"], "regions": FUNDUS["regions"]}, info, "d")
    assert space.values == {255.0: 0, 128.0: 1, 0.0: 2}
    # a datalist that only counts its classes takes the job's names and regions
    named = site_label_space({"num_classes": 3, "labels": FUNDUS["labels"], "regions": FUNDUS["regions"]}, {"num_classes": 3}, "d")
    assert named.names == ("background", "rim", "cup") and named.regions == {"disc": ("rim", "cup"), "cup": ("cup",)}


# ------------------------------------------------------------------------------------ real samples
@needs_odoc
def test_real_fundus_mask_decodes_to_cup_inside_disc():
    """The real files store RGB masks with equal channels, 0 = cup, 128 = rim, 255 = background."""
    from scipy import ndimage

    mask = np.asarray(Image.open(ODOC_ROOT / "fundus_odoc" / "Drishti-GS" / "masks" / "gdrishtiGS_002.png"))
    assert mask.ndim == 3 and mask.shape[-1] == 3
    space = LabelSpace.from_datalist(FUNDUS)
    from fedseg.data.datalist import decode_mask

    classes = decode_mask(mask, ODOC_ROOT / "x.png", space)
    assert set(np.unique(classes).tolist()) == {0, 1, 2}
    # the class fractions are the stored values' fractions, counted independently on the red channel
    for value, c in ((255, 0), (128, 1), (0, 2)):
        assert np.mean(classes == c) == pytest.approx(np.mean(mask[..., 0] == value))
    # the disc contains the cup: no cup pixel touches the background
    assert not (ndimage.binary_dilation(classes == 2) & (classes == 0)).any()
