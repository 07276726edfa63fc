"""The local engine of an image-classification site (FedEFM phase 1: a ViT over a global label space).

The ``ClassifierEngine`` protocol of ``fedseg.engine.api`` (what objectives and the site client may call):
``train(model, objective, ctx, epochs=None)``, ``evaluate(model, split, per_image=False)``,
``validation_metrics(model)``, ``loader(split, ...)``, ``build_network()``, ``make_optimizer(model)``,
``n_train``, ``train_config``, ``device``, ``site``. Differences:

* data: a classification datalist (``fedseg.data.classification``), items ``{"image", "label": int}``;
  batches ``{"image": (B, C, S, S) float in [0, 1], "label": (B,) long}`` with ``S = vit_image_size``;
* network: ``fedseg.foundation.build_vit(vit_profile, in_channels, num_classes, vit_image_size,
  init_seed=seed)`` — every site and the server build the same round-0 weights;
  ``num_classes`` (train_config) must equal ``len(label_space)`` of the datalist;
* loss: cross-entropy on class logits ``(B, K)`` (handed to the objective as its ``seg_loss``, so
  the FedAvg objective trains a classifier unchanged); with ``objective.needs_features`` the ViT's
  normalised patch tokens ``(B, N, D)`` reach the objective as ``BatchOutput.features["tokens"]``;
* metrics: ``accuracy``, ``balanced_accuracy`` (mean recall over the classes present in the split's
  truth) and ``accuracy_class_<k>`` (recall of class ``k``, for each class ``k`` present), see
  :func:`classification_metrics`; validation sends ``val_accuracy``;
* differential privacy is refused: the DP-SGD path (``engine/privacy.py``) is built and tested for the
  segmentation engine only.

train_config keys read here: ``vit_profile`` ("tiny": 96 px, patch 16, 4 blocks, CPU; "small";
"paper": ViT-B/16 at 224), ``vit_image_size`` (None = the profile's), ``in_channels`` (1 or 3),
``num_classes``, ``dropout``, ``optimizer_name``, ``learning_rate``, ``weight_decay``, ``adam_betas``,
``lr_decay_per_round``, ``batch_size``, ``local_epochs``, ``augment``, ``seed``, ``cache_max_mb``.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from monai.data import CacheDataset, DataLoader
from torch import nn

from fedseg.config import TrainConfig
from fedseg.data.classification import load_classification_datalist, label_space
from fedseg.data.classification_transforms import classification_transforms
from fedseg.engine.base import LocalEngine
from fedseg.foundation.networks import PROFILES, build_vit
from fedseg.objectives.base import ClientObjective, RoundContext

logger = logging.getLogger(__name__)

__all__ = ["ClassificationEngine", "ClassCrossEntropy", "classification_metrics", "vit_settings"]


class ClassCrossEntropy(nn.Module):
    """Cross-entropy of class logits ``(B, K)`` against class indices (any shape with ``B`` elements)."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels.long().view(-1))


def vit_settings(train_config: Dict[str, Any]) -> Dict[str, Any]:
    """``{"profile", "image_size", "in_channels", "num_classes"}`` of the job's ViT (train_config; ``vit_profile``'s default
    ``fedseg.config.ClassifierSettings``, the profile's image size, 1 channel where ``in_channels`` is unset); a clear error
    for an unknown profile or bad size."""
    profile = TrainConfig.from_dict(train_config).classifier.vit_profile
    if profile not in PROFILES:
        raise ValueError(f"unknown vit_profile {profile!r}; choose from {sorted(PROFILES)}")
    size = train_config.get("vit_image_size") or PROFILES[profile]["img_size"]
    patch = PROFILES[profile]["patch_size"]
    if int(size) % patch:
        raise ValueError(f"vit_image_size {size} is not a multiple of the ViT patch size {patch}")
    return {
        "profile": profile,
        "image_size": int(size),
        "in_channels": int(train_config.get("in_channels") or 1),
        "num_classes": int(train_config["num_classes"]) if train_config.get("num_classes") is not None else None,
    }


