"""Training profiles: CPU-friendly defaults, a tiny profile for tests, and per-method ``paper`` profiles.

A profile is a pair (num_rounds, train_config). ``train_config`` travels to every site in the task
meta and is written verbatim into ``report.json['config']``; bundle variables among its keys
(image_size, channels, learning_rate, ...) override the MONAI bundle's defaults.

The options are declared once, grouped in frozen dataclasses (``DataSettings``, ``NetworkSettings``,
``TrainingSettings``, ...; together :class:`TrainConfig`), each field with its type, default and one-line meaning.
``BASE_TRAIN_CONFIG``, the plain dict jobs and records carry, is derived from them; a site engine builds the typed
config once (:func:`site_train_config`) and reads attributes instead of ``train_config.get("key", default)``.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple


def setting(default: Any, doc: str) -> Any:
    """A field of a train_config group: its ``default`` (a list default is copied for every instance) and its one-line
    meaning ``doc``."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class DataSettings:
    """Where a site's data comes from when it has no datalist configured, and the task."""

    data_family: str = setting("polyp", "built-in synthetic family of a site without a datalist (fedseg.data.synthetic)")
    data_profile: str = setting("default", "size profile of the built-in data (image size and count)")
    data_seed: int = setting(0, "seed of the built-in data generators")
    data_unseen: float = setting(1.0, "built-in FedEFM silos (xray_foundation): share of a silo's classes no other silo holds")
    data_scanners: int = setting(3, "built-in FedEFM silos: scanner styles in the label space (classes = 4 devices x this)")
    task: Optional[str] = setting(None, '"segmentation" or "classification" (FedEFM phase 1); None = each datalist\'s "task", '
                                        "else segmentation")


@dataclass(frozen=True)
class ClassifierSettings:
    """The classification ViT (fedseg.foundation.PROFILES)."""

    vit_profile: str = setting("tiny", '"tiny" (96 px, CPU), "small" or "paper" (ViT-B/16 at 224)')
    vit_image_size: Optional[int] = setting(None, "input side of the ViT; None = the profile's")


@dataclass(frozen=True)
class BundleSettings:
    """The MONAI bundle that defines the network (and, for a user's bundle, the data, loss and optimiser)."""

    bundle: Optional[str] = setting(None, "a bundle under bundles/ (None = the task's: unet2d_seg / vit_foundation; "
                                          '"unetr_seg" = FedEFM\'s downstream UNETR) or a folder: any MONAI bundle, read through '
                                          "MONAI's ConfigWorkflow (fedseg.engine.bundle_engine)")
    bundle_overrides: Optional[Dict[str, Any]] = setting(None, "{config id: value} of a user's bundle at every site (each site adds "
                                                               "its own from --site-overrides)")
    feature_layer: Optional[str] = setting(None, "module path a feature-level method reads (defaults for MONAI's networks)")
    head_layer: Optional[str] = setting(None, "module path FedRep keeps local (defaults for MONAI's networks)")
    foundation_ckpt: Optional[str] = setting(None, "FedEFM's foundation checkpoint the UNETR's ViT encoder starts from (the server "
                                                   "reads it into the initial global model; sites never need the file)")
    partial_depth: Any = setting(False, "FedEFM downstream: how many of the encoder's blocks the sites train (False = all)")


@dataclass(frozen=True)
class EvaluationSettings:
    """What the final evaluation scores."""

    eval_metrics: Optional[List[str]] = setting(None, "test metrics (None = dice, hd95, assd; fedseg.metrics.AVAILABLE_METRICS)")
    eval_largest_component: bool = setting(False, "also score each prediction with only its largest connected component per "
                                                  "class: <metric>_lcc beside the raw <metric>, never instead")
    eval_best_val_round: bool = setting(False, "validate the aggregated global model every round and evaluate the best round's "
                                               "model too: final.global_best_val beside final.global")
    eval_local_models: bool = setting(False, "also score each site's locally trained model of the last round on its test split: "
                                             "final.local beside final.global")


