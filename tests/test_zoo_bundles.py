"""Bundles that are not fedseg's, on built-in data written in the layouts they read.

``tests/bundles/zoo_2d`` (BasicUNet over ``images/*.png`` + ``labels/*.png``) and ``tests/bundles/zoo_3d`` (UNet over
the Decathlon's ``imagesTr`` / ``labelsTr``) are MONAI bundles in the model zoo's style; the data comes from
:mod:`fedseg.data.synthetic.layouts`. Checked here, in process (MONAI's ``ConfigWorkflow``, the class
``python -m monai.bundle run`` builds, and ``monai.bundle.run`` itself):

* the layouts: file pairs, class-index masks equal to the generator's decoded masks, 3-D image/label geometry,
  the file order a bundle's last-N validation relies on, ``site_overrides.json``, determinism, stale files;
* each bundle's property check (``check_properties``) for training and for inference finds nothing missing, and
  a copy without ``dataset_dir`` fails it;
* each bundle reads the stored masks as class indices (and masks stored 0/255 or 255/128/0 through its
  ``label_values``), trains one epoch with its validation on the tiny profile, writes its checkpoint and logs only
  where ``ckpt_dir`` / ``output_dir`` point (nothing into tests/bundles), and its ``inference.json`` writes masks at
  the input's own size (2-D) or shape and affine (3-D), each pixel back where its input's is (a thresholding 1x1
  convolution standing in for the network on a label drawn as an image);
* the networks take and return what metadata.json declares (MONAI's ``verify_net_in_out``), and their bottleneck
  modules are where the bundles' READMEs say they are.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedseg.data.synthetic import family_label_space, generate_site_data
from fedseg.data.synthetic.layouts import (LAYOUT_FOLDERS, SPLIT_ORDER, write_layout_federation,
                                           write_layout_site)

BUNDLES = Path(__file__).resolve().parent / "bundles"
ZOO_2D = BUNDLES / "zoo_2d"
ZOO_3D = BUNDLES / "zoo_3d"

#: the smallest settings that still run every part of each bundle: a round takes about a second on a CPU
SMALL_2D = {"image_size": [32, 32], "features": [4, 4, 8, 8, 16, 4], "num_workers": 0,
            "train#dataloader#batch_size": 4}
#: the same for inference.json, which has no training section
SMALL_2D_INFER = {k: v for k, v in SMALL_2D.items() if not k.startswith("train#")}
SMALL_3D = {"pixdim": [2.5, 2.5, 4.0], "patch_size": [32, 32, 16], "channels": [4, 8, 16], "strides": [2, 2],
            "num_res_units": 1, "num_workers": 0}


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def tree(root: Path) -> dict:
    """``{relative path: (size, mtime_ns)}`` of every file below ``root``."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def workflow(bundle: Path, config: str, workflow_type: str, **override):
    """A bundle's ``ConfigWorkflow`` as ``python -m monai.bundle run`` builds it, initialised, with MONAI's property
    check run: returns ``(workflow, missing properties)``. Logging is left as the session has it (the bundle's
    logging.conf would reconfigure the root logger of the whole test session)."""
    from monai.bundle import ConfigWorkflow

    configs = bundle / "configs"
    wf = ConfigWorkflow(config_file=str(configs / config), meta_file=str(configs / "metadata.json"),
                        workflow_type=workflow_type, logging_file=False, bundle_root=str(bundle), **override)
    wf.initialize()
    # check_properties instantiates every required property: a wrong reference fails here, before a run
    return wf, wf.check_properties()


