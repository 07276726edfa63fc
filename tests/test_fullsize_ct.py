"""A site at full size, checked small: the CT-like volume generator of ``benchmarks/fullsize/fullsize_ct.py``, the disk cache for
training volumes beyond the memory budget (``cache_dir``, ``fedseg.engine.cache.SiteDataset``) against MONAI's plain
``Dataset``, and inference with the sliding window's output assembled on another device (``stitch_device``) against
the default path. Volumes here are a few dozen voxels a side; the full-size numbers are on docs/results/fullsize.md."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "fullsize"))
import fullsize_ct  # noqa: E402

from fedseg.data.datalist import load_datalist  # noqa: E402
from fedseg.engine.engine import SegEngine  # noqa: E402

SHAPE = (48, 40, 12)
SPACING = (8.0, 8.0, 10.0)  # a 384 x 320 x 120 mm field of view: air around the body, the organ and spine in it


@pytest.fixture(scope="module")
def ct(tmp_path_factory):
    return fullsize_ct.generate(tmp_path_factory.mktemp("ct"), 5, SHAPE, SPACING, target_spacing=SPACING)


def _small_config(datalist, **extra):
    # the small volumes keep their grid (48 x 40 x 12 voxels at 8 x 8 x 10 mm)
    return fullsize_ct.job_config(datalist, **{"target_spacing": list(SPACING), "patch_size": [16, 16, 8],
                                               "channels": [8, 16, 32], **extra})


def test_generated_volumes_are_ct_in_hounsfield_units_with_their_geometry(ct):
    data = load_datalist(ct)
    assert [len(data[s]) for s in ("training", "validation", "test")] == [3, 1, 1]
    image = nib.load(data["training"][0]["image"])
    label = nib.load(data["training"][0]["label"])
    assert image.get_data_dtype() == np.int16 and label.get_data_dtype() == np.uint8
    assert image.shape == label.shape == SHAPE and np.allclose(image.affine, label.affine)
    assert nib.aff2axcodes(image.affine) == ("L", "P", "S")
    assert np.allclose(nib.affines.voxel_sizes(image.affine), SPACING)
    assert np.allclose(image.header.get_zooms(), SPACING) and image.header.get_xyzt_units()[0] == "mm"
    hu = np.asarray(image.dataobj).astype(np.float32)
    organ = np.asarray(label.dataobj).astype(bool)
    assert 0.005 < organ.mean() < 0.2
    # each tissue at its value up to the noise: air at the corners, the organ, bone present
    assert abs(np.median(hu[organ]) - fullsize_ct.HU["organ"]) < 3 * fullsize_ct.NOISE_HU
    assert abs(np.median(hu[:3, :3]) - fullsize_ct.HU["air"]) < 3 * fullsize_ct.NOISE_HU
    assert (hu > 600).any() and ((hu > -200) & (hu < 0)).any()
    # a pure function of (shape, spacing, seed): volume 0 again is the same
    again, again_label = fullsize_ct.render_volume(SHAPE, SPACING, 0)
    assert np.array_equal(again, np.asarray(image.dataobj)) and np.array_equal(again_label, organ)


@pytest.mark.filterwarnings("error:Corrupt cache file")
def test_disk_cache_serves_what_decoding_gives_and_only_beyond_the_budget(ct, tmp_path):
    from monai.data import Dataset

    cache_dir = tmp_path / "disk"
    item_mb = 2 * 48 * 40 * 12 * 4 / 2**20  # image + label, float32, on the target grid
    engine = SegEngine("site-1", ct, _small_config(ct, cache_max_mb=1.5 * item_mb, cache_dir=str(cache_dir)))
    dataset = engine._dataset("training", train=True)
    assert dataset.cache_num == 1 and dataset._disk is not None
    plain = Dataset(dataset.data, transform=dataset.transform)

    def sample(ds, i):
        dataset.transform.set_random_state(seed=7)
        out = ds[i]
        return out[0] if isinstance(out, list) else out

    for epoch in range(2):  # the first reads decode and write, the second read the files back
        for i in range(3):
            got, want = sample(dataset, i), sample(plain, i)
            for key in ("image", "label"):
                assert torch.equal(torch.as_tensor(got[key]), torch.as_tensor(want[key])), (epoch, i, key)
        files = sorted(cache_dir.glob("*.pt"))
        assert len(files) == 2  # the two items beyond the budget, never the cached one
        if epoch == 0:
            written = [(f, f.stat().st_mtime_ns) for f in files]
    assert [(f, f.stat().st_mtime_ns) for f in files] == written  # read back, not decoded and written again
    # a file rewritten in place is decoded again (a new key), not served stale
    image = Path(dataset.data[2]["image"])
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    sample(dataset, 2)
    assert len(list(cache_dir.glob("*.pt"))) == 3
    # so is an item under other job settings (MONAI hashes the transforms by class name only)
    from fedseg.engine.cache import _file_stamp_hash

    item = dataset.data[0]
    assert _file_stamp_hash(item, {"intensity_window": [-160, 240]}) != _file_stamp_hash(item, {"intensity_window": [0, 80]})
    assert _file_stamp_hash(item, {"learning_rate": 1e-3}) == _file_stamp_hash(item, {"learning_rate": 1e-4})
    # evaluation data are never put on disk
    assert engine._dataset("test", train=False)._disk is None


def test_the_memory_cache_holds_volumes_resampled_and_windowed_as_the_budget_reckons(ct):
    """CacheDataset caches up to the first transform that is random or not a MONAI ``Transform``: the volume checks
    must count as transforms, else each volume would be cached as loaded (native grid, raw HU)."""
    from fedseg.engine.cache import volume_item_bytes

    cfg = _small_config(ct)
    engine = SegEngine("site-1", ct, cfg)
    dataset = engine._dataset("training", train=True)
    assert dataset.cache_num == 3
    item = dataset._cache[0]
    reference = nib.load(dataset.data[0]["image"])
    assert tuple(item["image"].shape) == (1, *reference.shape) and np.allclose(item["image"].pixdim, SPACING)
    window = np.clip((np.asarray(reference.dataobj, np.float32) - fullsize_ct.INTENSITY_WINDOW[0])
                     / (fullsize_ct.INTENSITY_WINDOW[1] - fullsize_ct.INTENSITY_WINDOW[0]), 0, 1)
    # stored LPS, cached RAS: x and y reversed
    assert np.allclose(item["image"][0].numpy(), window[::-1, ::-1, :], atol=1e-6)
    cached = sum(item[k].numel() * item[k].element_size() for k in ("image", "label"))
    assert cached == volume_item_bytes(dataset.data[0], engine.train_config, True, 1)


def test_without_cache_dir_items_beyond_the_budget_are_decoded_on_access(ct):
    engine = SegEngine("site-1", ct, _small_config(ct, cache_max_mb=0))
    dataset = engine._dataset("training", train=True)
    assert dataset.cache_num == 0 and dataset._disk is None


def _infer(ct, tmp_path, name, **kwargs):
    from fedseg.bundle import bundle_for_task, load_bundle
    from fedseg.inference import run_inference

    cfg = _small_config(ct, sw_batch_size=2)
    network = load_bundle(bundle_for_task(cfg), cfg).get_parsed_content("network_def", instantiate=True, lazy=False)
    torch.manual_seed(0)
    with torch.no_grad():  # weights that give both classes somewhere
        for p in network.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ckpt = tmp_path / "model.pt"
    torch.save({"model": network.state_dict(), "train_config": cfg}, ckpt)
    (mask,) = run_inference(ckpt, tmp_path / name, datalist=ct, split="test", class_indices=True, **kwargs)
    return nib.load(str(mask))


def _check_stitching(ct, tmp_path, stitch_device):
    default = _infer(ct, tmp_path, "default")
    split = _infer(ct, tmp_path, "split", stitch_device=stitch_device)
    image = nib.load(load_datalist(ct)["test"][0]["image"])
    for out in (default, split):
        assert out.shape == image.shape and np.allclose(out.affine, image.affine, atol=1e-4)
    assert np.array_equal(np.asarray(split.dataobj), np.asarray(default.dataobj))
    return np.asarray(split.dataobj)


def test_inference_stitched_on_cpu_equals_the_default_path_in_the_input_geometry(ct, tmp_path):
    from fedseg.inference import _workflow

    # the option reaches MONAI's sliding window as its output device; the windows stay on the network's device
    inferer = _workflow("inference.json", None, {"sw_stitch_device": "cpu"}, {"spatial_dims": 3}).parser.get_parsed_content("inferer")
    assert inferer.device == "cpu" and inferer.sw_device is None
    mask = _check_stitching(ct, tmp_path, "cpu")
    assert 0 < (mask == 1).mean() < 1  # several windows, both classes: a real comparison


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")
def test_inference_windows_on_cuda_stitched_on_cpu_equals_all_on_cuda(ct, tmp_path):
    _check_stitching(ct, tmp_path, "cpu")
