"""The MONAI bundle ``bundles/unet2d_seg`` as MONAI's own tooling sees it.

Covers the metadata (offline schema check), network I/O check, TorchScript export, one epoch of
``train.json``, ``inference.json`` on new images (mask size, values, alignment) and ``evaluate.json``.
Everything is written under pytest's tmp folders; a module fixture asserts the bundle folder is
unchanged afterwards. Small ``channels`` and 32-pixel images keep the module at tens of seconds on CPU;
only ``verify_metadata`` runs in a separate (offline) interpreter, once for every shipped bundle
(:func:`verify_metadata_offline`), the other CLI commands go through the same fire front end in-process.
"""

from __future__ import annotations

import json
import math
import os
import functools
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedseg.bundle import load_bundle
from fedseg.data.synthetic import generate_site_data
from fedseg.inference import CheckpointMismatchError, evaluate_checkpoint, run_inference

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "bundles" / "unet2d_seg"
CONFIGS = BUNDLE / "configs"
META = CONFIGS / "metadata.json"
SCHEMA = CONFIGS / "metadata_schema.json"
TRAIN = CONFIGS / "train.json"

#: a small network and image size: same code paths as the defaults, a fraction of the CPU time
SMALL = {"channels": [4, 8, 16, 32, 64], "image_size": 32}

#: train.json's "imports" holds "$import fedseg.data.transforms", which MONAI binds under the dotted
#: name only, so its ``fedseg.data.datalist`` expression needs the package itself in scope. An extra
#: import id is harmless once train.json imports "fedseg" itself.
TRAIN_IMPORT_FIX = {"extra_imports": ["$import fedseg"]}


def _offline_env() -> dict:
    """Environment whose proxies point at a closed local port: any download attempt fails fast."""
    env = dict(os.environ)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env[var] = "http://127.0.0.1:9"
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    return env


#: every shipped bundle (their tests read :func:`verify_metadata_offline`)
SHIPPED_BUNDLES = ("unet2d_seg", "vit_foundation", "unetr_seg")
_SECTION = "=== verify_metadata "
#: ``python -m monai.bundle verify_metadata --meta_file M --filepath S`` for each bundle in its own folder, run by
#: the same fire front end ``monai/bundle/__main__.py`` uses, one interpreter for all (one ~10 s MONAI import)
_VERIFY_ALL = """
import os, sys, fire
import monai.bundle.__main__ as cli
for root in sys.argv[1:]:
    os.chdir(root)
    print(%r + root, flush=True)
    fire.Fire(cli.verify_metadata, command=["--meta_file", "configs/metadata.json", "--filepath",
                                            "configs/metadata_schema.json"], name="verify_metadata")
    sys.stdout.flush()
""" % _SECTION