def parsed(bundle: Path, config: str, ids, **override):
    """The parsed content of ``ids`` in a bundle config under ``override``, without running anything."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(str(bundle / "configs" / config))
    parser.update({"bundle_root": str(bundle), **override})
    return [parser.get_parsed_content(i) for i in ids]


def png(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def as_rows_cols(label) -> np.ndarray:
    """A 2-D bundle's label tensor ``(1, W, H)`` (PILReader indexes x first) as the PNG's ``(H, W)`` array."""
    return np.asarray(label)[0].T


# ----------------------------------------------------------------------------------------------
# data, once per module
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo_data")


@pytest.fixture(scope="module")
def polyp(data_root) -> dict:
    """Two tiny polyp sites in the images-labels layout: ``{site: datalist path}``."""
    return write_layout_federation("polyp", ["site-1", "site-2"], data_root / "polyp", layout="images-labels",
                                   profile="tiny")


@pytest.fixture(scope="module")
def prostate(data_root) -> dict:
    """Two tiny prostate3d sites in the Decathlon layout (their scans are stored in different orientations)."""
    return write_layout_federation("prostate3d", ["site-1", "site-2"], data_root / "prostate3d", profile="tiny")


def splits(datalist_path: Path) -> dict:
    data = json.loads(Path(datalist_path).read_text())
    return {s: [e["image"] for e in data[s]] for s in ("training", "validation", "test")}


# ----------------------------------------------------------------------------------------------
# the layouts
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["polyp", "fundus"])
def test_images_labels_layout_pairs_every_image_with_its_class_index_mask(tmp_path, family):
    site = write_layout_site(family, "a", tmp_path / "out", layout="images-labels", profile="tiny")
    source = json.loads(generate_site_data(family, "a", tmp_path / "src", profile="tiny").read_text())
    src_dir = tmp_path / "src" / family / "a"
    images = sorted(p.name for p in (site / "images").iterdir())
    assert images == sorted(p.name for p in (site / "labels").iterdir())
    # every labelled image of the site, training, validation and test together
    ordered = [e for split in SPLIT_ORDER for e in source[split]]
    assert len(images) == len(ordered) == source["num_images"]
    space = family_label_space(family)
    for name, entry in zip(images, ordered):
        assert (site / "images" / name).read_bytes() == (src_dir / entry["image"]).read_bytes()
        mask = png(site / "labels" / name)
        assert mask.dtype == np.uint8 and mask.ndim == 2
        assert mask.shape == png(site / "images" / name).shape[:2]
        # the generator's stored encoding (polyp 0/255, fundus 255/128/0) decoded to class indices
        np.testing.assert_array_equal(mask, space.decode(png(src_dir / entry["label"]), name))
        assert set(np.unique(mask)) <= set(range(space.num_classes))
    written = json.loads((site / "datalist.json").read_text())
    assert "label_values" not in written and written["layout"] == "images-labels"
    if family == "fundus":  # all three classes occur: the multi-class family is not collapsed to binary
        assert set(np.unique(np.concatenate([png(p).ravel() for p in (site / "labels").iterdir()]))) == {0, 1, 2}


def test_layout_orders_files_training_then_validation_then_test(polyp):
    for datalist in polyp.values():
        site = datalist.parent
        listed = splits(datalist)
        names = sorted(f"images/{p.name}" for p in (site / "images").iterdir())
        n_val, n_test = len(listed["validation"]), len(listed["test"])
        assert names == listed["training"] + listed["validation"] + listed["test"]
        # a bundle validating on the last n_val + n_test trains on exactly the training split
        assert names[: -(n_val + n_test)] == listed["training"]
        assert names[-n_test:] == listed["test"]


def test_layout_datalists_pass_fedseg_checks(polyp, prostate):
    from fedseg.data.checks import check_datalist

    sites = [(d, "images-labels") for d in polyp.values()] + [(d, "decathlon") for d in prostate.values()]
    for datalist, layout in sites:
        out = check_datalist(datalist)
        # the datalist names every file of the folder, once
        assert sum(out["counts"].values()) == len(list((datalist.parent / LAYOUT_FOLDERS[layout][1]).iterdir()))


def test_decathlon_layout_keeps_each_label_on_its_scan_grid(prostate):
    import nibabel as nib

    orientations = set()
    for datalist in prostate.values():
        site = datalist.parent
        names = sorted(p.name for p in (site / "imagesTr").iterdir())
        assert names == sorted(p.name for p in (site / "labelsTr").iterdir()) and names
        for name in names:
            image, label = nib.load(site / "imagesTr" / name), nib.load(site / "labelsTr" / name)
            assert image.shape == label.shape and len(image.shape) == 3
            np.testing.assert_array_equal(image.affine, label.affine)
            values = np.unique(np.asarray(label.dataobj))
            assert set(values.tolist()) == {0, 1, 2}, name  # both zones in every volume
        orientations.add(nib.aff2axcodes(image.affine))
    assert len(orientations) == 2  # the two sites store their scans differently: inference must undo both


def test_site_overrides_map_each_site_to_its_absolute_folder(polyp, data_root):
    overrides = json.loads((data_root / "polyp" / "site_overrides.json").read_text())
    assert list(overrides) == ["site-1", "site-2"]
    for site, ids in overrides.items():
        assert ids == {"dataset_dir": str((data_root / "polyp" / site).resolve())}
        assert Path(ids["dataset_dir"]).is_absolute() and (Path(ids["dataset_dir"]) / "images").is_dir()


def test_layout_is_deterministic_idempotent_and_seeded(tmp_path):
    a = write_layout_site("prostate3d", "s", tmp_path / "a", profile="tiny", num_images=3)
    b = write_layout_site("prostate3d", "s", tmp_path / "b", profile="tiny", num_images=3)
    assert {k: (a / k).read_bytes() for k in tree(a) if k != "datalist.json"} == \
           {k: (b / k).read_bytes() for k in tree(b) if k != "datalist.json"}
    before = tree(a)
    write_layout_site("prostate3d", "s", tmp_path / "a", profile="tiny", num_images=3)
    assert tree(a) == before  # same fingerprint, files present: nothing rewritten
    c = write_layout_site("prostate3d", "s", tmp_path / "c", seed=1, profile="tiny", num_images=3)
    first = Path("imagesTr") / "prostate3d_000.nii.gz"
    assert (c / first).read_bytes() != (a / first).read_bytes()
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]  # the generator's folder is gone


def test_a_smaller_site_removes_its_stale_files_but_not_a_users_own(tmp_path):
    site = write_layout_site("polyp", "s", tmp_path, profile="tiny", num_images=5)
    (site / "images" / "mine.png").write_bytes((site / "images" / "polyp_000.png").read_bytes())
    write_layout_site("polyp", "s", tmp_path, profile="tiny", num_images=3)
    assert sorted(p.name for p in (site / "labels").iterdir()) == ["polyp_000.png", "polyp_001.png", "polyp_002.png"]
    assert (site / "images" / "mine.png").is_file()


@pytest.mark.parametrize("family, layout, match", [
    ("prostate3d", "images-labels", "use layout 'decathlon'"),
    ("polyp", "decathlon", "use layout 'images-labels'"),
    ("polyp", "datalist", "unknown bundle layout"),
])
def test_a_layout_that_cannot_hold_the_family_is_refused(tmp_path, family, layout, match):
    with pytest.raises(ValueError, match=match):
        write_layout_site(family, "s", tmp_path, layout=layout, profile="tiny")
    assert not (tmp_path / "s").exists()


def test_cli_synth_layout_writes_both_maps(tmp_path, capsys):
    from fedseg.cli import build_parser, main
    from fedseg.data.synthetic.layouts import LAYOUTS

    # the parser spells the layouts out (building it imports no numpy): they must stay the module's
    args = build_parser().parse_args(["data", "synth", "--out", str(tmp_path)])
    assert args.layout == "datalist"
    for layout in LAYOUTS:
        assert build_parser().parse_args(["data", "synth", "--out", "x", "--layout", layout]).layout == layout

    main(["data", "synth", "--family", "polyp", "--sites", "x", "y", "--out", str(tmp_path), "--profile", "tiny",
          "--layout", "images-labels"])
    overrides = json.loads((tmp_path / "site_overrides.json").read_text())
    assert overrides == {s: {"dataset_dir": str((tmp_path / s).resolve())} for s in ("x", "y")}
    datalists = json.loads((tmp_path / "site_datalists.json").read_text())
    assert datalists == {s: str((tmp_path / s / "datalist.json").resolve()) for s in ("x", "y")}
    assert "site_overrides.json" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--participants needs --layout datalist"):
        main(["data", "synth", "--family", "polyp", "--sites", "x", "--out", str(tmp_path), "--profile", "tiny",
              "--layout", "images-labels", "--participants", "x=1"])
    with pytest.raises(SystemExit, match="use layout 'decathlon'"):
        main(["data", "synth", "--family", "prostate3d", "--sites", "x", "--out", str(tmp_path / "v"),
              "--layout", "images-labels"])


# ----------------------------------------------------------------------------------------------
# what the bundles read
# ----------------------------------------------------------------------------------------------


def test_zoo_2d_reads_class_index_masks_and_splits_the_sorted_glob(polyp):
    datalist = polyp["site-1"]
    site, listed = datalist.parent, splits(datalist)
    held_out = len(listed["validation"]) + len(listed["test"])
    train_ds, val_ds = parsed(ZOO_2D, "train.json", ["train#dataset", "validate#dataset"], dataset_dir=str(site),
                              num_val=held_out, cache_rate=0.0, **SMALL_2D)
    assert [Path(d["image"]).name for d in train_ds.data] == [Path(p).name for p in listed["training"]]
    assert [Path(d["image"]).name for d in val_ds.data] == [Path(p).name for p in listed["validation"] + listed["test"]]
    for i, item in enumerate(val_ds):
        name = Path(val_ds.data[i]["label"]).name
        image = np.asarray(item["image"])
        assert image.shape == (3, 32, 32) and 0.0 <= image.min() <= image.max() <= 1.0
        np.testing.assert_array_equal(as_rows_cols(item["label"]), png(site / "labels" / name))


def test_zoo_2d_label_values_read_masks_stored_another_way(tmp_path):
    """The same bundle on the generator's own folders: polyp masks stored 0/255, fundus 255/128/0."""
    for family, label_values in (("polyp", [0, 255]), ("fundus", [255, 128, 0])):
        site = generate_site_data(family, "a", tmp_path, profile="tiny", num_images=3).parent
        (ds,) = parsed(ZOO_2D, "train.json", ["validate#dataset"], dataset_dir=str(site), num_val=3, cache_rate=0.0,
                       num_classes=len(label_values), label_values=label_values, **SMALL_2D)
        space = family_label_space(family)
        for i, item in enumerate(ds):
            stored = png(Path(ds.data[i]["label"]))
            np.testing.assert_array_equal(as_rows_cols(item["label"]), space.decode(stored, "mask"))