@dataclass(frozen=True)
class NetworkSettings:
    """The network and the label space (bundle variables)."""

    image_size: int = setting(64, "side every image is resized to in resize mode (px)")
    in_channels: int = setting(3, "input channels of the network")
    num_classes: int = setting(2, "classes C of the softmax head, background = class 0 (fedseg.data.labels)")
    labels: Optional[Dict[str, int]] = setting(None, "{class name: index} where the job has more than one foreground class "
                                                     "(None = binary); fedseg run / bench fill it from the datalists")
    regions: Optional[Dict[str, List[str]]] = setting(None, "{region: [class names]} scored beside the classes")
    label_values: Optional[Dict[str, int]] = setting(None, "the stored mask encoding every site's datalist shares ({\"255\": 0, "
                                                           "...}), so fedseg infer writes masks in it")
    channels: List[int] = setting([16, 32, 64, 128, 256], "U-Net feature widths per level")
    network_variant: str = setting("two_conv_transpose", 'U-Net variant (fedseg.networks.FeatureUNet): "two_conv_transpose" or '
                                                         '"three_conv_nearest" (the FedEvi authors\' U-Net)')
    network_init: Optional[str] = setting(None, 'initial weights: None = the variant\'s own; "pytorch" or "kaiming_fan_out"')
    dropout: float = setting(0.0, "dropout probability of the network")
    norm: Any = setting("instance", '"instance" (not affine), "instance_affine" or "batch"; [name, {args}] works too')
    feature_alignment: bool = setting(False, "PathFL's bottleneck alignment layer (set by the PathFL recipe when AFA is on)")


@dataclass(frozen=True)
class TrainingSettings:
    """Loss, optimiser, batches, augmentation and intensities of local training."""

    seg_loss: str = setting("dice_ce", 'Dice term: "dice_ce" (MONAI\'s soft Dice on the softmax, foreground, per image) or '
                                       '"logit_dice" (soft Dice on the raw logits, every class, per batch: GraphFedSeg\'s code)')
    lambda_dice: float = setting(1.0, "weight of the Dice term (0: plain cross-entropy)")
    lambda_ce: float = setting(1.0, "weight of the cross-entropy term")
    optimizer_name: str = setting("Adam", "a torch.optim class")
    learning_rate: float = setting(1e-3, "learning rate of round 0")
    weight_decay: float = setting(0.0, "the optimiser's weight decay")
    adam_betas: List[float] = setting([0.9, 0.999], "Adam's betas")
    lr_decay_per_round: float = setting(1.0, "learning rate at round r = learning_rate * lr_decay_per_round ** r")
    optimizer_state: str = setting("keep", 'the local optimiser\'s state between rounds: "keep" or "reset" (emptied every round)')
    batch_size: int = setting(4, "training images per batch")
    drop_last: bool = setting(False, "drop each epoch's last incomplete batch (a site with fewer images than batch_size is "
                                     "refused)")
    augment: bool = setting(True, "augment training images")
    augment_level: str = setting("basic", '"basic" (flips, 90-degree turns), "strong" (+ crop, rotation, colour jitter, gamma) or '
                                          '"flip" (one random-axis flip with probability 0.5)')
    intensity: str = setting("fixed", '2-D images: "fixed" = stored value / 255, "image_max" = each image over its own maximum')
    seed: int = setting(0, "seed of the initial weights, the data order and the window samples")


@dataclass(frozen=True)
class SpatialSettings:
    """Resize or native-resolution patches (fedseg.engine.spatial)."""

    spatial_mode: Optional[str] = setting(None, '"resize" (every image to image_size) or "patch" (native resolution, random '
                                                "patches, sliding-window inference); None = the datalist's, else resize")
    patch_size: Any = setting(64, "patch side (px; volumes: one number or three)")
    patch_samples: int = setting(4, "patches drawn per image and epoch")
    patch_pos: float = setting(1.0, "weight of patch centres on foreground (posneg sampler)")
    patch_neg: float = setting(1.0, "weight of patch centres on background (posneg sampler)")
    patch_sampler: Optional[str] = setting(None, '"posneg" or "classes" (patch_ratios per class, None = equal); None = "classes" '
                                                 "with more than one foreground class, else posneg")
    patch_ratios: Optional[List[float]] = setting(None, "patch centre weights per class (classes sampler)")
    rescale: Optional[float] = setting(None, "fixed rescale factor before patching; None = the datalist's, else 1")


