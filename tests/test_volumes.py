"""3-D volumes: geometry checks, volume settings, the cache budget, predictions inverted to each scan's own geometry
(checked with an oracle network against the label file, in 3-D and in slice mode, on a site that stores its volumes
flipped), per-volume metrics in mm, and NIfTI masks aligned with their input."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from fedseg.config import resolve_profile
from fedseg.data.checks import check_datalist
from fedseg.data.datalist import DatalistError
from fedseg.data.volumes import (
    check_volume_pair,
    crop_shape,
    federation_volume_config,
    resolve_volume_settings,
)
from fedseg.engine import SegEngine
from fedseg.engine.cache import CacheBudget
from fedseg.engine.spatial import SliceNetwork

LABELS = {"labels": {"background": 0, "pz": 1, "tz": 2}, "regions": {"prostate": ["pz", "tz"]}}


def _write(path: Path, array: np.ndarray, affine: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(array, affine), str(path))
    return path


def _affine(spacing, flip=False, origin=(4.0, -2.0, 6.0)):
    aff = np.diag(list(spacing) + [1.0])
    if flip:  # stored L->R and P->A: an LPS-like site
        aff[0, 0], aff[1, 1] = -aff[0, 0], -aff[1, 1]
    aff[:3, 3] = origin
    return aff


def _phantom(shape, spacing, seed):
    """Two zones of an ellipsoid placed in mm (so the anatomy does not scale with the voxel size); the image stores
    the class as its intensity (0 / 100 / 200 HU), so a window-reading oracle can segment it exactly."""
    rng = np.random.default_rng(seed)
    axes = [np.arange(n) * s for n, s in zip(shape, spacing)]
    x, y, z = np.meshgrid(*axes, indexing="ij")
    centre = [n * s / 2 + rng.normal(0, 1.5) for n, s in zip(shape, spacing)]
    r = np.sqrt(((x - centre[0]) / 9) ** 2 + ((y - centre[1]) / 8) ** 2 + ((z - centre[2]) / 10) ** 2)
    label = np.zeros(shape, np.uint8)
    label[r < 1] = 1
    label[(r < 0.6)] = 2
    image = (label * 100.0).astype(np.float32)
    return image, label


def _site(root: Path, name: str, spacing, flip: bool, shape, n: int = 5, extra=None) -> Path:
    entries = []
    for i in range(n):
        image, label = _phantom(shape, spacing, seed=i + 10 * len(name))
        aff = _affine(spacing, flip)
        _write(root / name / "images" / f"{i:03d}.nii.gz", image, aff)
        _write(root / name / "labels" / f"{i:03d}.nii.gz", label, aff)
        entries.append({"image": f"images/{i:03d}.nii.gz", "label": f"labels/{i:03d}.nii.gz"})
    data = {**LABELS, "spatial_dims": 3, "modality": "CT", "intensity_window": [0, 200], "target_spacing": [1.0, 1.0, 2.0],
            "training": entries[:3], "validation": entries[3:4], "test": entries[4:], **(extra or {})}
    path = root / name / "datalist.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    root = tmp_path_factory.mktemp("volumes")
    return {"ras": _site(root, "ras", (0.8, 0.7, 2.5), False, (40, 44, 10)),
            "flipped": _site(root, "flipped", (0.6, 0.9, 1.5), True, (52, 36, 16))}


def _config(mode: str, **extra):
    fields = {"num_classes": 3, **LABELS, "spatial_dims": 3, "in_channels": 1, "spatial_mode": mode,
              "patch_size": [16, 16, 8] if mode == "patch" else 16, "channels": [8, 16, 32]}
    return resolve_profile("tiny", **{**fields, **extra})["train_config"]


class _Oracle(torch.nn.Module):
    """A 1x1(x1) convolution reading the CT window: class k where the scaled intensity is near k / 2."""

    def __init__(self, dims: int):
        super().__init__()
        conv = torch.nn.Conv3d if dims == 3 else torch.nn.Conv2d
        self.conv = conv(1, 3, kernel_size=1)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.bias.zero_()
            self.conv.weight[1], self.conv.bias[1] = 20.0, -5.0   # > background from 0.25
            self.conv.weight[2], self.conv.bias[2] = 40.0, -20.0  # > class 1 from 0.75

    def forward(self, x):
        return self.conv(x)


# ------------------------------------------------------------------------------------------------ checks
def test_geometry_mismatch_names_both_files_and_geometries(tmp_path):
    img = _write(tmp_path / "img.nii.gz", np.zeros((8, 8, 4), np.float32), _affine((1, 1, 2)))
    lab = _write(tmp_path / "lab.nii.gz", np.zeros((8, 8, 4), np.uint8), _affine((1, 1, 2), origin=(4.0, -2.0, 9.0)))
    with pytest.raises(DatalistError) as err:
        check_volume_pair(img, lab)
    message = str(err.value)
    assert str(img) in message and str(lab) in message and "origin (4, -2, 6)" in message and "origin (4, -2, 9)" in message
    other = _write(tmp_path / "lab2.nii.gz", np.zeros((8, 7, 4), np.uint8), _affine((1, 1, 2)))
    with pytest.raises(DatalistError, match=r"shape \(8, 7, 4\)"):
        check_volume_pair(img, other)


def test_four_d_images_need_declared_channels_and_2d_files_are_refused(tmp_path):
    img4 = _write(tmp_path / "mp.nii.gz", np.zeros((8, 8, 4, 2), np.float32), _affine((1, 1, 2)))
    lab = _write(tmp_path / "lab.nii.gz", np.zeros((8, 8, 4), np.uint8), _affine((1, 1, 2)))
    with pytest.raises(DatalistError, match="4-D with 2 volumes.*image_channels"):
        check_volume_pair(img4, lab)
    geo, _ = check_volume_pair(img4, lab, ["T2", "ADC"])
    assert geo.channels == 2 and geo.spatial_shape == (8, 8, 4)
    flat = _write(tmp_path / "flat.nii.gz", np.zeros((8, 8), np.float32), _affine((1, 1, 2)))
    with pytest.raises(DatalistError, match="a 2-D file in a 3-D job"):
        check_volume_pair(flat, lab)


def test_settings_are_declared_never_guessed():
    with pytest.raises(ValueError, match="must declare the voxel spacing"):
        resolve_volume_settings({}, {"spatial_dims": 3}, "(site x)")
    with pytest.raises(ValueError, match="CT job must declare its window"):
        resolve_volume_settings({}, {"target_spacing": [1, 1, 2], "modality": "CT"})
    with pytest.raises(ValueError, match="target_spacing.*datalist declares \\[1, 1, 2\\].*\\[1, 1, 3\\]"):
        resolve_volume_settings({"target_spacing": [1, 1, 3]}, {"target_spacing": [1, 1, 2]})
    out = resolve_volume_settings({}, {"target_spacing": 1.5})
    assert out["target_spacing"] == [1.5, 1.5, 1.5] and out["modality"] == "MR" and out["orientation"] == "RAS"
    assert crop_shape([32, 32, 8]) == [32, 32, 8] and crop_shape(16) == [16, 16, 16]
    assert crop_shape(32, "slices", 2) == [32, 32, 1] and crop_shape([32, 24], "slices", 0) == [1, 32, 24]


def test_federation_volume_settings_must_agree(tmp_path, sites):
    fields = federation_volume_config(sites)
    assert fields["spatial_dims"] == 3 and fields["in_channels"] == 1 and fields["target_spacing"] == [1.0, 1.0, 2.0]
    other = _site(tmp_path, "coarse", (1.0, 1.0, 3.0), False, (20, 20, 6), n=3,
                  extra={"target_spacing": [1.0, 1.0, 3.0], "validation": [], "test": []})
    with pytest.raises(DatalistError, match="target_spacing differs") as err:
        federation_volume_config({**sites, "coarse": other})
    assert str(other) in str(err.value)


def test_check_datalist_reads_volumes_and_refuses_a_2d_file(tmp_path, sites):
    assert check_datalist(sites["flipped"])["files"] == 10
    data = json.loads(Path(sites["ras"]).read_text())
    png = tmp_path / "flat.png"
    from PIL import Image

    Image.fromarray(np.zeros((20, 20), np.uint8)).save(png)
    data["test"] = [{"image": str(png), "label": str(png)}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**data, "allow_external_paths": True}))
    with pytest.raises(DatalistError, match="not a volume file"):
        check_datalist(bad)


# ------------------------------------------------------------------------------- geometry of predictions
@pytest.mark.parametrize("mode", ["patch", "slices"])
def test_predictions_return_to_each_scans_own_geometry(sites, mode):
    """An oracle network that reads the class from the intensity: after resampling to 1 x 1 x 2 mm, reorienting the
    flipped site to RAS and inverting both back, the prediction matches the label file it never saw (Dice ~ 1 per
    class); a transposed, flipped or unresampled prediction could not. Distances come in mm from the header."""
    engine = SegEngine("flipped", sites["flipped"], _config(mode))
    assert engine.volumes and engine.spatial_mode == mode
    oracle = _Oracle(3 if mode == "patch" else 2)
    means, rows = engine.evaluate(oracle, "test", per_image=True)
    assert means["dice:pz"] > 0.9 and means["dice:tz"] > 0.9 and means["dice:prostate"] > 0.95, means
    assert means["hd95_mm"] <= 2.0 and rows[0]["id"] == "004.nii.gz"
    label = np.asarray(nib.load(str(Path(sites["flipped"]).parent / "labels" / "004.nii.gz")).dataobj)
    (inputs, labels, logits, _), = list(engine.iterate_logits(oracle, "test"))
    assert tuple(logits.shape[2:]) == label.shape == tuple(labels.shape[2:]) == tuple(inputs.shape[2:])
    np.testing.assert_array_equal(labels[0, 0].numpy(), label)


def test_slice_network_is_the_2d_network_slice_by_slice():
    net = torch.nn.Conv2d(2, 3, kernel_size=3, padding=1)
    x = torch.randn(1, 2, 6, 5, 4)
    for axis in (0, 1, 2):
        window = x.narrow(2 + axis, 1, 1)
        expected = net(window.squeeze(2 + axis)).unsqueeze(2 + axis)
        torch.testing.assert_close(SliceNetwork(net, axis)(window), expected)
    with pytest.raises(ValueError, match="one slice thick"):
        SliceNetwork(net, 2)(x)


def test_a_volume_larger_than_the_cache_budget_is_decoded_on_access(sites):
    cfg = _config("patch", cache_max_mb=0.01)
    engine = SegEngine("ras", sites["ras"], cfg)
    dataset = engine._dataset("training", train=True)
    assert engine.cache.used_bytes == 0 and len(dataset._cache) == 0  # nothing fits: nothing cached
    from fedseg.objectives.base import ClientObjective, RoundContext

    out = engine.train(engine.build_network(), ClientObjective(), RoundContext("ras", 0, 1, train_config=cfg))
    assert np.isfinite(out["train_loss"])
    budget = CacheBudget(1000, channels=1)
    item = {"image": str(Path(sites["ras"]).parent / "images" / "000.nii.gz")}
    # 40 x 44 x 10 voxels at 0.8 x 0.7 x 2.5 mm -> 32 x 31 x 13 at 1 x 1 x 2 mm; image + label, float32
    assert budget.reserve([item], engine.train_config, train=True) == 1 and budget.used_bytes == 2 * 32 * 31 * 13 * 4


@pytest.mark.parametrize("mode", ["patch", "slices"])
def test_inference_writes_nifti_masks_aligned_with_their_input(tmp_path, sites, mode):
    """fedseg's inference (the volume bundle's inference.json) with the oracle as the network: every written mask has
    its input's shape and affine and matches the label file voxel for voxel (up to resampling at the borders)."""
    from fedseg.inference import run_inference

    dims = 3 if mode == "patch" else 2
    oracle = _Oracle(dims).conv
    ckpt = tmp_path / "FL_global_model.pt"
    cfg = {**_config(mode), "modality": "CT", "intensity_window": [0, 200], "target_spacing": [1.0, 1.0, 2.0]}
    torch.save({"model": oracle.state_dict(), "train_config": cfg}, ckpt)
    conv = {"_target_": f"torch.nn.Conv{dims}d", "in_channels": 1, "out_channels": 3, "kernel_size": 1}
    folder = Path(sites["flipped"]).parent / "images"
    written = run_inference(ckpt, tmp_path / "out", input_dir=folder, class_indices=True, overrides={"network_def": conv})
    assert [w.name for w in written] == [f"{i:03d}_seg.nii.gz" for i in range(5)]
    for w in written:
        src, out = nib.load(str(folder / w.name.replace("_seg", ""))), nib.load(str(w))
        assert out.shape == src.shape and np.allclose(out.affine, src.affine, atol=1e-4)
        pred = np.asarray(out.dataobj)
        truth = np.asarray(nib.load(str(folder.parent / "labels" / w.name.replace("_seg", ""))).dataobj)
        for c in (1, 2):
            dice = 2 * ((pred == c) & (truth == c)).sum() / ((pred == c).sum() + (truth == c).sum())
            assert dice > 0.9, (w.name, c, dice)