def test_zoo_3d_resamples_to_ras_at_pixdim_and_crops_patches(prostate):
    site = prostate["site-1"].parent
    val_ds, train_ds = parsed(ZOO_3D, "train.json", ["validate#dataset", "train#dataset"], dataset_dir=str(site),
                              num_val=1, cache_rate=0.0, **SMALL_3D)
    item = val_ds[0]
    assert item["image"].shape[1:] == item["label"].shape[1:]
    np.testing.assert_allclose(np.abs(np.diag(np.asarray(item["image"].affine))[:3]), SMALL_3D["pixdim"], rtol=1e-5)
    assert np.all(np.diag(np.asarray(item["image"].affine))[:3] > 0)  # RAS: every axis increasing
    assert set(np.unique(np.asarray(item["label"])).tolist()) == {0, 1, 2}
    patches = train_ds[0]
    assert len(patches) == 2 and all(tuple(p["image"].shape) == (1, 32, 32, 16) for p in patches)


# ----------------------------------------------------------------------------------------------
# training and inference with MONAI's runner
# ----------------------------------------------------------------------------------------------


def train_one_epoch(bundle: Path, dataset_dir: Path, run: Path, small: dict):
    """``bundle`` trained one epoch (with its validation) on ``dataset_dir``, its writers in ``run``; ``(workflow,
    missing, run folder, bundle tree before, bundle tree after)``."""
    before = tree(BUNDLES)
    wf, missing = workflow(bundle, "train.json", "train", dataset_dir=str(dataset_dir), max_epochs=1,
                           ckpt_dir=str(run / "models"), output_dir=str(run / "eval"), **small)
    wf.run()
    wf.finalize()
    return wf, missing, run, before, tree(BUNDLES)