@functools.lru_cache(maxsize=None)
def verify_metadata_offline() -> dict:
    """``monai.bundle verify_metadata`` of every shipped bundle against its shipped schema, in a fresh interpreter
    that cannot reach the network; returns ``{bundle name: its output}``. Run once per test session."""
    roots = [str(REPO / "bundles" / name) for name in SHIPPED_BUNDLES]
    proc = subprocess.run(
        [sys.executable, "-c", _VERIFY_ALL, *roots], env=_offline_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"monai.bundle verify_metadata failed:\n{proc.stdout[-5000:]}"
    sections = proc.stdout.split(_SECTION)[1:]
    outputs = {Path(text.splitlines()[0]).name: text for text in sections}
    assert sorted(outputs) == sorted(SHIPPED_BUNDLES), proc.stdout[-3000:]
    return outputs


def _fire_cli(command: str, argv: list) -> None:
    """``python -m monai.bundle <command> <argv>`` without a new interpreter.

    ``monai/bundle/__main__.py`` is ``fire.Fire()`` over these functions, so handing the same argv to
    fire here runs the same argument parsing and code; it saves a ~10 s MONAI import per command.
    """
    import fire
    import monai.bundle.__main__ as cli

    fire.Fire(getattr(cli, command), command=list(argv), name=command)


def _files(root: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module", autouse=True)
def bundle_untouched():
    """Tests must never write into the repository's bundle folder."""
    before = _files(BUNDLE)
    yield
    assert _files(BUNDLE) == before, "a test wrote into the bundle folder"


@pytest.fixture(scope="module")
def datalist(tmp_path_factory) -> Path:
    return generate_site_data("vessel", "site-1", tmp_path_factory.mktemp("data"), seed=0, profile="tiny")


@pytest.fixture(scope="module")
def trained_ckpt(tmp_path_factory, datalist) -> Path:
    """One epoch of the bundle's own ``train.json`` workflow; returns the ``CheckpointSaver`` output."""
    from monai.bundle import run

    out = tmp_path_factory.mktemp("train")
    run(
        config_file=str(TRAIN),
        meta_file=str(META),
        logging_file=False,
        bundle_root=str(BUNDLE),
        ckpt_dir=str(out / "models"),
        output_dir=str(out / "eval"),
        datalist=str(datalist),
        max_epochs=1,
        batch_size=4,
        **SMALL,
        **TRAIN_IMPORT_FIX,
    )
    return out / "models" / "model.pt"


def _small_network(state_dict=None) -> torch.nn.Module:
    net = load_bundle(BUNDLE, SMALL).get_parsed_content("network_def", lazy=False)
    if state_dict is not None:
        net.load_state_dict(state_dict)
    return net.eval()


# ----------------------------------------------------------------------------------------------
# metadata
# ----------------------------------------------------------------------------------------------


def test_verify_metadata_offline():
    assert "metadata is verified with no error" in verify_metadata_offline()[BUNDLE.name]
    # the official URL stays in the file: a fresh --filepath validates against the model-zoo schema
    assert json.loads(META.read_text())["schema"].endswith("/meta_schema_20240725.json")


@pytest.mark.parametrize(
    "breakage",
    [
        "drop:version",
        "drop:network_data_format",
        "drop:required_packages_version",
        "drop_output_field:channel_def",
        "bad_value_range",
        "deprecated_optional_packages",
    ],
)
def test_verify_metadata_rejects_broken_copy(tmp_path, breakage):
    from monai.bundle import verify_metadata

    meta = json.loads(META.read_text())
    kind, _, field = breakage.partition(":")
    if kind == "drop":
        del meta[field]
    elif kind == "drop_output_field":
        del meta["network_data_format"]["outputs"]["pred"][field]
    elif kind == "bad_value_range":
        meta["network_data_format"]["inputs"]["image"]["value_range"] = [0]
    else:  # MONAI renames this key onto required_packages_version, clobbering it
        meta["optional_packages_version"] = {"nibabel": "5.0.0"}
    broken = tmp_path / "metadata.json"
    broken.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="against schema"):
        verify_metadata(meta_file=str(broken), filepath=str(SCHEMA))


# ----------------------------------------------------------------------------------------------
# network checks and export
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [None, 1, 3])
def test_verify_net_in_out(n):
    """Every size the metadata declares must pass, starting with the model zoo's default ``--n 1``
    (``None``: the option left out). "32*n" keeps a 2x2 bottleneck at n=1 for the 5-level network;
    the former "16*n" gave 16 x 16 there, a 1x1 bottleneck that instance norm refuses."""
    argv = ["network_def", "--meta_file", str(META), "--config_file", str(TRAIN), "--device", "cpu"]
    if n is not None:
        argv += ["--n", str(n)]
    _fire_cli("verify_net_in_out", argv)


def test_verify_net_in_out_sizes_are_declared():
    """The declared shapes are the network's: 32 px (n=1) is the smallest valid input, 16 px is not."""
    from monai.bundle.scripts import _get_fake_spatial_shape

    meta = json.loads(META.read_text())
    for tensor in ("inputs", "outputs"):
        fmt = meta["network_data_format"][tensor]
        spec = fmt["image" if tensor == "inputs" else "pred"]["spatial_shape"]
        assert _get_fake_spatial_shape(spec, n=1) == (32, 32)
    net = load_bundle(BUNDLE).get_parsed_content("network_def", lazy=False).eval()
    with torch.no_grad():
        assert net(torch.rand(1, 3, 32, 32)).shape == (1, 2, 32, 32)
        with pytest.raises(ValueError, match="more than 1 spatial element"):
            net(torch.rand(1, 3, 16, 16))