def classification_metrics(
    predictions: Sequence[int], labels: Sequence[int], num_classes: int
) -> Dict[str, float]:
    """Accuracy metrics of predicted against true class indices.

    ``accuracy`` = correct / n; ``accuracy_class_<k>`` = correct among the images of true class ``k`` /
    their number (recall of ``k``), for each class with at least one image; ``balanced_accuracy`` = mean
    of those per-class values (classes absent from ``labels`` are left out, not counted as 0).
    """
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not labels:
        raise ValueError("no images to score")
    per_class: Dict[int, List[int]] = {}
    for p, y in zip(predictions, labels):
        if not 0 <= int(y) < num_classes:
            raise ValueError(f"label {y} outside 0..{num_classes - 1}")
        hits = per_class.setdefault(int(y), [0, 0])
        hits[0] += int(int(p) == int(y))
        hits[1] += 1
    correct = sum(h[0] for h in per_class.values())
    recalls = {k: h[0] / h[1] for k, h in sorted(per_class.items())}
    out = {"accuracy": correct / len(labels), "balanced_accuracy": sum(recalls.values()) / len(recalls)}
    out.update({f"accuracy_class_{k}": v for k, v in recalls.items()})
    return out


class ClassificationEngine(LocalEngine):
    """Local engine of a classification site (module docstring).

    Args:
        site: site name.
        datalist: the site's classification datalist (``task: classification``, ``label_space``).
        train_config: effective hyper-parameters (keys in the module docstring).
        device: defaults to CUDA when available, else CPU.
        dp_seed: accepted for a uniform constructor; DP itself is refused.
    Raises:
        ValueError: DP requested, ``num_classes`` different from the label space's size, bad ViT settings.
        fedseg.data.datalist.DatalistError: a malformed datalist (label outside the label space, ...).
    """

    task = "classification"

    def __init__(
        self,
        site: str,
        datalist: os.PathLike,
        train_config: Dict[str, Any],
        device: Optional[torch.device] = None,
        dp_seed: Optional[int] = None,
    ):
        super().__init__(site, datalist, train_config, device=device, dp_seed=dp_seed)
        self.refuse_private_training("DP-SGD is implemented for the segmentation engine only, not for the ViT classifier")
        self.label_space = label_space(self.datalist_info, self.datalist_path)
        self.data = load_classification_datalist(self.datalist_path)
        vit = vit_settings(self.train_config)
        if vit["num_classes"] is not None and vit["num_classes"] != len(self.label_space):
            raise ValueError(
                f"{site}: train_config num_classes={vit['num_classes']} but the datalist {self.datalist_path} has a "
                f"label space of {len(self.label_space)} classes; every site and the server must use the global "
                f"label space size (set num_classes={len(self.label_space)})"
            )
        vit["num_classes"] = len(self.label_space)
        self.vit = vit
        self.num_classes = vit["num_classes"]
        self.update_train_config(dict(
            vit_profile=vit["profile"], vit_image_size=vit["image_size"], in_channels=vit["in_channels"], num_classes=self.num_classes
        ))
        self.n_train = len(self.data["training"])
        self._datasets: Dict[Tuple[str, bool], CacheDataset] = {}
        budget = self.config.cache.cache_max_mb
        self._cache_left = None if budget is None else float(budget) * 2**20
        logger.info(
            "%s: classification, %d classes, ViT %s at %d px, %d training images",
            site, self.num_classes, vit["profile"], vit["image_size"], self.n_train,
        )

    # ----------------------------------------------------------------------------------- components
    def build_network(self) -> nn.Module:
        """A fresh :class:`~fedseg.foundation.ViTClassifier` (seeded by ``train_config["seed"]``) on the device:
        the same constructor and arguments as ``bundles/vit_foundation``'s ``network_def``, which the server
        builds the round-0 model from (``fedseg.bundle.build_network``)."""
        return build_vit(
            self.vit["profile"], self.vit["in_channels"], self.num_classes, img_size=self.vit["image_size"],
            init_seed=self.seed, dropout_rate=self.config.network.dropout,
        ).to(self.device)

    def build_loss(self) -> nn.Module:
        return ClassCrossEntropy()

    def _optimizer_factory(self):
        training = self.config.training
        name = training.optimizer_name
        if not hasattr(torch.optim, name):
            raise ValueError(f"unknown optimizer_name {name!r} (a torch.optim class)")
        kwargs = {"lr": training.learning_rate, "weight_decay": training.weight_decay}
        if name in ("Adam", "AdamW") and training.adam_betas is not None:
            kwargs["betas"] = tuple(float(b) for b in training.adam_betas)
        return functools.partial(getattr(torch.optim, name), **kwargs)

    # ----------------------------------------------------------------------------------------- data
    def _dataset(self, split: str, train: bool) -> CacheDataset:
        self._check_split(split)
        key = (split, train)
        if key not in self._datasets:
            items = [{"image": e["image"], "label": int(e["label"])} for e in self.data[split]]
            transform = classification_transforms(
                self.vit["image_size"], self.vit["in_channels"], train=train, augment=bool(self.config.training.augment)
            )
            # cached: decoded and resized images (float32, C x S x S each), within the site's budget
            item_bytes = 4 * self.vit["in_channels"] * self.vit["image_size"] ** 2
            cache_num = len(items)
            if self._cache_left is not None:
                cache_num = min(cache_num, max(int(self._cache_left // item_bytes), 0))
                self._cache_left -= cache_num * item_bytes
            self._datasets[key] = CacheDataset(items, transform=transform, cache_num=cache_num, progress=False, num_workers=0)
        return self._datasets[key]

    def loader(self, split: str, shuffle: bool = False, train: bool = False, batch_size: Optional[int] = None) -> DataLoader:
        """Batches ``{"image": (B, C, S, S) float in [0, 1], "label": (B,) long}`` of ``batch_size``
        (default ``train_config["batch_size"]``) images, evaluation included (all images share one size);
        ``train=True`` adds the random flips when ``augment``."""
        bs = int(batch_size or self.config.training.batch_size)
        return self.data_loader(self._dataset(split, train), bs, shuffle, train)

    # ------------------------------------------------------------------------------------- training
    def train(
        self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, epochs: Optional[int] = None
    ) -> Dict[str, float]:
        """``epochs`` (default ``local_epochs``) epochs of ``objective.loss`` on the training split.
        Returns ``train_loss`` (mean over iterations) and ``steps``."""
        self.refuse_private_training("DP-SGD is implemented for the segmentation engine only, not for the ViT classifier")
        objective.set_seg_loss(self.build_loss())
        optimizer = self.prepare_optimizer(model, ctx)
        return self.run_epochs(model, objective, ctx, optimizer, self.local_epochs(epochs))

    def batch_labels(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Class indices ``(B,)`` (long)."""
        return batch["label"].to(self.device).long().view(-1)

    def forward(self, model: nn.Module, inputs: torch.Tensor, with_features: bool):
        """``(logits (B, K), {"tokens": (B, N, D)})`` with features, else ``(logits, {})``."""
        if with_features:
            logits, tokens = model.forward_features(inputs)
            return logits, {"tokens": tokens}
        return model(inputs), {}

    # ----------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def predict_classes(self, model: nn.Module, split: str) -> Tuple[List[int], List[int]]:
        """``(predicted class per image, true class per image)`` over ``split`` in datalist order (eval mode)."""
        was_training = model.training
        model.eval()
        predictions: List[int] = []
        labels: List[int] = []
        try:
            for batch in self.loader(split):
                logits = model(batch["image"].to(self.device))
                predictions += logits.argmax(dim=1).cpu().tolist()
                labels += batch["label"].view(-1).tolist()
        finally:
            model.train(was_training)
        return predictions, labels

    def evaluate(self, model: nn.Module, split: str, per_image: bool = False):
        """:func:`classification_metrics` of ``model`` on ``split``. With ``per_image`` returns ``(means,
        rows)``, one row per image in datalist order ``{"id": image file name, "label", "prediction",
        "correct"}`` — site-local, never sent."""
        predictions, labels = self.predict_classes(model, split)
        means = classification_metrics(predictions, labels, self.num_classes)
        if not per_image:
            return means
        rows = [
            {"id": os.path.basename(e["image"]), "label": y, "prediction": p, "correct": float(p == y)}
            for e, p, y in zip(self.data[split], predictions, labels)
        ]
        return means, rows

    def validation_metrics(self, model: nn.Module) -> Dict[str, float]:
        """``{"val_accuracy": accuracy on the validation split}`` (sent with the trained weights)."""
        return {"val_accuracy": self.evaluate(model, "validation")["accuracy"]}