@dataclass(frozen=True)
class VolumeSettings:
    """CT / MR volumes (fedseg.data.volumes); None = the datalist's value."""

    spatial_dims: Optional[int] = setting(None, "3 = the data are volumes (None = the datalist's, else 2)")
    slice_axis: int = setting(2, 'the axis of the slices in spatial_mode "slices" (2 = axial after reorientation)')
    slice_foreground_only: bool = setting(False, "slice mode: train on slices with foreground only")
    target_spacing: Optional[List[float]] = setting(None, "voxel spacing every volume is resampled to (mm; required for volumes)")
    orientation: Optional[str] = setting(None, "orientation every volume is reoriented to (None = RAS)")
    modality: Optional[str] = setting(None, '"MR" (z-score of non-zero voxels) or "CT" (intensity_window to [0, 1])')
    intensity_window: Optional[List[float]] = setting(None, "CT: [HU low, high] mapped to [0, 1]")
    image_channels: Optional[List[str]] = setting(None, "names of the volumes of a 4-D image")
    volume_network: str = setting("unet", '"unet" (FeatureUNet, every method) or "unetr" (MONAI\'s UNETR, patch sides multiples '
                                          "of 16)")


@dataclass(frozen=True)
class SlidingWindowSettings:
    """Sliding-window inference over whole images in patch mode."""

    sw_batch_size: int = setting(4, "windows per forward pass")
    sw_overlap: float = setting(0.25, "overlap of neighbouring windows")
    sw_blend_mode: str = setting("gaussian", 'how overlapping windows are blended ("gaussian" or "constant")')


@dataclass(frozen=True)
class CacheSettings:
    """Decoded images a site keeps (fedseg.engine.cache)."""

    cache_max_mb: Optional[float] = setting(4096, "decoded images a site process keeps in memory (MB, all splits; None = "
                                                  "unbounded); the rest are decoded on access")
    cache_dir: Optional[str] = setting(None, "a folder on the site's disk where training volumes beyond cache_max_mb are kept "
                                             "decoded (None = off)")


@dataclass(frozen=True)
class ScheduleSettings:
    """The federated schedule and the wire."""

    local_epochs: int = setting(1, "local epochs per round")
    validate_every: int = setting(1, "validation metric sent every N rounds and always in the last round")
    payload_dtype: str = setting("float32", 'wire dtype of the weights ("float32", "float16" or "bfloat16"; fedseg.fl.payload)')


@dataclass(frozen=True)
class RuntimeSettings:
    """How a site uses its machine: speed options that leave the results' distribution unchanged."""

    amp: Optional[str] = setting(None, 'mixed precision of training (None, "bfloat16" or "float16": CUDA, with a gradient scaler)')
    num_workers: int = setting(0, "DataLoader worker processes feeding training (0 = in the training process)")
    resident_data: bool = setting(True, "hold a wholly cached training split where the network runs and augment whole batches "
                                        "there (fedseg.engine.resident); validate resize-mode images in batches")
    device_cache_mb: Optional[float] = setting(4096, "GPU memory the held training split may take (MiB); beyond it, pinned host "
                                                     "memory")
    eval_batch_size: int = setting(16, "images per forward pass of the batched validation")
    channels_last: bool = setting(False, "train 2-D networks in channels-last memory layout (GPU speed option)")
    round_validation: str = setting("train_task", 'how each round\'s global model is validated for eval_best_val_round: '
                                                  '"train_task" (with the next round\'s task) or "task" (a task of its own)')


@dataclass(frozen=True)
class PrivacySettings:
    """Differential privacy of local training (Opacus DP-SGD, fedseg.engine.privacy)."""

    dp_target_epsilon: Optional[float] = setting(None, "privacy budget of the job; None = DP off")
    dp_delta: float = setting(1e-5, "delta of the (epsilon, delta) guarantee")
    dp_max_grad_norm: float = setting(1.0, "per-sample gradient clipping norm")


