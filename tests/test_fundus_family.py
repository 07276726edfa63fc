"""Built-in ``fundus`` family: the declared label space, the anatomy every mask must respect (the disc contains the
cup), per-site differences, determinism, and the pipeline reading it as three classes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from fedseg.data import generate_federation, generate_site_data, load_datalist
from fedseg.data.labels import LabelSpace
from fedseg.data.synthetic import family_label_space
from fedseg.data.synthetic.fundus import FUNDUS_CDR_BAND

SITES = ["site-1", "site-2", "site-3"]


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    return generate_federation("fundus", SITES, tmp_path_factory.mktemp("fundus"), profile="default")


def _classes(path):
    data = json.loads(path.read_text())
    space = LabelSpace.from_datalist(data, str(path))
    entries = [e for s in ("training", "validation", "test") for e in data[s]]
    images = [np.asarray(Image.open(path.parent / e["image"])) for e in entries]
    labels = [space.decode(np.asarray(Image.open(path.parent / e["label"]))) for e in entries]
    return data, images, labels


def test_datalist_declares_the_refuge_label_space(federation):
    for path in federation.values():
        data = json.loads(path.read_text())
        assert data["labels"] == {"background": 0, "rim": 1, "cup": 2}
        assert data["label_values"] == {"255": 0, "128": 1, "0": 2}
        assert data["regions"] == {"disc": ["rim", "cup"], "cup": ["cup"]}
        assert data["spatial_mode"] == "resize"
        load_datalist(path)  # every mask decodes under the declared encoding
    assert family_label_space("fundus").describe() == "3 classes [background, rim, cup], regions {disc: rim+cup, cup: cup}"


def test_every_mask_has_a_cup_inside_a_disc_and_a_cdr_in_band(federation):
    lo, hi = FUNDUS_CDR_BAND
    for path in federation.values():
        _, _, labels = _classes(path)
        for classes in labels:
            disc, cup = classes > 0, classes == 2
            assert cup.any() and (classes == 1).any()
            # the cup never touches the background: a ring of rim separates them
            assert not (ndimage.binary_dilation(cup) & (classes == 0)).any()
            rows = lambda m: np.flatnonzero(m.any(axis=1))  # noqa: E731
            cdr = (np.ptp(rows(cup)) + 1) / (np.ptp(rows(disc)) + 1)  # vertical cup-to-disc ratio
            assert lo - 0.1 <= cdr <= hi + 0.05


def test_sites_differ_and_masks_follow_each_sites_drawn_anatomy(federation):
    """Colour differs between every pair of sites; each site's disc area is the area its drawn disc diameter gives
    (pi/4 d^2 of the crop) and its cup share of the disc follows its drawn cup-to-disc ratio (same ranking)."""
    colour, cup_share, cdr = {}, {}, {}
    for site, path in federation.items():
        data, images, labels = _classes(path)
        anatomy = data["anatomy"]
        colour[site] = np.mean([im.reshape(-1, 3).mean(0) for im in images], axis=0)
        disc_area = np.mean([(c > 0).mean() for c in labels])
        assert disc_area == pytest.approx(np.pi / 4 * anatomy["disc_fraction"] ** 2, rel=0.1)
        cup_share[site] = np.mean([(c == 2).sum() / (c > 0).sum() for c in labels])
        cdr[site] = anatomy["cdr_mean"]
    pairs = [(a, b) for i, a in enumerate(SITES) for b in SITES[i + 1:]]
    assert all(np.abs(colour[a] - colour[b]).max() > 5 for a, b in pairs)
    assert sorted(SITES, key=cup_share.get) == sorted(SITES, key=cdr.get)
    assert max(cup_share.values()) - min(cup_share.values()) > 0.05


def test_same_arguments_give_identical_files(tmp_path):
    a = generate_site_data("fundus", "h", tmp_path / "a", profile="tiny")
    b = generate_site_data("fundus", "h", tmp_path / "b", profile="tiny")
    files = lambda root: {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*.png"))}  # noqa: E731
    assert files(a.parent) == files(b.parent)


def test_the_engine_reads_three_classes(tmp_path):
    from fedseg.config import resolve_profile
    from fedseg.data.checks import federation_label_config
    from fedseg.engine import SegEngine

    path = generate_site_data("fundus", "site-1", tmp_path, profile="tiny")
    cfg = resolve_profile("tiny", **federation_label_config(family="fundus"))["train_config"]
    engine = SegEngine("site-1", path, cfg)
    assert engine.label_space.num_classes == 3 and engine.train_config["patch_sampler"] == "classes"
    batch = next(iter(engine.loader("training", train=True)))
    assert set(np.unique(batch["label"].numpy()).tolist()) == {0.0, 1.0, 2.0}
    # whole-image evaluation labels are the decoded stored masks at their own size
    data, _, labels = _classes(path)
    first = next(iter(engine.loader("test")))
    np.testing.assert_array_equal(first["label"][0, 0].numpy().T, labels[len(data["training"]) + len(data["validation"])])
