"""Training profiles: CPU-friendly defaults, a tiny profile for tests, and per-method ``paper`` profiles.

A profile is a pair (num_rounds, train_config). ``train_config`` travels to every site in the task
meta and is written verbatim into ``report.json['config']``; bundle variables among its keys
(image_size, channels, learning_rate, ...) override the MONAI bundle's defaults.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, Optional

BASE_TRAIN_CONFIG: Dict[str, Any] = {
    # data: built-in synthetic family used when a site has no datalist configured
    "data_family": "polyp",
    "data_profile": "default",
    "data_seed": 0,
    # built-in FedEFM silos (data_family "xray_foundation"): share of a silo's classes no other silo holds,
    # and scanner styles in the label space (classes = 4 devices x data_scanners)
    "data_unseen": 1.0,
    "data_scanners": 3,
    # "segmentation" or "classification" (FedEFM phase 1); None = each datalist's "task", else segmentation
    "task": None,
    # classification ViT (fedseg.foundation.PROFILES: "tiny" 96 px CPU, "small", "paper" ViT-B/16 at 224);
    # vit_image_size None = the profile's; num_classes must equal the datalists' label_space length
    "vit_profile": "tiny",
    "vit_image_size": None,
    # MONAI bundle under bundles/ that defines the network (None = the task's: unet2d_seg / vit_foundation);
    # "unetr_seg" = FedEFM's downstream UNETR, whose ViT encoder starts from foundation_ckpt (the server reads
    # it into the initial global model; sites receive the weights and never need the file)
    # or a folder: any MONAI bundle (a user's, read through MONAI's ConfigWorkflow: fedseg.engine.bundle_engine), with
    # bundle_overrides {config id: value} at every site (each site adds its own from --site-overrides); feature_layer /
    # head_layer name the module path a feature-level method reads / FedRep keeps local (defaults for MONAI's networks)
    "bundle": None,
    "bundle_overrides": None,
    "feature_layer": None,
    "head_layer": None,
    "foundation_ckpt": None,
    "partial_depth": False,
    # test metrics of the final evaluation (None = dice, hd95, assd; fedseg.metrics.AVAILABLE_METRICS)
    "eval_metrics": None,
    # the final evaluation also scores each prediction with only its largest connected component per class
    # (MONAI's KeepLargestConnectedComponent, 4-/6-connectivity): <metric>_lcc beside the raw <metric>, never instead
    "eval_largest_component": False,
    # also validate the aggregated global model every round (mean validation Dice over the sites) and evaluate the
    # best round's model on the test splits: final.global_best_val beside final.global (the last round's model)
    "eval_best_val_round": False,
    # the final evaluation also scores each site's locally trained model of the last round (the model the site sent,
    # before aggregation) on that site's test split: final.local beside final.global
    "eval_local_models": False,
    # network / optimisation (bundle variables)
    "image_size": 64,
    "in_channels": 3,
    # label space (fedseg.data.labels): num_classes C (softmax head of C channels, background = class 0); labels
    # {name: index} and regions {region: [class names]} where the job has more than one foreground class or regions
    # (None = binary); fedseg run / bench fill them from the sites' datalists (or the built-in family) and every
    # site checks its datalist against them. label_values: the stored mask encoding every site's datalist shares
    # ({"255": 0, ...}), recorded so fedseg infer writes masks in it; each site decodes its own datalist's
    "num_classes": 2,
    "labels": None,
    "regions": None,
    "label_values": None,
    "channels": [16, 32, 64, 128, 256],
    # U-Net variant (fedseg.networks.FeatureUNet): "two_conv_transpose" (two 3x3 convolutions per block, transposed
    # convolutions up, PyTorch's default initialisation) or "three_conv_nearest" (three 3x3 convolutions per encoder
    # block, nearest-neighbour upsampling + 1x1 convolution, Kaiming-normal fan-out initialisation: the U-Net of the
    # FedEvi authors' code)
    "network_variant": "two_conv_transpose",
    # initial weights: None = the variant's own; "pytorch" or "kaiming_fan_out" (fedseg.networks.unet.INIT_SCHEMES)
    "network_init": None,
    "dropout": 0.0,
    # "instance" (MONAI: not affine), "instance_affine" (learnable scale and shift) or "batch"; [name, {args}] works too
    "norm": "instance",
    # PathFL's bottleneck alignment layer (set by the PathFL recipe when AFA is on)
    "feature_alignment": False,
    # segmentation loss = lambda_dice * Dice + lambda_ce * cross-entropy (lambda_dice 0: plain CE); the Dice term:
    # "dice_ce" = MONAI's soft Dice on the softmax, foreground classes, one Dice per image; "logit_dice" = soft Dice on
    # the raw logits (no softmax), every class (background too), squared predictions in the denominator, one Dice per
    # class over the whole batch (the GraphFedSeg authors' code)
    "seg_loss": "dice_ce",
    "lambda_dice": 1.0,
    "lambda_ce": 1.0,
    "optimizer_name": "Adam",
    "learning_rate": 1e-3,
    "weight_decay": 0.0,
    "adam_betas": [0.9, 0.999],
    # learning rate at round r = learning_rate * lr_decay_per_round ** r (ExponentialLR stepped per round)
    "lr_decay_per_round": 1.0,
    # the local optimiser's state (Adam moments) between rounds: "keep" (one optimiser per site for the job) or
    # "reset" (emptied at the start of every round)
    "optimizer_state": "keep",
    "batch_size": 4,
    # drop each epoch's last incomplete training batch (a site with fewer training images than batch_size is refused)
    "drop_last": False,
    "augment": True,
    # "basic": flips on both axes and 90-degree rotations; "strong": + random crop, rotation, colour jitter, gamma;
    # "flip": one flip along a randomly chosen axis with probability 0.5, nothing else
    "augment_level": "basic",
    # image intensities (2-D bundles): "fixed" = stored value / 255; "image_max" = each image divided by its own
    # maximum, on the network's grid (after resizing or rescaling)
    "intensity": "fixed",
    "seed": 0,
    # spatial mode (fedseg.engine.spatial): None = the datalist's "spatial_mode", else "resize";
    # "resize" = every image resized to image_size; "patch" = native resolution, random patch_size
    # patches (patch_samples per image, positive:negative centres patch_pos:patch_neg) for training and
    # sliding-window inference over whole images (sw_overlap, sw_blend_mode, sw_batch_size)
    "spatial_mode": None,
    "patch_size": 64,
    "patch_samples": 4,
    "patch_pos": 1.0,
    "patch_neg": 1.0,
    # patch centres: "posneg" (RandCropByPosNegLabeld) or "classes" (RandCropByLabelClassesd, patch_ratios per class,
    # None = equal); None = "classes" with more than one foreground class, else "posneg"
    "patch_sampler": None,
    "patch_ratios": None,
    # one fixed rescale factor applied in patch mode before patching; None = the datalist's "rescale", else 1
    "rescale": None,
    # volumes (fedseg.data.volumes): spatial_dims 3 = the data are CT / MR volumes (None = the datalist's, else 2); then
    # spatial_mode "patch" = a 3-D network on 3-D patches (patch_size one number or three), "slices" = a 2-D network on
    # the slices along slice_axis (2 = axial after reorientation; slice_foreground_only: train on slices with
    # foreground only). Every volume is reoriented to orientation (None = RAS) and resampled to target_spacing (mm;
    # required for volumes); intensity by modality ("MR": z-score of non-zero voxels; "CT": intensity_window [HU low,
    # high] to [0, 1]); image_channels names the volumes of a 4-D image. None = the datalist's value
    "spatial_dims": None,
    "slice_axis": 2,
    "slice_foreground_only": False,
    "target_spacing": None,
    "orientation": None,
    "modality": None,
    "intensity_window": None,
    "image_channels": None,
    # the network of a volume job (fedseg.networks.volume): "unet" (FeatureUNet, every method) or "unetr" (MONAI's
    # UNETR with a ViT-B/16 encoder over the patch, as on 96^3 CT patches; patch sides multiples of 16)
    "volume_network": "unet",
    "sw_batch_size": 4,
    "sw_overlap": 0.25,
    "sw_blend_mode": "gaussian",
    # decoded images a site process keeps in memory (MB, all splits together); the rest are decoded on access
    "cache_max_mb": 4096,
    # a folder on the site's local disk (None = off; relative to the site process's folder) where training volumes
    # beyond cache_max_mb are kept decoded (MONAI PersistentDataset, fedseg.engine.cache.SiteDataset): each is decoded
    # once and read back afterwards instead of decoded every epoch; it holds the site's own data, in float32
    "cache_dir": None,
    # federated schedule
    "local_epochs": 1,
    # validation metric (val_dice / val_accuracy) sent every N rounds and always in the last round: sliding-window
    # validation of whole slides can cost several times the round's training (measured on real nuclei slides; docs/methods.md, PathFL)
    "validate_every": 1,
    # wire dtype of the weights sent each way ("float32" | "float16" | "bfloat16"; fedseg.fl.payload):
    # half precision halves the bytes of a round; models are kept and trained in float32 at both ends
    "payload_dtype": "float32",
    # mixed precision of the training forward/backward (None | "bfloat16" | "float16"; float16 needs CUDA and uses
    # a gradient scaler); evaluation always runs in float32
    "amp": None,
    # DataLoader worker processes feeding training (0 = in the training process); pinned memory on CUDA
    "num_workers": 0,
    # hold a wholly cached training split where the network runs and augment whole batches there
    # (fedseg.engine.resident; same per-sample augmentation distributions as the bundle's MONAI transforms), and
    # validate resize-mode images in batches; False = the per-sample DataLoader path
    "resident_data": True,
    # device memory the held training split of one site process may take on a GPU (MiB); beyond it, pinned host memory
    "device_cache_mb": 4096,
    # images per forward pass of the batched validation (resident_data)
    "eval_batch_size": 16,
    # train 2-D networks in channels-last memory layout (a GPU speed option; same arithmetic, other kernels)
    "channels_last": False,
    # how each round's global model is validated for best-round selection (eval_best_val_round): "train_task" = with the
    # task the sites receive next (one task per round), "task" = an evaluate task of its own after every round
    "round_validation": "train_task",
    # differential privacy in local training (Opacus DP-SGD); None = off
    "dp_target_epsilon": None,
    "dp_delta": 1e-5,
    "dp_max_grad_norm": 1.0,
}

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
    unknown = set(train_overrides) - set(BASE_TRAIN_CONFIG)
    if unknown:
        raise ValueError(f"unknown train_config keys {sorted(unknown)}; known: {sorted(BASE_TRAIN_CONFIG)}")
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