def test_ckpt_export_torchscript_matches_eager(tmp_path, trained_ckpt):
    # NVFlare's global-model layout; the CheckpointSaver's plain state_dict is exercised by inference
    state = torch.load(trained_ckpt, weights_only=True)
    nvflare_ckpt = tmp_path / "FL_global_model.pt"
    torch.save({"model": state, "train_conf": {"train": {"model": "network_def"}}}, nvflare_ckpt)
    ts_path = tmp_path / "model.ts"
    argv = [
        "network_def",
        "--filepath", str(ts_path),
        "--ckpt_file", str(nvflare_ckpt),
        "--meta_file", str(META),
        "--config_file", str(TRAIN),
        "--key_in_ckpt", "model",
        "--channels", json.dumps(SMALL["channels"]),
    ]  # fmt: skip
    _fire_cli("ckpt_export", argv)
    scripted = torch.jit.load(str(ts_path))
    eager = _small_network(state)
    x = torch.rand(2, 3, 48, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), eager(x), rtol=1e-5, atol=1e-5)

    from monai.data import load_net_with_metadata

    _, meta, extra = load_net_with_metadata(str(ts_path), more_extra_files=["train.json"])
    assert meta["network_data_format"]["outputs"]["pred"]["num_channels"] == 2
    assert json.loads(extra["train.json"])["network_def"]["_target_"] == "fedseg.networks.FeatureUNet"


# ----------------------------------------------------------------------------------------------
# train / infer / evaluate
# ----------------------------------------------------------------------------------------------


def test_train_one_epoch_writes_checkpoint(trained_ckpt):
    state = torch.load(trained_ckpt, weights_only=True)
    _small_network(state)  # loads strictly: the checkpoint is the bundle network's state_dict


def test_inference_on_folder(tmp_path, trained_ckpt):
    rng = np.random.default_rng(0)
    src = tmp_path / "new"
    src.mkdir()
    sizes = {  # name -> (H, W) as PIL writes it
        "wide.png": (40, 72),
        "tall_grey.PNG": (50, 30),
        "square.jpg": (32, 32),
        "rgba.tif": (36, 44),
    }
    for name, (h, w) in sizes.items():
        channels = {"tall_grey.PNG": 1, "rgba.tif": 4}.get(name, 3)
        arr = (rng.random((h, w, channels)) * 255).astype(np.uint8)
        Image.fromarray(arr.squeeze(-1) if channels == 1 else arr).save(src / name)
    (src / "notes.txt").write_text("not an image")

    masks = run_inference(trained_ckpt, tmp_path / "out", input_dir=src, overrides=SMALL)

    expected = {f"{Path(n).stem}_seg.png" for n in sizes}
    assert {m.name for m in masks} == expected
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(expected)  # flat, nothing else
    for name, (h, w) in sizes.items():
        img = Image.open(tmp_path / "out" / f"{Path(name).stem}_seg.png")
        assert img.mode == "L" and img.size == (w, h), name
        assert set(np.unique(np.asarray(img)).tolist()) <= {0, 255}, name


def test_inference_keeps_the_largest_component_when_asked(tmp_path, trained_ckpt):
    """``largest_component=True``: each written mask is the raw mask's largest 4-connected foreground component
    (``scipy.ndimage.label``), on the input's own grid."""
    from scipy import ndimage

    rng = np.random.default_rng(1)
    src = tmp_path / "new"
    src.mkdir()
    for i in range(3):
        Image.fromarray((rng.random((40, 56, 3)) * 255).astype(np.uint8)).save(src / f"img{i}.png")
    raw = run_inference(trained_ckpt, tmp_path / "raw", input_dir=src, overrides=SMALL)
    kept = run_inference(trained_ckpt, tmp_path / "lcc", input_dir=src, overrides=SMALL, largest_component=True)
    reduced = 0
    for a, b in zip(sorted(raw), sorted(kept)):
        fg = np.asarray(Image.open(a)) > 0
        labels, n = ndimage.label(fg)
        expected = labels == (np.bincount(labels.ravel())[1:].argmax() + 1) if n else fg
        assert np.array_equal(np.asarray(Image.open(b)) > 0, expected), b.name
        reduced += n > 1
    assert reduced, "no mask had more than one component: the test would not see the option"