@pytest.fixture(scope="module")
def trained_2d(polyp, tmp_path_factory):
    return train_one_epoch(ZOO_2D, polyp["site-1"].parent, tmp_path_factory.mktemp("zoo_2d_run"), SMALL_2D)


@pytest.fixture(scope="module")
def trained_3d(prostate, tmp_path_factory):
    return train_one_epoch(ZOO_3D, prostate["site-1"].parent, tmp_path_factory.mktemp("zoo_3d_run"), SMALL_3D)


@pytest.mark.parametrize("trained", ["trained_2d", "trained_3d"])
def test_a_zoo_bundle_trains_a_round_and_validates_writing_only_where_told(request, trained):
    wf, missing, run, before, after = request.getfixturevalue(trained)
    assert missing == []
    assert wf.trainer.state.epoch == 1 and wf.trainer.state.iteration >= 1
    dice = wf.evaluator.state.metrics["val_mean_dice"]
    assert np.isfinite(dice) and 0.0 <= dice <= 1.0
    # the checkpoint is the evaluator's (best key metric): it exists only because the validation ran
    assert sorted(p.name for p in (run / "models").iterdir()) == ["model.pt"]
    import torch

    saved = torch.load(run / "models" / "model.pt", map_location="cpu", weights_only=True)
    assert saved.keys() == wf.parser.get_parsed_content("network").state_dict().keys()
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "eval").iterdir())
    assert after == before  # nothing written into tests/bundles (no models/, no eval/)


