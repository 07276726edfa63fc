"""Run the bundle's ``inference.json`` / ``evaluate.json`` on a checkpoint from Python.

Both configs are overlays on ``train.json`` (the MONAI pattern
``--config_file "['configs/train.json','configs/inference.json']"``), so the network, image size and
pre-processing always come from the one place the training and the federated jobs read them from.
The functions here go through MONAI's own :class:`~monai.bundle.ConfigWorkflow` — exactly what
``python -m monai.bundle run`` does — and add what a library caller needs on top: a checkpoint check
with a readable error, the list of written masks, and the metrics as a dict.

Checkpoints may be NVFlare's ``FL_global_model.pt`` (``{"model": state_dict, "train_conf": ...}``, plus
the job's ``"train_config"`` that ``FedSegController`` adds and inference uses as default overrides),
a dict with a ``"model"`` key written by MONAI's ``CheckpointSaver``, or a plain ``state_dict``
(what ``CheckpointSaver`` writes when it saves a single object). MONAI's ``CheckpointLoader`` in the
configs accepts all three; :func:`check_checkpoint` runs first so that a wrong architecture is
reported with the checkpoint's name and the mismatching tensors instead of a bare ``load_state_dict``
trace from inside the engine.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from .bundle import BUNDLE_KEYS
from .data.datalist import DatalistError, read_datalist_json

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGE_SUFFIXES",
    "CheckpointMismatchError",
    "find_images",
    "datalist_images",
    "load_state_dict",
    "checkpoint_train_config",
    "check_checkpoint",
    "run_inference",
    "evaluate_checkpoint",
]

#: file endings picked up from an input folder (matched case-insensitively)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".nii.gz")


class CheckpointMismatchError(ValueError):
    """A checkpoint's weights do not fit the network the bundle config builds; names the checkpoint."""


# ----------------------------------------------------------------------------------------------
# inputs (called from inference.json)
# ----------------------------------------------------------------------------------------------


def find_images(input_dir: str | os.PathLike, suffixes: Sequence[str] = IMAGE_SUFFIXES) -> List[str]:
    """Sorted image files directly inside ``input_dir`` whose name ends with one of ``suffixes``.

    Matching ignores case (scanners write ``.PNG``/``.TIF``); sub-folders are not searched because
    the masks are written flat into one output folder, named after the input file.

    Raises:
        FileNotFoundError: ``input_dir`` is not a folder.
        ValueError: no matching image in it.
    """
    folder = Path(input_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"input_dir {folder} is not a folder")
    ends = tuple(s.lower() for s in suffixes)
    files = sorted(str(p.absolute()) for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(ends))
    if not files:
        raise ValueError(f"no images ending with {list(suffixes)} in {folder}")
    return files


def datalist_images(datalist: str | os.PathLike, split: str = "test") -> List[str]:
    """Absolute image paths of ``split`` in a decathlon-style datalist; labels are not needed.

    ``datalist`` may be the JSON file or the folder holding ``datalist.json``. Relative paths are
    resolved against the datalist's folder, as :func:`fedseg.data.datalist.load_datalist` does.

    Raises:
        DatalistError: no datalist given, file missing, split missing/empty, entry without an
            image, or an image file that does not exist — each message names the datalist.
    """
    if not datalist:
        raise DatalistError("inference needs input_dir (a folder of images) or datalist (a datalist JSON file)")
    path, data = read_datalist_json(datalist)
    entries = data.get(split)
    if not isinstance(entries, list) or not entries:
        raise DatalistError(f"split '{split}' missing or empty in datalist {path}")
    files = []
    for i, entry in enumerate(entries):
        image = entry.get("image") if isinstance(entry, dict) else entry
        if not isinstance(image, str) or not image:
            raise DatalistError(f"{split}[{i}] in {path} has no 'image' path")
        full = os.path.normpath(os.path.join(str(path.parent.absolute()), image))
        if not os.path.isfile(full):
            raise DatalistError(f"image file not found: {full} ({split}[{i}] of {path})")
        files.append(full)
    return files