def test_inference_mask_aligns_with_input(tmp_path):
    """A known 'network' (1x1 conv: foreground where red > 0.5) pins orientation and the inverse resize.

    The image is non-square and the object sits in one corner, so a transposed or flipped mask, or one
    left at the network's 32 x 32 grid, cannot match.
    """
    h, w = 40, 72
    img = np.zeros((h, w, 3), dtype=np.uint8)
    img[4:20, 48:68, 0] = 255  # top-right red block
    img[..., 1] = 90
    (tmp_path / "new").mkdir()
    Image.fromarray(img).save(tmp_path / "new" / "corner.png")
    truth = img[..., 0] > 127

    oracle = torch.nn.Conv2d(3, 2, kernel_size=1)
    with torch.no_grad():
        oracle.weight.zero_()
        oracle.bias.zero_()
        oracle.weight[1, 0] = 1.0
        oracle.bias[1] = -0.5
    ckpt = tmp_path / "FL_global_model.pt"
    torch.save({"model": oracle.state_dict(), "train_conf": {}}, ckpt)
    net_def = {"_target_": "torch.nn.Conv2d", "in_channels": 3, "out_channels": 2, "kernel_size": 1}

    (mask_path,) = run_inference(
        ckpt, tmp_path / "out", input_dir=tmp_path / "new", overrides={"image_size": 32, "network_def": net_def}
    )
    mask = np.asarray(Image.open(mask_path)) > 0
    assert mask.shape == truth.shape
    agreement = (mask == truth).mean()
    assert agreement > 0.97, agreement
    rows, cols = np.nonzero(mask)
    assert rows.mean() < h / 2 and cols.mean() > w / 2  # still top-right


def test_inference_on_datalist_split(tmp_path, trained_ckpt, datalist):
    n_test = len(json.loads(Path(datalist).read_text())["test"])
    masks = run_inference(trained_ckpt, tmp_path / "out", datalist=datalist, split="test", overrides=SMALL)
    assert len(masks) == n_test and all(m.is_file() for m in masks)


def test_inference_rejects_mismatched_checkpoint(tmp_path, trained_ckpt):
    (tmp_path / "new").mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "new" / "a.png")
    # default channels (16..256) against a checkpoint trained with SMALL channels
    with pytest.raises(CheckpointMismatchError, match=re.escape(str(trained_ckpt))):
        run_inference(trained_ckpt, tmp_path / "out", input_dir=tmp_path / "new", overrides={"image_size": 32})
    assert not (tmp_path / "out").exists()


def test_evaluate_checkpoint(tmp_path, trained_ckpt, datalist):
    metrics = evaluate_checkpoint(trained_ckpt, datalist, split="test", output_dir=tmp_path, overrides=SMALL)
    assert set(metrics) == {"mean_dice", "hausdorff95", "surface_distance"}
    assert math.isfinite(metrics["mean_dice"]) and 0.0 <= metrics["mean_dice"] <= 1.0
    assert (tmp_path / "metrics.csv").is_file() and (tmp_path / "mean_dice_raw.csv").is_file()


# ----------------------------------------------------------------------------------------------
# spatial modes: evaluate.json / inference.json against the engine
# ----------------------------------------------------------------------------------------------

#: 4 levels -> patches must be multiples of 8 and >= 16; the tiny vessel site has 32 px images
TINY_NET = {"channels": [8, 16, 32, 64]}
MODES = {
    "resize": {**TINY_NET, "spatial_mode": "resize", "image_size": 16},
    "patch": {**TINY_NET, "spatial_mode": "patch", "patch_size": 16},
    "patch_rescale": {**TINY_NET, "spatial_mode": "patch", "patch_size": 16, "rescale": 0.75},
}


@pytest.fixture(scope="module")
def vessel_site(tmp_path_factory):
    """The tiny vessel site (32 px, ``"spatial_mode": "patch"`` in its datalist), a copy of its datalist
    whose test entries carry a field-of-view mask, and an untrained 4-level checkpoint."""
    root = tmp_path_factory.mktemp("vessel")
    datalist = generate_site_data("vessel", "site-1", root, profile="tiny")
    data = json.loads(datalist.read_text())
    (datalist.parent / "fov").mkdir()
    yy, xx = np.mgrid[:32, :32]
    disk = (((yy - 15.5) ** 2 + (xx - 15.5) ** 2) <= 13**2).astype(np.uint8) * 255
    for entry in data["test"]:
        entry["fov"] = "fov/" + Path(entry["image"]).name
        Image.fromarray(disk).save(datalist.parent / entry["fov"])
    fov_datalist = datalist.parent / "datalist_fov.json"
    fov_datalist.write_text(json.dumps(data))
    net = load_bundle(BUNDLE, TINY_NET).get_parsed_content("network_def", lazy=False)
    ckpt = root / "model.pt"
    torch.save(net.state_dict(), ckpt)
    return datalist, fov_datalist, ckpt