@pytest.mark.filterwarnings("ignore:parsing config_file")  # MONAI's notice that a config is code: this one is ours
def test_zoo_2d_inference_writes_masks_at_each_inputs_own_size(trained_2d, polyp, tmp_path):
    import monai.bundle

    _, _, run, _, _ = trained_2d
    site = polyp["site-2"].parent
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(site / "images" / "polyp_000.png", inputs / "square.png")
    # a crop that is not square: a transposed mask would have the wrong shape
    Image.fromarray(png(site / "images" / "polyp_001.png")[:24, :, :]).save(inputs / "wide.png")
    ckpt = str(run / "models" / "model.pt")
    wf, missing = workflow(ZOO_2D, "inference.json", "infer", input_dir=str(inputs), ckpt_path=ckpt,
                           output_dir=str(tmp_path / "masks"), **SMALL_2D_INFER)
    assert missing == []
    wf.run()
    wf.finalize()
    for name, shape in (("square", (32, 32)), ("wide", (24, 32))):
        mask = png(tmp_path / "masks" / f"{name}_seg.png")
        assert mask.shape == shape and mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
    # MONAI's runner itself (what `python -m monai.bundle run` calls) gives the same masks
    monai.bundle.run(config_file=str(ZOO_2D / "configs" / "inference.json"), logging_file=False,
                     bundle_root=str(ZOO_2D), input_dir=str(inputs), ckpt_path=ckpt,
                     output_dir=str(tmp_path / "masks_run"), **SMALL_2D_INFER)
    for name in ("square", "wide"):
        np.testing.assert_array_equal(png(tmp_path / "masks_run" / f"{name}_seg.png"),
                                      png(tmp_path / "masks" / f"{name}_seg.png"))