@dataclass(frozen=True)
class TrainConfig:
    """The typed ``train_config``: one frozen dataclass per group of options, each field with its type, default and meaning.

    ``train_config`` stays a plain dict on the wire, in job files and in records (:meth:`as_dict`, in this field order);
    a site engine builds this once from it (:func:`site_train_config`) and reads attributes:
    ``config.training.batch_size``.
    """

    data: DataSettings = field(default_factory=DataSettings)
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)
    bundle: BundleSettings = field(default_factory=BundleSettings)
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    spatial: SpatialSettings = field(default_factory=SpatialSettings)
    volume: VolumeSettings = field(default_factory=VolumeSettings)
    sliding_window: SlidingWindowSettings = field(default_factory=SlidingWindowSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    privacy: PrivacySettings = field(default_factory=PrivacySettings)

    @classmethod
    def from_dict(cls, train_config: Mapping[str, Any]) -> "TrainConfig":
        """The typed form of a ``train_config`` dict: its value for every key it holds, the default for the others. A
        scalar field that cannot be None reads None as its default (``num_workers: None`` = 0), and int / float
        fields are converted (``"4"`` -> 4). Keys outside the groups (a site's ``bundle_writers_dir``, ...) are left
        to the dict; :func:`check_train_config_keys` refuses them where a job is written."""
        groups = {}
        for group in fields(cls):
            values = {}
            for f in fields(group.default_factory):
                if f.name in train_config:
                    values[f.name] = _typed(f, train_config[f.name])
            groups[group.name] = group.default_factory(**values)
        return cls(**groups)

    def as_dict(self) -> Dict[str, Any]:
        """``{key: value}`` of every option, in the groups' order (the order of job files and records)."""
        out: Dict[str, Any] = {}
        for group in fields(self):
            settings = getattr(self, group.name)
            out.update({f.name: copy.deepcopy(getattr(settings, f.name)) for f in fields(settings)})
        return out

    @classmethod
    def keys(cls) -> Tuple[str, ...]:
        """Every option's key, in the groups' order."""
        return tuple(f.name for group in fields(cls) for f in fields(group.default_factory))


def _typed(f: Any, value: Any) -> Any:
    """``value`` of field ``f``: None for a field that cannot be None is its default; ints and floats converted."""
    kind = f.type
    if value is None:
        return value if kind.startswith("Optional") or kind == "Any" else (f.default_factory() if f.default is MISSING else f.default)
    if kind in ("int", "Optional[int]") and not isinstance(value, bool):
        return int(value)
    if kind in ("float", "Optional[float]") and not isinstance(value, bool):
        return float(value)
    return value


#: the default train_config: every option's default, written once (in the groups above)
BASE_TRAIN_CONFIG: Dict[str, Any] = TrainConfig().as_dict()


def check_train_config_keys(keys: Iterable[str], where: str = "") -> None:
    """Refuse keys that are not train_config options, each with the nearest valid name where one is close.

    Raises:
        ValueError: ``unknown train_config keys [...]`` (``where`` appended, e.g. "in --set").
    """
    unknown = sorted(set(keys) - set(BASE_TRAIN_CONFIG))
    if unknown:
        hints = [f" ({name!r}: did you mean {close[0]!r}?)" for name in unknown
                 for close in [difflib.get_close_matches(name, list(BASE_TRAIN_CONFIG), n=1)] if close]
        raise ValueError(f"unknown train_config keys {unknown}{' ' + where if where else ''}{''.join(hints)}; "
                         f"known: {sorted(BASE_TRAIN_CONFIG)}")


def as_train_config(train_config: "Mapping[str, Any] | TrainConfig") -> TrainConfig:
    """A :class:`TrainConfig` as it is; a ``train_config`` dict through :meth:`TrainConfig.from_dict` (helpers take
    either: engines hand their typed config, scripts a dict)."""
    return train_config if isinstance(train_config, TrainConfig) else TrainConfig.from_dict(train_config)


#: the train_config keys whose value, where a site's train_config does not set them, is the bundle's variable of that name
#: (``SegEngine``: the bundle's own patch and sliding-window settings)
BUNDLE_DEFAULTED_KEYS = ("patch_size", "image_size", "patch_samples", "sw_overlap", "sw_batch_size", "sw_blend_mode")


def site_train_config(train_config: Mapping[str, Any], bundle_variables: Optional[Mapping[str, Any]] = None) -> TrainConfig:
    """The typed config of a site: ``train_config`` (the profile and the job's options, as :func:`resolve_profile` merged
    them, plus what the site resolved), then for :data:`BUNDLE_DEFAULTED_KEYS` it does not set the bundle's variables,
    then the defaults. Pure: reads its arguments only."""
    merged = {k: bundle_variables[k] for k in BUNDLE_DEFAULTED_KEYS if bundle_variables is not None and k in bundle_variables}
    merged.update(train_config)
    return TrainConfig.from_dict(merged)


#: what a volume job (spatial_dims 3) uses where the profile and the caller leave a key at its 2-D default: a
#: 4-level U-Net (a 16-slice patch keeps 2 slices at the bottleneck), anisotropic patches that fit MR stacks of a
#: few dozen slices, grey volumes, smaller batches (a 3-D patch holds ~16 2-D patches' voxels)
VOLUME_DEFAULTS: Dict[str, Any] = {
    "channels": [16, 32, 64, 128],
    "patch_size": [64, 64, 16],
    "in_channels": 1,
    "batch_size": 2,
    "patch_samples": 2,
}

#: and under the ``paper`` profile with 3-D patches: 96^3-voxel patches, the size CT segmentation papers train their 3-D
#: U-Nets and UNETR on (96 = 16 x 6: UNETR's ViT patches, and 6^3 voxels at a 5-level U-Net's bottleneck), and that
#: U-Net's width
VOLUME_PAPER_DEFAULTS: Dict[str, Any] = {"patch_size": [96, 96, 96], "channels": [32, 64, 128, 256, 320]}

#: and in slice mode: an epoch draws this many slices of each volume (about every slice of a 13-23-slice MR stack
#: once), as a 2-D pipeline over the slices would; 3-D patches keep VOLUME_DEFAULTS' 2 per volume
SLICE_DEFAULTS: Dict[str, Any] = {"patch_samples": 16}

PROFILES: Dict[str, Dict[str, Any]] = {
    # unit/integration tests: a few seconds per round on one core
    "tiny": {
        "num_rounds": 2,
        "train_config": {
            "data_profile": "tiny",
            "image_size": 32,
            "patch_size": 16,
            "patch_samples": 2,
            "channels": [8, 16, 32, 64],
            "batch_size": 2,
            "learning_rate": 3e-3,
            "local_epochs": 3,
        },
    },
    # the README's main job: a few minutes on a 2-core laptop
    "default": {"num_rounds": 10, "train_config": {}},
}


#: seconds one local epoch at 64 x 64 px may take at a site before ``default_task_timeout`` gives up on it;
#: generous on purpose (a slow CPU-only hospital site must not be cut off), since the timeout only has to end
#: a round that a dead or hung site would otherwise hold for ever
TASK_SECONDS_PER_EPOCH_64PX = 300
#: bounds of ``default_task_timeout`` (5 minutes, 24 hours)
TASK_TIMEOUT_RANGE = (300, 24 * 3600)


#: the train_config keys of a *local training protocol*: how a site trains and scores a model, whatever the method
#: (network, optimiser, batches, epochs, augmentation, intensity, the bundle's loss, the evaluation options). A method
#: is a client objective + a server strategy; the protocol belongs to the comparison: ``fedseg bench --profile paper``
#: gives every method of a bench one protocol (:func:`fedseg.recipes.paper_protocol`)
LOCAL_PROTOCOL_KEYS = (
    "image_size", "channels", "norm", "network_variant", "network_init", "dropout",
    "optimizer_name", "learning_rate", "adam_betas", "weight_decay", "lr_decay_per_round", "optimizer_state",
    "batch_size", "drop_last", "local_epochs", "augment", "augment_level", "intensity",
    "seg_loss", "lambda_dice", "lambda_ce",
    "patch_size", "patch_samples",
    "eval_largest_component", "eval_best_val_round", "eval_local_models",
)


#: values of the train_config choices checked by :func:`check_training_options`
AUGMENT_LEVELS = ("basic", "strong", "flip")
INTENSITY_MODES = ("fixed", "image_max")
SEG_LOSSES = ("dice_ce", "logit_dice")
BOOLEAN_OPTIONS = ("drop_last", "augment", "eval_largest_component", "eval_best_val_round", "eval_local_models")


def check_training_options(train_config: Dict[str, Any]) -> None:
    """Fail with the allowed values when a local-training choice of ``train_config`` is unknown: a misspelt
    ``augment_level`` must not silently train with another augmentation.

    Raises:
        ValueError: an unknown ``augment_level``, ``intensity`` or ``seg_loss``, a non-boolean switch, or
            ``intensity="image_max"`` for volumes (their intensity follows the modality: ``fedseg.data.volumes``).
    """
    level = train_config.get("augment_level", BASE_TRAIN_CONFIG["augment_level"])
    if level not in AUGMENT_LEVELS:
        raise ValueError(f"train_config['augment_level'] must be one of {AUGMENT_LEVELS}, got {level!r}")
    intensity = train_config.get("intensity", BASE_TRAIN_CONFIG["intensity"])
    if intensity not in INTENSITY_MODES:
        raise ValueError(f"train_config['intensity'] must be one of {INTENSITY_MODES}, got {intensity!r}")
    seg_loss = train_config.get("seg_loss", BASE_TRAIN_CONFIG["seg_loss"])
    if seg_loss not in SEG_LOSSES:
        raise ValueError(f"train_config['seg_loss'] must be one of {SEG_LOSSES}, got {seg_loss!r}")
    if intensity == "image_max" and int(train_config.get("spatial_dims") or 2) == 3:
        raise ValueError("train_config['intensity']='image_max' applies to 2-D images; volumes are normalised by modality "
                         "(train_config['modality'])")
    for key in BOOLEAN_OPTIONS:
        if not isinstance(train_config.get(key, False), bool):
            raise ValueError(f"train_config[{key!r}] must be true or false, got {train_config[key]!r}")


def validation_due(train_config: Dict[str, Any], round_: int, total_rounds: int) -> bool:
    """Whether a site computes its validation metric after training round ``round_`` (0-based)."""
    every = train_config.get("validate_every", BASE_TRAIN_CONFIG["validate_every"])
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"train_config['validate_every'] must be a positive integer, got {every!r}")
    return (round_ + 1) % every == 0 or round_ >= total_rounds - 1