def _engine_scores(datalist, ckpt, overrides):
    from fedseg.engine import SegEngine

    engine = SegEngine("site-1", datalist, dict(overrides), device=torch.device("cpu"))
    model = engine.build_network()
    model.load_state_dict(torch.load(ckpt, weights_only=True))
    return engine, model


@pytest.mark.parametrize("mode", sorted(MODES))
def test_evaluate_checkpoint_matches_engine(tmp_path, vessel_site, mode):
    """evaluate.json (MONAI evaluator + handlers) and SegEngine.evaluate score the same predictions at
    each image's own size: same Dice, HD95 and ASSD."""
    datalist, _, ckpt = vessel_site
    overrides = MODES[mode]
    bundle_metrics = evaluate_checkpoint(ckpt, datalist, split="test", output_dir=tmp_path, overrides=overrides)
    engine, model = _engine_scores(datalist, ckpt, overrides)
    assert engine.spatial_mode == overrides["spatial_mode"]
    means = engine.evaluate(model, "test")
    assert bundle_metrics["mean_dice"] == pytest.approx(means["dice"], abs=1e-5)
    assert bundle_metrics["hausdorff95"] == pytest.approx(means["hd95"], abs=1e-4)
    assert bundle_metrics["surface_distance"] == pytest.approx(means["assd"], abs=1e-4)
    # per-image rows are written too, one per test image
    rows = (tmp_path / "mean_dice_raw.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + len(engine.data["test"])


def test_evaluate_checkpoint_with_fov_entries(tmp_path, vessel_site):
    """A datalist whose entries carry a ``fov`` loads through evaluate.json (the FOV is read at the
    image's size and ignored by its whole-image metrics), and scores as the engine's whole-image Dice."""
    _, fov_datalist, ckpt = vessel_site
    overrides = MODES["patch"]
    bundle_metrics = evaluate_checkpoint(ckpt, fov_datalist, split="test", output_dir=tmp_path, overrides=overrides)
    engine, model = _engine_scores(fov_datalist, ckpt, overrides)
    means = engine.evaluate(model, "test")
    assert "dice_fov" in means and means["dice_fov"] != means["dice"]
    assert bundle_metrics["mean_dice"] == pytest.approx(means["dice"], abs=1e-5)


@pytest.mark.parametrize("mode", ["patch", "patch_rescale", "resize"])
def test_inference_spatial_modes_write_input_size(tmp_path, vessel_site, mode):
    """inference.json follows spatial_mode: sizes that are not multiples of the window (and one smaller
    than it) come back at the input's size in every mode."""
    _, _, ckpt = vessel_site
    src = tmp_path / "new"
    src.mkdir()
    rng = np.random.default_rng(1)
    sizes = {"odd.png": (70, 53), "small.png": (12, 27)}  # (H, W); 12 < patch 16
    for name, (h, w) in sizes.items():
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(src / name)
    masks = run_inference(ckpt, tmp_path / "out", input_dir=src, overrides=MODES[mode])
    for mask, (name, (h, w)) in zip(masks, sorted(sizes.items())):
        img = Image.open(mask)
        assert mask.name == f"{Path(name).stem}_seg.png"
        assert img.size == (w, h), name
        assert set(np.unique(np.asarray(img)).tolist()) <= {0, 255}


def test_inference_patch_mode_equals_engine_prediction(tmp_path, vessel_site):
    """At native resolution (no rescale) the written masks are exactly the engine's whole-image
    sliding-window argmax: same window, overlap and blending from the same bundle variables."""
    datalist, _, ckpt = vessel_site
    overrides = {**MODES["patch"], "sw_overlap": 0.5, "sw_blend_mode": "constant"}
    masks = run_inference(ckpt, tmp_path / "out", datalist=datalist, split="test", overrides=overrides)
    engine, model = _engine_scores(datalist, ckpt, overrides)
    root = Path(datalist).parent
    entries = json.loads(Path(datalist).read_text())["test"]
    outputs = list(engine.iterate_logits(model, "test"))
    assert len(outputs) == len(masks) == len(entries)
    for mask, entry, (_, labels, logits, _) in zip(masks, entries, outputs):
        # MONAI's PIL reader gives (W, H) arrays: transpose to PIL's (H, W), checked on the label
        on_disk = np.asarray(Image.open(root / entry["label"])) > 0
        np.testing.assert_array_equal(labels[0, 0].numpy().T > 0, on_disk)
        pred = logits.argmax(1)[0].numpy().T.astype(bool)
        written = np.asarray(Image.open(mask)) > 0
        assert written.shape == pred.shape == on_disk.shape
        assert pred.any() and not pred.all()  # a mixed mask: orientation and blending both matter
        np.testing.assert_array_equal(written, pred)


def test_inference_checks_patch_size_in_patch_mode(tmp_path, vessel_site):
    """In patch mode the window, not image_size, must fit the U-Net's pooling levels."""
    _, _, ckpt = vessel_site
    (tmp_path / "new").mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "new" / "a.png")
    with pytest.raises(ValueError, match="patch_size 20 must be a multiple of 8"):
        run_inference(ckpt, tmp_path / "out", input_dir=tmp_path / "new", overrides={**MODES["patch"], "patch_size": 20})
    # image_size 20 is irrelevant in patch mode
    (mask,) = run_inference(ckpt, tmp_path / "out", input_dir=tmp_path / "new", overrides={**MODES["patch"], "image_size": 20})
    assert Image.open(mask).size == (32, 32)
    with pytest.raises(ValueError, match="image_size 20 must be a multiple of 8"):
        run_inference(ckpt, tmp_path / "out2", input_dir=tmp_path / "new", overrides={**TINY_NET, "image_size": 20})