def test_zoo_3d_inference_writes_masks_on_each_scans_own_grid(trained_3d, prostate, tmp_path):
    import nibabel as nib

    _, _, run, _, _ = trained_3d
    inputs = tmp_path / "in"
    inputs.mkdir()
    # one scan of each site: two stored orientations and voxel sizes to undo
    for site in ("site-1", "site-2"):
        shutil.copy(prostate[site].parent / "imagesTr" / "prostate3d_000.nii.gz", inputs / f"{site}.nii.gz")
    wf, missing = workflow(ZOO_3D, "inference.json", "infer", input_dir=str(inputs),
                           ckpt_path=str(run / "models" / "model.pt"), output_dir=str(tmp_path / "masks"), **SMALL_3D)
    assert missing == []
    wf.run()
    wf.finalize()
    for site in ("site-1", "site-2"):
        scan, mask = nib.load(inputs / f"{site}.nii.gz"), nib.load(tmp_path / "masks" / f"{site}_seg.nii.gz")
        assert mask.shape == scan.shape
        np.testing.assert_allclose(mask.affine, scan.affine, atol=1e-4)
        assert mask.get_data_dtype() == np.uint8 and set(np.unique(np.asarray(mask.dataobj)).tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("bundle", [ZOO_2D, ZOO_3D], ids=["zoo_2d", "zoo_3d"])
def test_inference_puts_each_mask_back_where_its_input_is(bundle, polyp, prostate, tmp_path):
    """Content, not only shape: a 1x1 convolution that thresholds the input stands in for the trained network, and
    the input is a label drawn as an image, so the written mask must be that label on the input's own grid. A
    transposed, flipped or shifted inverse (resize; orientation and spacing) would fail the Dice."""
    import nibabel as nib
    import torch

    inputs = tmp_path / "in"
    inputs.mkdir()
    if bundle is ZOO_2D:
        label = png(polyp["site-1"].parent / "labels" / "polyp_000.png")[:24]  # not square: a resize to undo
        Image.fromarray(np.repeat(label[..., None] * 255, 3, axis=2).astype(np.uint8)).save(inputs / "x.png")
        override = dict(SMALL_2D_INFER, network_def="$torch.nn.Conv2d(3, 2, 1)")
        weight, threshold = torch.tensor([[-1.0, 0, 0], [1.0, 0, 0]]), 0.5  # scaled intensity = label
    else:
        source = prostate["site-2"].parent / "labelsTr" / "prostate3d_000.nii.gz"  # stored RAI, 1.6 x 1.6 x 3.4 mm
        label = np.asarray(nib.load(source).dataobj)
        shutil.copy(source, inputs / "x.nii.gz")
        override = dict(SMALL_3D, network_def="$torch.nn.Conv3d(1, 2, 1)", intensity_max=2.0)
        weight, threshold = torch.tensor([[-1.0], [1.0]]), 0.25  # scaled intensity = label / 2
    wf, missing = workflow(bundle, "inference.json", "infer", input_dir=str(inputs), output_dir=str(tmp_path / "out"),
                           initialize=["$monai.utils.set_determinism(seed=0)"], **override)  # no checkpoint to load
    assert missing == []
    net = wf.parser.get_parsed_content("network")
    with torch.no_grad():  # class 1 wins where the scaled input exceeds the threshold
        net.weight.copy_(weight.reshape(net.weight.shape))
        net.bias.copy_(torch.tensor([threshold, -threshold]))
    wf.run()
    wf.finalize()
    out = tmp_path / "out" / ("x_seg.png" if bundle is ZOO_2D else "x_seg.nii.gz")
    mask = png(out) if bundle is ZOO_2D else np.asarray(nib.load(out).dataobj)
    truth = label > 0
    assert mask.shape == truth.shape and truth.any()
    dice = 2 * np.logical_and(mask > 0, truth).sum() / ((mask > 0).sum() + truth.sum())
    # measured: 1.0 (2-D), 0.98 (3-D: two bilinear resamplings blur the edge); the 3-D label flipped left-right,
    # nearly symmetric, still scores 0.86
    assert dice > 0.95, dice


def test_a_bundle_without_a_required_id_fails_the_property_check(tmp_path, polyp):
    """The property check can fail: a copy of zoo_2d whose training has no dataset_dir is refused."""
    copy = tmp_path / "broken"
    shutil.copytree(ZOO_2D, copy)
    config = json.loads((copy / "configs" / "train.json").read_text())
    config["images"] = config["images"].replace("@dataset_dir", repr(str(polyp["site-1"].parent)))
    config["labels"] = config["labels"].replace("@dataset_dir", repr(str(polyp["site-1"].parent)))
    del config["dataset_dir"]
    (copy / "configs" / "train.json").write_text(json.dumps(config))
    with pytest.raises(KeyError, match="dataset_dir"):
        workflow(copy, "train.json", "train", **SMALL_2D)


# ----------------------------------------------------------------------------------------------
# networks
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bundle", [ZOO_2D, ZOO_3D], ids=["zoo_2d", "zoo_3d"])
def test_network_matches_its_metadata(bundle):
    """MONAI's own check: the network built from train.json takes and returns the shapes metadata.json declares."""
    from monai.bundle import verify_net_in_out

    verify_net_in_out(net_id="network_def", meta_file=str(bundle / "configs" / "metadata.json"),
                      config_file=str(bundle / "configs" / "train.json"), device="cpu", n=1, any=1)


@pytest.mark.parametrize("bundle, override, name, channels, factor", [
    (ZOO_2D, SMALL_2D, "down_4", 16, 16),
    (ZOO_2D, {}, "down_4", 128, 16),
    (ZOO_3D, SMALL_3D, "model.1.submodule.1.submodule", 16, 4),
    (ZOO_3D, {}, "model.1.submodule.1.submodule.1.submodule", 128, 8),
], ids=["zoo_2d-small", "zoo_2d-default", "zoo_3d-small", "zoo_3d-default"])
def test_bottleneck_module_is_where_the_readme_says(bundle, override, name, channels, factor):
    import torch

    (net,) = parsed(bundle, "train.json", ["network_def"], **override)
    modules = dict(net.named_modules())
    assert name in modules and name in (bundle / "docs" / "README.md").read_text()
    seen = []
    modules[name].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    size = [32, 32] if bundle is ZOO_2D else [32, 32, 16]
    net.eval()
    with torch.no_grad():
        net(torch.zeros(1, 3 if bundle is ZOO_2D else 1, *size))
    assert seen == [torch.Size([1, channels, *(s // factor for s in size)])]