def mask_dtype(num_classes: int, label_values: Optional[Mapping[str, int]] = None, class_indices: bool = False):
    """The numpy dtype written masks are saved in: uint8 when every value written (class indices, or the stored
    values of ``label_values``; 0 / 255 for a binary space) is an integer in 0..255, uint16 up to 65535, else float32."""
    import numpy as np

    from .data.labels import BINARY, LabelSpace, parse_label_values

    if class_indices:
        values = np.arange(int(num_classes))
    else:
        names = BINARY.names if int(num_classes) == 2 else ("background",) + tuple(f"class{i}" for i in range(1, int(num_classes)))
        space = LabelSpace(names=names, values=parse_label_values(label_values, "label_values") if label_values else None)
        values = space.output_values()
    integral = bool(np.all(np.mod(values, 1) == 0)) and values.min() >= 0
    if integral and values.max() <= 255:
        return np.uint8
    if integral and values.max() <= 65535:
        return np.uint16
    return np.float32


# ----------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------


def load_state_dict(checkpoint: str | os.PathLike) -> Dict[str, torch.Tensor]:
    """The network weights in ``checkpoint``: its ``"model"`` entry, or the file itself if it is a state_dict.

    Raises:
        FileNotFoundError: the file does not exist.
        CheckpointMismatchError: the file holds neither form.
    """
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    # weights_only: a checkpoint from another site is untrusted input; tensors and plain dicts suffice
    ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(ckpt, Mapping) and isinstance(ckpt.get("model"), Mapping):
        ckpt = ckpt["model"]
    if not isinstance(ckpt, Mapping) or not ckpt or not all(torch.is_tensor(v) for v in ckpt.values()):
        found = list(ckpt)[:8] if isinstance(ckpt, Mapping) else type(ckpt).__name__
        raise CheckpointMismatchError(
            f"checkpoint {path} holds no model weights: expected a state_dict or a dict with a 'model' "
            f"state_dict, found {found}"
        )
    return dict(ckpt)


def checkpoint_job(checkpoint: str | os.PathLike) -> Dict[str, Any]:
    """The whole ``train_config`` a fedseg checkpoint carries (``FedSegController`` stores it next to ``"model"``),
    else ``{}``: a missing file, plain weights."""
    path = Path(checkpoint)
    if not path.is_file():
        return {}
    ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    cfg = ckpt.get("train_config") if isinstance(ckpt, Mapping) else None
    return dict(cfg) if isinstance(cfg, Mapping) else {}


def checkpoint_train_config(checkpoint: str | os.PathLike) -> Dict[str, Any]:
    """The bundle variables of the ``train_config`` a fedseg checkpoint carries, else ``{}``.

    ``FedSegController`` stores the job's ``train_config`` next to ``"model"`` in ``FL_global_model.pt``
    and in every personalised checkpoint. Only keys of :data:`fedseg.bundle.BUNDLE_KEYS` are kept (the
    rest, e.g. ``local_epochs``, are not bundle variables), so new bundle variables are picked up as
    soon as they are listed there.
    """
    return {k: v for k, v in checkpoint_job(checkpoint).items() if k in BUNDLE_KEYS and v is not None}