def test_inference_reproduces_pathfl_feature_alignment(tmp_path, vessel_site):
    """A PathFL checkpoint carries its bottleneck alignment (global moments and the at-inference switch) as
    buffers: bundle inference with ``feature_alignment`` reproduces the engine's evaluation, and the
    alignment really changes the prediction."""
    datalist, _, _ = vessel_site
    overrides = {**MODES["patch"], "feature_alignment": True, "sw_overlap": 0.5, "sw_blend_mode": "constant"}
    net = load_bundle(BUNDLE, overrides).get_parsed_content("network_def", lazy=False)
    net.bottleneck_alignment.set_target(0.8, 3.0, at_inference=True)
    ckpt = tmp_path / "pathfl.pt"
    torch.save(net.state_dict(), ckpt)
    masks = run_inference(ckpt, tmp_path / "out", datalist=datalist, split="test", overrides=overrides)
    engine, model = _engine_scores(datalist, ckpt, overrides)
    assert float(model.bottleneck_alignment.active) == 1.0
    outputs = list(engine.iterate_logits(model, "test"))
    model.bottleneck_alignment.at_inference.fill_(0.0)
    unaligned = list(engine.iterate_logits(model, "test"))
    assert any(not torch.equal(a[2].argmax(1), b[2].argmax(1)) for a, b in zip(outputs, unaligned))
    for mask, (_, _, logits, _) in zip(masks, outputs):
        np.testing.assert_array_equal(np.asarray(Image.open(mask)) > 0, logits.argmax(1)[0].numpy().T.astype(bool))


@pytest.mark.parametrize("bundle", ["unet2d_seg", "unetr_seg", "vit_foundation"])
@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD"])
def test_bundle_optimizer_factory_takes_any_torch_optimizer(bundle, name):
    """Adam's betas go only to the Adam family: ``optimizer_name="SGD"`` must not fail on ``betas``."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(str(Path(__file__).resolve().parents[1] / "bundles" / bundle / "configs" / "train.json"))
    parser["optimizer_name"] = name
    optimizer = parser.get_parsed_content("optimizer_factory", instantiate=True)([torch.nn.Parameter(torch.zeros(2))])
    assert type(optimizer).__name__ == name
    assert ("betas" in optimizer.defaults) == (name != "SGD")