def test_a_four_d_site_trains_with_its_declared_channels(tmp_path):
    """Two sequences stored as one 4-D NIfTI: with image_channels declared the network takes two input channels;
    the same site without the declaration is refused before training."""
    from fedseg.objectives.base import ClientObjective, RoundContext

    spacing = (1.0, 1.0, 2.0)
    entries = []
    for i in range(3):
        image, label = _phantom((24, 24, 8), spacing, seed=i)
        stack = np.stack([image, image[::-1]], axis=-1)  # (X, Y, Z, 2): a second "sequence"
        _write(tmp_path / f"img{i}.nii.gz", stack, _affine(spacing))
        _write(tmp_path / f"lab{i}.nii.gz", label, _affine(spacing))
        entries.append({"image": f"img{i}.nii.gz", "label": f"lab{i}.nii.gz"})
    data = {**LABELS, "spatial_dims": 3, "modality": "MR", "target_spacing": [1.0, 1.0, 2.0], "image_channels": ["T2", "ADC"],
            "training": entries[:1], "validation": entries[1:2], "test": entries[2:]}
    path = tmp_path / "datalist.json"
    path.write_text(json.dumps(data))
    fields = federation_volume_config({"s": path})
    assert fields["in_channels"] == 2 and fields["image_channels"] == ["T2", "ADC"]
    cfg = _config("patch", **{k: v for k, v in fields.items() if k not in ("spatial_dims",)})
    engine = SegEngine("s", path, cfg)
    model = engine.build_network()
    assert engine.train_config["in_channels"] == 2 and model.in_channels == 2
    out = engine.train(model, ClientObjective(), RoundContext("s", 0, 1, train_config=cfg))
    assert np.isfinite(out["train_loss"]) and "dice:prostate" in engine.evaluate(model, "test")
    del data["image_channels"]
    path.write_text(json.dumps(data))
    with pytest.raises(DatalistError, match="4-D with 2 volumes"):
        SegEngine("s", path, _config("patch"))