def _merged_overrides(checkpoint: Path, overrides: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The checkpoint's training bundle variables, with explicit ``overrides`` winning."""
    base = checkpoint_train_config(checkpoint)
    if base:
        logger.info("using the training configuration stored in %s: %s", checkpoint, sorted(base))
        if "spatial_mode" not in base and "spatial_mode" not in (overrides or {}):
            # the job left the mode to each site's datalist: the checkpoint cannot say which it was
            logger.warning(
                "%s does not record the spatial mode (the sites' datalists chose it); running in the bundle's "
                "default (resize). For a native-resolution model pass overrides {'spatial_mode': 'patch'} "
                "(and 'rescale' where its data set was rescaled)", checkpoint,
            )
    return {**base, **dict(overrides or {})}


def check_checkpoint(checkpoint: str | os.PathLike, network: torch.nn.Module) -> None:
    """Raise :class:`CheckpointMismatchError` naming ``checkpoint`` if its weights do not fit ``network``.

    Reports missing and unexpected parameter names and shape differences (for example a checkpoint
    trained with other ``channels`` or ``in_channels`` than the bundle variables in use).
    """
    state = load_state_dict(checkpoint)
    expected = network.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs network {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if not (missing or unexpected or shapes):
        return
    parts = []
    if shapes:
        parts.append(f"{len(shapes)} shape mismatch(es), e.g. {'; '.join(shapes[:3])}")
    if missing:
        parts.append(f"{len(missing)} missing key(s), e.g. {missing[:3]}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s), e.g. {unexpected[:3]}")
    arch = {k: getattr(network, k) for k in ("in_channels", "out_channels", "channels") if hasattr(network, k)}
    raise CheckpointMismatchError(
        f"checkpoint {checkpoint} does not match the bundle network {type(network).__name__}({arch}): "
        + "; ".join(parts)
        + ". Pass the overrides (channels, in_channels, num_classes, ...) the model was trained with."
    )


# ----------------------------------------------------------------------------------------------
# workflows
# ----------------------------------------------------------------------------------------------


def _workflow(
    config: str,
    bundle_dir: Optional[os.PathLike],
    settings: Dict[str, Any],
    overrides: Optional[Mapping[str, Any]],
):
    """``ConfigWorkflow`` over ``train.json`` + ``config`` with ``overrides`` then ``settings`` applied.

    ``overrides`` may name the bundle variables of :data:`fedseg.bundle.BUNDLE_KEYS` or any other id
    the merged config defines (``"max_epochs"``, ``"network_def#norm"``, ...). Other keys are skipped
    with a warning instead of failing, so a federated job's whole ``train_config`` (which also holds
    ``local_epochs``, ``num_rounds``, ...) can be passed as it is, the way :func:`fedseg.bundle.load_bundle`
    takes it; the warning still shows a mistyped name.
    """
    from monai.bundle import ConfigWorkflow

    if bundle_dir:
        root = Path(bundle_dir)
    else:  # the bundle of the job that made the checkpoint: volume_seg for volumes, else unet2d_seg
        from .bundle import bundle_for_task

        root = bundle_for_task({k: v for k, v in (overrides or {}).items() if k in ("spatial_dims", "task")})
    configs = [str(root / "configs" / "train.json"), str(root / "configs" / config)]
    workflow = ConfigWorkflow(
        config_file=configs,
        meta_file=str(root / "configs" / "metadata.json"),
        logging_file=False,
        workflow_type=None,
    )
    parser = workflow.parser
    parser["bundle_root"] = str(root)
    skipped = []
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in BUNDLE_KEYS and key not in parser:
            skipped.append(key)
            continue
        parser[key] = list(value) if isinstance(value, tuple) else value
    if skipped:
        names = [Path(c).name for c in configs]
        logger.warning("overrides %s are not variables of %s; ignored", sorted(skipped), names)
    # the function's explicit arguments (checkpoint, folders, split) win over a same-named override
    for key, value in settings.items():
        parser[key] = value
    return workflow


def _check_ckpt_against(workflow, checkpoint: Path) -> None:
    """Build a throw-away copy of ``network_def`` and compare it with the checkpoint's weights."""
    from .engine.spatial import check_patch_size

    parser = workflow.parser
    network = parser.get_parsed_content("network_def", lazy=False)
    check_checkpoint(checkpoint, network)
    if not hasattr(network, "channels"):
        return  # not a U-Net (e.g. a 1x1-conv test network): no pooling levels to divide by
    # the grid the network sees: the resized image (resize mode) or the sliding window (patch mode; 3-D patches or
    # one-slice windows for volumes)
    mode = parser.get_parsed_content("spatial_mode")
    if "target_spacing" in parser:  # a volume bundle
        if mode not in ("patch", "slices"):
            raise ValueError(f"spatial_mode {mode!r}: volumes take 'patch' (3-D) or 'slices'")
        check_patch_size({"spatial_mode": mode, "spatial_dims": 3, "patch_size": parser.get_parsed_content("patch_size"),
                          "slice_axis": parser.get_parsed_content("slice_axis")}, len(network.channels))
        return
    if mode not in ("resize", "patch"):
        raise ValueError(f"spatial_mode {mode!r}: expected 'resize' or 'patch'")
    sizes = {k: parser.get_parsed_content(k) for k in ("image_size", "patch_size")}
    check_patch_size({"spatial_mode": mode, **sizes}, len(network.channels))


def run_inference(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike,
    input_dir: Optional[str | os.PathLike] = None,
    datalist: Optional[str | os.PathLike] = None,
    split: str = "test",
    bundle_dir: Optional[os.PathLike] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    label_values: Optional[Mapping[str, int]] = None,
    class_indices: bool = False,
    largest_component: bool = False,
    stitch_device: Optional[str] = None,
) -> List[Path]:
    """Segment new images with ``checkpoint`` through the bundle's ``inference.json``.

    Args:
        checkpoint: NVFlare ``FL_global_model.pt``, a ``{"model": state_dict}`` file or a plain state_dict.
        output_dir: folder for the masks (created); one ``<input name>_seg.png`` per image, single
            channel, the input's size and orientation, in the stored encoding (below).
        input_dir: folder of images (png/jpg/jpeg/tif/tiff/nii.gz); takes precedence over ``datalist``.
        datalist: decathlon-style datalist whose ``split`` entries' ``image`` files are segmented.
        split: datalist split to use.
        bundle_dir: bundle folder; default: the bundle of the job that made the checkpoint (``volume_seg`` when its
            ``train_config`` has ``spatial_dims`` 3, else ``unet2d_seg``; :func:`fedseg.bundle.bundle_for_task`).
        overrides: bundle variables the model was trained with (``channels``, ``image_size``, ...;
            for a native-resolution model ``spatial_mode="patch"``, ``patch_size``, ``rescale`` and
            optionally ``sw_overlap`` / ``sw_blend_mode`` / ``sw_batch_size`` of the sliding window)
            or other config ids. Masks have the input's size in both spatial modes. Defaults come from
            the ``train_config`` stored in the checkpoint (:func:`checkpoint_train_config`); explicit
            overrides win.
        label_values: the stored mask encoding to write (``{"255": 0, "128": 1, "0": 2}``: the first value listed
            for a class is written). Default: the ``datalist``'s own ``label_values`` when segmenting a datalist,
            else the encoding the checkpoint's job recorded (every site shared it), else class indices — and
            0 / 255 for a binary model, as always.
        class_indices: write class indices ``0..C-1`` instead of any stored encoding.
        largest_component: keep only each class's largest connected component in every mask, on the input's own
            grid (``fedseg.metrics.segmentation.keep_largest_component``'s rule; MONAI's
            ``KeepLargestConnectedComponentd``).
        stitch_device: where the sliding window's output is assembled (``"cpu"``), while the windows run on the
            network's device: a whole scan's class scores ``(1, C, X, Y, Z)`` then take host memory instead of GPU
            memory, and only ``sw_batch_size`` windows are on the GPU at a time (MONAI ``SlidingWindowInferer``'s
            ``device``). ``None``: the input's device (the default). Patch mode only; the masks are the same.

    Returns:
        The written mask paths, in input order.

    Raises:
        CheckpointMismatchError: the checkpoint does not fit the configured network.
        ValueError: two inputs would be written to the same mask file (same name, other suffix/folder).
    """
    if not input_dir and not datalist:
        raise ValueError("run_inference needs input_dir (a folder of images) or datalist (a datalist JSON file)")
    checkpoint = Path(checkpoint).absolute()
    out = Path(output_dir).absolute()
    settings = _inference_settings(checkpoint, out, input_dir, datalist, split, label_values, class_indices,
                                   largest_component, stitch_device)
    workflow = _workflow("inference.json", bundle_dir, settings, _merged_overrides(checkpoint, overrides))
    _check_ckpt_against(workflow, checkpoint)
    targets = _mask_paths(workflow.parser, out)
    out.mkdir(parents=True, exist_ok=True)

    workflow.initialize()
    workflow.run()
    workflow.finalize()
    missing = [str(t) for t in targets if not t.is_file()]
    if missing:
        raise RuntimeError(f"inference finished but these masks were not written: {missing[:5]}")
    return targets


def _inference_settings(
    checkpoint: Path,
    out: Path,
    input_dir: Optional[str | os.PathLike],
    datalist: Optional[str | os.PathLike],
    split: str,
    label_values: Optional[Mapping[str, int]],
    class_indices: bool,
    largest_component: bool,
    stitch_device: Optional[str],
) -> Dict[str, Any]:
    """The ``inference.json`` ids :func:`run_inference`'s own arguments set (absolute paths; they win over any
    override). Without ``label_values``, a datalist's own encoding is taken when its images are segmented."""
    settings = {
        "ckpt_path": str(checkpoint),
        "output_dir": str(out),
        "input_dir": str(Path(input_dir).absolute()) if input_dir else "",
        "datalist": str(Path(datalist).absolute()) if datalist else "",
        "split": split,
        "output_class_indices": bool(class_indices),
        "largest_component": bool(largest_component),
    }
    if stitch_device is not None:
        settings["sw_stitch_device"] = str(torch.device(stitch_device))
    if label_values is None and datalist and not input_dir:
        # masks go back to the site in the datalist's own encoding, so its tools read them
        label_values = read_datalist_json(datalist)[1].get("label_values")
    if label_values is not None:
        settings["label_values"] = dict(label_values)
    return settings


def _mask_paths(parser, out: Path) -> List[Path]:
    """The mask file each of the inference config's ``input_files`` will be written to under ``out``, in input order.

    Raises:
        ValueError: two inputs would be written to the same mask file; or an input file is bad (the error MONAI
            wrapped while evaluating ``input_files``).
    """
    from monai.data.folder_layout import FolderLayout

    try:
        inputs = parser.get_parsed_content("input_files")
    except RuntimeError as exc:
        # MONAI wraps errors raised inside a "$" expression; surface the one that names the bad input
        if isinstance(exc.__cause__, (OSError, ValueError)):
            raise exc.__cause__ from None
        raise
    # the same naming SaveImaged applies (flat folder, "<stem>_<postfix><ext>"), computed up front so a
    # clash is refused before anything is written rather than one mask silently overwriting another
    layout = FolderLayout(
        str(out),
        postfix=parser.get_parsed_content("output_postfix"),
        extension=parser.get_parsed_content("output_ext"),
        parent=False,
        makedirs=False,
    )
    targets = [Path(layout.filename(subject=f)) for f in inputs]
    seen: Dict[Path, str] = {}
    for src, dst in zip(inputs, targets):
        if dst in seen:
            raise ValueError(f"{seen[dst]} and {src} would both be written to {dst}; rename one of them")
        seen[dst] = src
    return targets


def evaluate_checkpoint(
    checkpoint: str | os.PathLike,
    datalist: str | os.PathLike | Sequence[str | os.PathLike],
    split: str = "test",
    output_dir: Optional[str | os.PathLike] = None,
    bundle_dir: Optional[os.PathLike] = None,
    overrides: Optional[Mapping[str, Any]] = None,
) -> Dict[str, float]:
    """Score ``checkpoint`` on a datalist split through the bundle's ``evaluate.json``.

    Args:
        checkpoint: any of the checkpoint forms :func:`run_inference` accepts.
        datalist: one datalist (file or folder) or several, whose ``split`` entries are pooled.
        split: ``"test"``, ``"validation"`` or ``"training"``.
        output_dir: where ``MetricsSaver`` writes its CSV reports (per-image and summary); a temporary
            folder that is removed afterwards when not given.
        bundle_dir: bundle folder; default: the bundle of the job that made the checkpoint (``volume_seg`` when its
            ``train_config`` has ``spatial_dims`` 3, else ``unet2d_seg``; :func:`fedseg.bundle.bundle_for_task`).
        overrides: bundle variables the model was trained with, or other config ids; defaults
            from the checkpoint's stored ``train_config`` (explicit overrides win).

    Returns:
        ``{"mean_dice": ..., "hausdorff95": ..., "surface_distance": ...}`` — foreground-class means
        over the split, each image scored at its own size against its mask on disk in either spatial
        mode (the same values as :meth:`fedseg.engine.SegEngine.evaluate`'s ``dice``/``hd95``/``assd``
        when no mask is empty); distances are in pixels of the original image and NaN when every image
        has an empty prediction or label.
    """
    checkpoint = Path(checkpoint).absolute()
    lists = [datalist] if isinstance(datalist, (str, os.PathLike)) else list(datalist)
    with tempfile.TemporaryDirectory(prefix="fedseg_eval_") as tmp:
        settings = {
            "ckpt_path": str(checkpoint),
            "output_dir": str(Path(output_dir).absolute()) if output_dir else tmp,
            "eval_datalists": [str(Path(d).absolute()) for d in lists],
            "split": split,
        }
        workflow = _workflow("evaluate.json", bundle_dir, settings, _merged_overrides(checkpoint, overrides))
        _check_ckpt_against(workflow, checkpoint)
        workflow.initialize()
        workflow.run()
        evaluator = workflow.parser.get_parsed_content("validate#evaluator")
        metrics = {k: float(v) for k, v in evaluator.state.metrics.items()}
        workflow.finalize()
    return metrics


def run_bundle_inference(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike,
    bundle_dir: Optional[str | os.PathLike] = None,
    input_dir: Optional[str | os.PathLike] = None,
    overrides: Optional[Mapping[str, Any]] = None,
) -> List[Path]:
    """Segment new images with a federated checkpoint of a user's bundle through that bundle's own
    ``configs/inference.json``, run by MONAI's ``ConfigWorkflow`` (infer type): its preprocessing, inferer,
    postprocessing and writers.

    Args:
        checkpoint: the run's ``FL_global_model.pt`` (``{"model": state_dict, "train_config": ...}``).
        output_dir: set as the bundle's ``output_dir``.
        bundle_dir: the bundle folder; default the one the checkpoint's job trained (``train_config["bundle"]``).
        input_dir: the images to segment, set as the bundle's ``dataset_dir`` (MONAI's required infer property).
        overrides: more ``{config id: value}`` of the inference config. The job's ``bundle_overrides`` (the network's
            ids a run set with ``--set``) apply first where the inference config has those ids.

    Returns:
        The files the bundle wrote under ``output_dir``.

    Raises:
        fedseg.bundle.BundleError: no inference config, a missing MONAI infer property, no ``ckpt_path`` id, an
            override naming an id the config does not have.
    """
    from fedseg.bundle import BundleError, read_bundle

    job = checkpoint_job(checkpoint)
    root = Path(bundle_dir or job.get("bundle") or "")
    if not str(root) or not root.is_dir():
        raise BundleError(f"name the bundle folder with --bundle (the checkpoint {checkpoint} records none that exists here)")
    workflow = read_bundle(root, overrides, config="inference", initialize=False)
    if "ckpt_path" not in workflow.parser:
        raise BundleError(f"bundle {root}'s inference config has no ckpt_path id to load the federated checkpoint from")
    # the network ids the run set with --set, where the inference config has them
    network_ids = {k: v for k, v in (job.get("bundle_overrides") or {}).items() if k in workflow.parser}
    if "network_def" in workflow.parser and any(k.startswith("bottleneck_alignment.") for k in load_state_dict(checkpoint)):
        # PathFL's AFA on the user's network: the bundle's network with the same alignment layer (and its hook), so
        # that the checkpoint loads as it is and the alignment acts as it did in evaluation (fedseg.networks.feature_taps)
        from fedseg.bundle import network_from_workflow

        workflow.parser.update(pairs=network_ids)
        workflow.parser["network_def"] = network_from_workflow(workflow, {**job, "feature_alignment": True})
    pairs = {**network_ids, "ckpt_path": str(Path(checkpoint).resolve()), **(overrides or {})}
    if "output_dir" in workflow.parser:
        pairs["output_dir"] = str(Path(output_dir).resolve())
    if input_dir is not None:
        pairs["dataset_dir"] = str(Path(input_dir).resolve())
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    before = set(Path(output_dir).rglob("*"))
    workflow.parser.update(pairs=pairs)
    workflow.initialize()
    workflow.run()
    workflow.finalize()
    return sorted(p for p in set(Path(output_dir).rglob("*")) - before if p.is_file())