def default_task_timeout(train_config: Dict[str, Any]) -> int:
    """Seconds a site may take for one task when the job does not say (``task_timeout=None``).

    ``TASK_SECONDS_PER_EPOCH_64PX * local_epochs * max(1, side / 64) ** 2`` with ``side`` the training
    input size (``patch_size`` in patch and slice mode, else ``image_size``; a 3-D patch counts as the square of as many
    voxels), clipped to :data:`TASK_TIMEOUT_RANGE`:
    a task's work grows with the epochs and the pixels per image. Examples: tiny profile (32 px, 3 epochs)
    900 s; default (64 px, 1 epoch) 300 s; a 384 px paper profile with 2 epochs 6 h.
    A site that has not answered by then is left out of the round (``missing`` in report.json) and the
    round finishes with the others; ``task_timeout=0`` waits for ever (not recommended outside tests).
    """
    value = {}
    for key in ("local_epochs", "image_size", "patch_size"):
        value[key] = train_config.get(key, BASE_TRAIN_CONFIG[key])
        sizes = value[key] if key == "patch_size" and isinstance(value[key], (list, tuple)) else [value[key]]
        if not sizes or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in sizes):
            raise ValueError(f"default_task_timeout: train_config[{key!r}] must be a positive integer, got {value[key]!r}")
    patch = value["patch_size"]
    if isinstance(patch, (list, tuple)):  # a 3-D patch: the side of the square with as many voxels
        patch = math.sqrt(math.prod(patch))
    side = patch if train_config.get("spatial_mode") in ("patch", "slices") else value["image_size"]
    seconds = TASK_SECONDS_PER_EPOCH_64PX * value["local_epochs"] * max(1.0, side / 64) ** 2
    low, high = TASK_TIMEOUT_RANGE
    return int(min(high, max(low, round(seconds))))