def test_monai_bundle_tooling_on_the_volume_bundle(tmp_path, sites):
    """``verify_net_in_out`` passes for the declared 3-D network (and 2-D in slice mode); MONAI's own ``run`` on
    train.json + inference.json writes a NIfTI mask with its input's affine."""
    import fire
    import monai.bundle.__main__ as cli
    from monai.bundle import run

    configs = Path(__file__).resolve().parents[1] / "bundles" / "volume_seg" / "configs"
    argv = ["network_def", "--meta_file", str(configs / "metadata.json"), "--config_file", str(configs / "train.json"),
            "--device", "cpu", "--n", "2"]
    fire.Fire(cli.verify_net_in_out, command=argv, name="verify_net_in_out")
    plane = '["8*n", "8*n"]'
    fire.Fire(cli.verify_net_in_out, command=argv + ["--spatial_mode", "slices", "--_meta_#network_data_format#inputs#image#spatial_shape",
                                                     plane, "--_meta_#network_data_format#outputs#pred#spatial_shape", plane],
              name="verify_net_in_out")
    from fedseg.bundle import build_network

    net = build_network({"spatial_dims": 3, "num_classes": 3, "in_channels": 1, "channels": [8, 16, 32]})
    ckpt = tmp_path / "model.pt"
    torch.save(net.state_dict(), ckpt)
    folder = Path(sites["flipped"]).parent / "images"
    run(config_file=[str(configs / "train.json"), str(configs / "inference.json")], meta_file=str(configs / "metadata.json"),
        logging_file=False, bundle_root=str(configs.parent), ckpt_path=str(ckpt), input_dir=str(folder), output_dir=str(tmp_path / "out"),
        num_classes=3, channels=[8, 16, 32], patch_size=[16, 16, 8], target_spacing=[1.0, 1.0, 2.0], modality="CT",
        intensity_window=[0, 200])
    src, out = nib.load(str(folder / "000.nii.gz")), nib.load(str(tmp_path / "out" / "000_seg.nii.gz"))
    assert out.shape == src.shape and np.allclose(out.affine, src.affine, atol=1e-4)


def test_pathfl_and_fedefm_downstream_refuse_3d_networks():
    from fedseg.recipes import get_recipe_class

    with pytest.raises(ValueError, match="PathFL is 2-D only"):
        get_recipe_class("pathfl")(profile="tiny", spatial_dims=3, spatial_mode="patch")
    get_recipe_class("pathfl")(profile="tiny", spatial_dims=3, spatial_mode="slices")  # a 2-D network on slices
    with pytest.raises(ValueError, match="downstream UNETR is 2-D only"):
        get_recipe_class("fedefm_downstream")(profile="tiny", spatial_dims=3)


def test_volumes_keep_the_whole_volume_pass(sites):
    """The window sample (GraphFedSeg's U_i, FedEvi's surrogate at native resolution) is 2-D: a volume job in patch
    mode keeps the pass over every whole volume, and asking the engine for a sample says why it cannot."""
    engine = SegEngine("ras", sites["ras"], _config("patch"))
    assert engine.spatial_mode == "patch" and not engine.window_sample_available
    with pytest.raises(ValueError, match="volumes"):
        engine.window_sample("validation", 4, 0, "x")
