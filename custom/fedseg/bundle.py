"""Locate and parse the MONAI bundle that defines the network, transforms, loss and optimiser.

The bundle (``bundles/unet2d_seg``) is the single source of these components: the federated engine,
the bundle's own ``train.json`` / ``evaluate.json`` / ``inference.json`` and the CLI all parse it.
Classification jobs (``train_config["task"] == "classification"``, FedEFM phase 1) use
``bundles/vit_foundation`` instead (:func:`bundle_for_task`); the downstream UNETR is ``bundles/unetr_seg``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

from monai.bundle import ConfigParser

DEFAULT_BUNDLE = "unet2d_seg"
#: the bundle of each task when none is named
TASK_BUNDLES = {"segmentation": DEFAULT_BUNDLE, "classification": "vit_foundation"}
#: the segmentation bundle of volume jobs (spatial_dims 3: 3-D patches or slices)
VOLUME_BUNDLE = "volume_seg"
BUNDLE_ENV = "FEDSEG_BUNDLE_DIR"


def default_bundle_dir(name: str = DEFAULT_BUNDLE) -> Path:
    """``$FEDSEG_BUNDLE_DIR`` if set (it names the segmentation bundle, ``unet2d_seg``'s replacement), else
    ``bundles/<name>`` of the source checkout this package runs from."""
    if name == DEFAULT_BUNDLE and os.environ.get(BUNDLE_ENV):
        return Path(os.environ[BUNDLE_ENV])
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "bundles" / name
        if (candidate / "configs" / "train.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"MONAI bundle {name!r} not found next to {here}; set {BUNDLE_ENV} to the bundle folder"
    )


# train_config keys that map onto bundle variables (job config -> bundle)
BUNDLE_KEYS = (
    "image_size",
    "in_channels",
    "num_classes",
    "labels",
    "regions",
    "label_values",
    "channels",
    "network_variant",
    "network_init",
    "dropout",
    "norm",
    "feature_alignment",
    "seg_loss",
    "lambda_dice",
    "lambda_ce",
    "optimizer_name",
    "learning_rate",
    "weight_decay",
    "adam_betas",
    "batch_size",
    "augment",
    "augment_level",
    "intensity",
    "seed",
    # native resolution (patch mode) and sliding-window inference
    "spatial_mode",
    "patch_size",
    "patch_samples",
    "patch_pos",
    "patch_neg",
    "patch_sampler",
    "patch_ratios",
    "rescale",
    "sw_batch_size",
    "sw_overlap",
    "sw_blend_mode",
    # volumes (bundles/volume_seg)
    "spatial_dims",
    "slice_axis",
    "target_spacing",
    "orientation",
    "modality",
    "intensity_window",
    "image_channels",
    "volume_network",
    # classification ViT (bundles/vit_foundation)
    "vit_profile",
    "vit_image_size",
    # downstream UNETR (bundles/unetr_seg)
    "foundation_ckpt",
    "partial_depth",
)


def bundle_for_task(train_config: Optional[Dict[str, Any]] = None) -> Path:
    """``train_config["bundle"]`` if named, else the default bundle folder of ``train_config["task"]``
    (segmentation when unset): ``unet2d_seg`` for images, ``volume_seg`` for volumes (``spatial_dims`` 3)."""
    if is_bundle_path((train_config or {}).get("bundle")):
        return Path(train_config["bundle"])
    if (train_config or {}).get("bundle"):
        return default_bundle_dir(train_config["bundle"])
    task = (train_config or {}).get("task") or "segmentation"
    if task not in TASK_BUNDLES:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASK_BUNDLES)}")
    if task == "segmentation" and int((train_config or {}).get("spatial_dims") or 2) == 3:
        return default_bundle_dir(VOLUME_BUNDLE)
    return default_bundle_dir(TASK_BUNDLES[task])


def build_network(train_config: Optional[Dict[str, Any]] = None, bundle_dir: Optional[os.PathLike] = None):
    """A fresh instance of the bundle's ``network_def`` with the job's overrides (on the CPU). Without
    ``bundle_dir`` the task's bundle (:func:`bundle_for_task`): the ViT classifier for classification; a user's bundle
    folder (``train_config["bundle"]`` a path) through MONAI's ``ConfigWorkflow`` (:func:`build_bundle_network`)."""
    if bundle_dir is None and is_bundle_path((train_config or {}).get("bundle")):
        return build_bundle_network(train_config)
    return load_bundle(bundle_dir or bundle_for_task(train_config), train_config).get_parsed_content("network_def", instantiate=True, lazy=False)


def load_bundle(
    bundle_dir: Optional[os.PathLike] = None, overrides: Optional[Dict[str, Any]] = None, config: str = "train.json"
) -> ConfigParser:
    """Parse ``<bundle>/configs/<config>`` with ``overrides`` applied to top-level bundle variables."""
    root = Path(bundle_dir) if bundle_dir else default_bundle_dir()
    parser = ConfigParser()
    parser.read_config(str(root / "configs" / config))
    parser["bundle_root"] = str(root)
    for key, value in (overrides or {}).items():
        if key in BUNDLE_KEYS and value is not None:
            parser[key] = list(value) if isinstance(value, tuple) else value
    return parser


# ------------------------------------------------------------------------------------------------ any MONAI bundle
class BundleError(ValueError):
    """A user's bundle that cannot run as asked; one line naming the bundle and what is wrong."""


#: ids a run points into the site's workspace when the bundle has them, and the subfolder each gets there: the bundle's
#: own writers (``CheckpointSaver``'s ``ckpt_dir``, TensorBoard's and evaluators' ``output_dir``, a ``log_dir``) never
#: write into the user's bundle folder
WRITER_IDS = {"ckpt_dir": "models", "output_dir": "eval", "log_dir": "logs"}


#: the suite's own bundles, named without a path (``train_config["bundle"]``)
SUITE_BUNDLES = ("unet2d_seg", "volume_seg", "unetr_seg", "vit_foundation")


def is_bundle_path(value: Any) -> bool:
    """``train_config["bundle"]`` names a bundle folder (any MONAI bundle, read through MONAI's ``ConfigWorkflow``)
    rather than one of the suite's bundles by name: a path with a separator, or a folder here with ``configs/`` whose
    name is not one of :data:`SUITE_BUNDLES`."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    text = str(value)
    if any(sep in text for sep in ("/", os.sep)):
        return True
    return text not in SUITE_BUNDLES and (Path(text) / "configs").is_dir()


def bundle_config_file(bundle_dir: os.PathLike, name: str = "train") -> Path:
    """``<bundle>/configs/<name>.json`` (or ``.yaml`` / ``.yml``, as MONAI's model zoo writes some bundles).

    Raises:
        BundleError: the folder or the config does not exist.
    """
    root = Path(bundle_dir)
    if not (root / "configs").is_dir():
        raise BundleError(f"{root} is not a MONAI bundle: it has no configs/ folder")
    for suffix in (".json", ".yaml", ".yml"):
        if (root / "configs" / f"{name}{suffix}").is_file():
            return root / "configs" / f"{name}{suffix}"
    raise BundleError(f"bundle {root} has no configs/{name}.json")


def missing_properties(workflow, workflow_type: str = "train") -> list:
    """MONAI's required properties (``monai.bundle.properties``) whose config ids ``workflow``'s parser lacks, as
    ``"name (id)"``. MONAI's own ``check_properties`` instantiates every property (whole training sets among them);
    this looks the same ids up without building anything."""
    from monai.bundle.properties import InferProperties, TrainProperties
    from monai.bundle.utils import ID_SEP_KEY

    table = TrainProperties if workflow_type == "train" else InferProperties
    missing = []
    for name, prop in table.items():
        config_id = str(prop.get("id", name)).replace("::", ID_SEP_KEY)
        if prop.get("required") and config_id not in workflow.parser:
            missing.append(f"{name} ({config_id.replace(ID_SEP_KEY, '#')})")
    return missing


def read_bundle(
    bundle_dir: os.PathLike,
    overrides: Optional[Dict[str, Any]] = None,
    writers_dir: Optional[os.PathLike] = None,
    where: str = "",
    config: str = "train",
    initialize: bool = True,
):
    """A user's MONAI bundle as MONAI's ``ConfigWorkflow`` (``configs/train.json``: train type; any other ``config``,
    e.g. ``"inference"``: infer type), with ``overrides`` ``{config id: value}`` applied (ids with ``#``, e.g.
    ``train#dataloader#batch_size``) and its writers pointed into ``writers_dir`` (:data:`WRITER_IDS`); initialised
    unless ``initialize`` is False (a caller that sets more ids first). The bundle folder goes on ``sys.path`` (a
    bundle's ``scripts`` package), as ``monai.bundle run`` does. Nothing is instantiated here.

    Raises:
        BundleError: no such bundle, an override naming an id the bundle does not have, or one of MONAI's required
            properties of the workflow type missing (named with MONAI's property name and id).
    """
    import sys

    from monai.bundle import ConfigWorkflow

    root = Path(bundle_dir).resolve()
    config_file = bundle_config_file(root, config)
    meta = next((p for p in (root / "configs" / f"metadata{s}" for s in (".json", ".yaml")) if p.is_file()), None)
    if str(root) not in sys.path:
        sys.path.insert(1, str(root))
    workflow_type = "train" if config == "train" else "infer"
    workflow = ConfigWorkflow(config_file=str(config_file), meta_file=None if meta is None else str(meta), logging_file=False,
                              workflow_type=workflow_type)
    prefix = f"{where}: " if where else ""
    unknown = sorted(k for k in (overrides or {}) if k not in workflow.parser)
    if unknown:
        raise BundleError(f"{prefix}bundle {root} has no config id {', '.join(map(repr, unknown))} (an override names it)")
    missing = missing_properties(workflow, workflow_type)
    if missing:
        raise BundleError(f"{prefix}bundle {root} lacks MONAI's required {workflow_type} properties: {', '.join(missing)}")
    pairs = {"bundle_root": str(root), **(overrides or {})}
    if writers_dir is not None:
        for key, folder in WRITER_IDS.items():
            if key in workflow.parser:
                pairs[key] = str(Path(writers_dir) / folder)
    workflow.parser.update(pairs=pairs)
    if initialize:
        workflow.initialize()
    return workflow


def build_bundle_network(train_config: Dict[str, Any], bundle_dir: Optional[os.PathLike] = None):
    """The network of a user's bundle (``network_def`` with the job's ``bundle_overrides``, on the CPU), tagged with the
    job's ``feature_layer`` / ``head_layer`` and, with ``feature_alignment`` (PathFL's AFA), its alignment layer
    (``fedseg.networks.feature_taps``). What the server's initial model and every site build alike."""
    workflow = read_bundle(bundle_dir or train_config["bundle"], train_config.get("bundle_overrides"))
    return network_from_workflow(workflow, train_config)


def network_from_workflow(workflow, train_config: Dict[str, Any]):
    """A fresh ``network_def`` of an initialised bundle workflow, tagged as :func:`build_bundle_network` says."""
    from fedseg.networks.feature_taps import attach_feature_alignment, tag_network

    if "seed" in train_config:  # every participant builds the same initial weights
        import torch

        torch.manual_seed(int(train_config["seed"]))
    network = workflow.parser.get_parsed_content("network_def", instantiate=True, lazy=False)
    tag_network(network, train_config.get("feature_layer"), train_config.get("head_layer"))
    if train_config.get("feature_alignment"):
        attach_feature_alignment(network)
    return network


def split_bundle_sets(workflow, sets: Dict[str, Any]) -> tuple:
    """``--set`` items of a run on a user's bundle (``workflow``: :func:`read_bundle`'s) -> ``(bundle_overrides,
    train_overrides)``: a key the bundle has (a config id, ``#`` paths included) overrides the bundle at every site;
    otherwise a ``train_config`` key.

    Raises:
        BundleError: a key that is neither.
    """
    from fedseg.config import BASE_TRAIN_CONFIG

    parser = workflow.parser
    bundle, train = {}, {}
    for key, value in sets.items():
        if key in parser:
            bundle[key] = value
        elif key in BASE_TRAIN_CONFIG:
            train[key] = value
        else:
            raise BundleError(f"--set {key}: neither a config id of the bundle {parser['bundle_root']} nor a train_config key")
    return bundle, train


def check_site_overrides(bundle_dir: os.PathLike, site_overrides: Dict[str, Dict[str, Any]],
                         overrides: Optional[Dict[str, Any]] = None) -> Dict[str, int]:
    """Every site's overrides name ids the bundle has, and give it training images: ``{site: training items}`` (the
    bundle's ``train#dataset#data`` evaluated with the site's values: a glob over its ``dataset_dir``, say).

    Raises:
        BundleError: an unknown id (naming the site), a required MONAI property missing, or a site without images.
    """
    counts = {}
    for site, values in site_overrides.items():
        if not isinstance(values, dict):
            raise BundleError(f"site overrides of {site!r}: expected a JSON object {{config id: value}}")
        workflow = read_bundle(bundle_dir, {**(overrides or {}), **values}, where=site)
        if "train#dataset#data" not in workflow.parser:
            continue  # the data list is built inside the dataset: the site's engine checks it
        data = workflow.parser.get_parsed_content("train#dataset#data")
        if not len(data):
            raise BundleError(f"{site}: no training images under dataset_dir {workflow.parser.get('dataset_dir', '(unset)')!r}")
        counts[site] = len(data)
    return counts


def bundle_network_fields(train_config: Dict[str, Any], network=None) -> Dict[str, Any]:
    """What the server must know of a user's network: ``spatial_dims``, ``in_channels`` and ``num_classes`` (from
    its first and last convolution), so that declared arrays (PathFL's noise) and 3-D refusals are checked."""
    import torch.nn as nn

    network = network if network is not None else build_bundle_network(train_config)
    convs = [m for m in network.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d))]
    if not convs:
        return {}
    first = convs[0]
    from fedseg.networks.feature_taps import head_layer_name

    head = dict(network.named_modules())[head_layer_name(network)]
    fields = {"spatial_dims": 3 if isinstance(first, (nn.Conv3d, nn.ConvTranspose3d)) else 2, "in_channels": int(first.in_channels)}
    channels = getattr(head, "out_channels", None) or getattr(head, "out_features", None)
    if channels:
        fields["num_classes"] = int(channels)
    return fields


def refuse_user_bundle(train_config: Dict[str, Any], reason: str) -> None:
    """A method that cannot run on a user's bundle says why, in one line.

    Raises:
        BundleError: ``train_config["bundle"]`` is a user's bundle folder.
    """
    if is_bundle_path(train_config.get("bundle")):
        raise BundleError(f"not on a user's bundle: {reason}")


def read_site_overrides(path: Optional[os.PathLike], site: str) -> Dict[str, Any]:
    """This site's ``{config id: value}`` from a ``{site: {config id: value}}`` JSON file (``{}`` without a file).

    Raises:
        ValueError: the file is not such an object, or has no entry for ``site`` (a federation that names a file
            gives every site its values: a site left out would train on the bundle's defaults).
    """
    if not path:
        return {}
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path} must hold a JSON object {{site: {{config id: value}}}}")
    if site not in data:
        raise ValueError(f"{path} has no entry for site {site!r} (it lists {sorted(data)})")
    return dict(data[site])