def resolve_profile(
    profile: str,
    method_profiles: Optional[Dict[str, Dict[str, Any]]] = None,
    num_rounds: Optional[int] = None,
    **train_overrides: Any,
) -> Dict[str, Any]:
    """Merge base config <- profile <- explicit overrides; returns {"num_rounds", "train_config"}."""
    profiles = {**PROFILES, **(method_profiles or {})}
    if profile not in profiles:
        raise ValueError(f"unknown profile {profile!r}; choose from {sorted(profiles)}")
    chosen = copy.deepcopy(profiles[profile])
    train_config = {**BASE_TRAIN_CONFIG, **chosen.get("train_config", {})}
    check_train_config_keys(train_overrides)
    given = {k: v for k, v in train_overrides.items() if v is not None}
    if int(given.get("spatial_dims") or 2) == 3:
        # a volume job: the 3-D defaults where neither the profile nor the caller chose
        slices = given.get("spatial_mode") == "slices"
        defaults = {**VOLUME_DEFAULTS, **(SLICE_DEFAULTS if slices else {}),
                    **(VOLUME_PAPER_DEFAULTS if profile == "paper" and not slices else {})}
        for key, value in defaults.items():
            if key not in chosen.get("train_config", {}) and key not in given:
                train_config[key] = copy.deepcopy(value)
    train_config.update(given)
    check_training_options(train_config)
    return {"num_rounds": int(num_rounds or chosen["num_rounds"]), "train_config": train_config}
