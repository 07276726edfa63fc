"""The one local training / evaluation engine every method runs on.

Training is MONAI's ``SupervisedTrainer`` (an ignite engine) with a custom iteration that asks the
method's ``ClientObjective`` for the loss, so methods change *what* is optimised, never *how* the loop
runs. Network, transforms, loss and optimiser come from the MONAI bundle; hyper-parameters from the
server's ``train_config``. See ``api.md`` beside this file for the contract objectives rely on.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import torch
from monai.data import CacheDataset, DataLoader
from monai.engines import SupervisedTrainer
from monai.utils import set_determinism
from torch import nn

from fedseg.bundle import load_bundle
from fedseg.data.datalist import load_datalist
from fedseg.metrics import SegmentationMetrics
from fedseg.objectives.base import BatchOutput, ClientObjective, RoundContext

logger = logging.getLogger(__name__)

SPLITS = ("training", "validation", "test")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class SegEngine:
    """Local engine of one site.

    Args:
        site: site name (for messages and state files).
        datalist: path of the site's decathlon-style datalist (training / validation / test).
        train_config: effective hyper-parameters (``local_epochs``, ``batch_size``, ``learning_rate``,
            ``image_size``, ...); bundle variables among them override the bundle's defaults.
        bundle_dir: the MONAI bundle folder (default: ``bundles/unet2d_seg``).
        device: defaults to CUDA when available, else CPU.
    """

    def __init__(
        self,
        site: str,
        datalist: os.PathLike,
        train_config: Dict[str, Any],
        bundle_dir: Optional[os.PathLike] = None,
        device: Optional[torch.device] = None,
    ):
        self.site = site
        self.train_config = dict(train_config)
        self.device = device or default_device()
        self.seed = int(self.train_config.get("seed", 0))
        set_determinism(seed=self.seed)
        self.parser = load_bundle(bundle_dir, self.train_config)
        self.num_classes = int(self.parser["num_classes"])
        self.data = load_datalist(datalist)
        self.n_train = len(self.data["training"])
        self._train_transform = self.parser.get_parsed_content("train_preprocessing")
        self._eval_transform = self.parser.get_parsed_content("val_preprocessing")
        self._datasets: Dict[Tuple[str, bool], CacheDataset] = {}
        self._optimizers: Dict[int, torch.optim.Optimizer] = {}

    # ----------------------------------------------------------------------------------- components
    def build_network(self) -> nn.Module:
        """A fresh network from the bundle's ``network_def``, on ``self.device``."""
        return self.parser.get_parsed_content("network_def", instantiate=True).to(self.device)

    def build_loss(self) -> nn.Module:
        return self.parser.get_parsed_content("loss", instantiate=True)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The bundle's optimiser for ``model``; kept per model so Adam moments survive across rounds."""
        key = id(model)
        if key not in self._optimizers:
            factory = self.parser.get_parsed_content("optimizer_factory", instantiate=True)
            self._optimizers[key] = factory(model.parameters())
        return self._optimizers[key]

    # ----------------------------------------------------------------------------------------- data
    def _dataset(self, split: str, augment: bool) -> CacheDataset:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        key = (split, augment)
        if key not in self._datasets:
            transform = self._train_transform if augment else self._eval_transform
            # CacheDataset caches everything up to the first random transform: decoding and resizing
            # happen once per process, augmentation every epoch.
            self._datasets[key] = CacheDataset(self.data[split], transform=transform, progress=False, num_workers=0)
        return self._datasets[key]

    def loader(self, split: str, shuffle: bool = False, augment: bool = False, batch_size: Optional[int] = None):
        """DataLoader of dicts ``{"image": (B, C, H, W), "label": (B, 1, H, W) in {0, 1}}``."""
        bs = int(batch_size or self.train_config.get("batch_size", 4))
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(self._dataset(split, augment), batch_size=bs, shuffle=shuffle, num_workers=0, generator=generator)

    # ------------------------------------------------------------------------------------- training
    def train(self, model: nn.Module, objective: ClientObjective, ctx: RoundContext) -> Dict[str, float]:
        """Run ``local_epochs`` epochs of ``objective.loss`` on the training split. Returns ``train_loss``
        (mean over all local iterations) and ``steps``."""
        objective.set_seg_loss(self.build_loss())
        optimizer = self.make_optimizer(model)
        # derived from the round index, so a restarted site resumes the same schedule
        lr = float(self.train_config.get("learning_rate", 1e-3)) * float(self.train_config.get("lr_decay_per_round", 1.0)) ** ctx.round
        for group in optimizer.param_groups:
            group["lr"] = lr
        epochs = int(self.train_config.get("local_epochs", 1))
        augment = bool(self.train_config.get("augment", True))
        losses = []

        def iteration(engine: SupervisedTrainer, batch: Dict[str, torch.Tensor]) -> Dict[str, Any]:
            inputs = batch["image"].to(self.device)
            labels = batch["label"].to(self.device)
            model.train()
            optimizer.zero_grad(set_to_none=True)
            if objective.needs_features:
                logits, features = model.forward_features(inputs)
            else:
                logits, features = model(inputs), {}
            loss = objective.loss(BatchOutput(inputs, labels, logits, features, epoch=engine.state.epoch - 1))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{self.site}: non-finite training loss {loss.item()} at round {ctx.round}")
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            return {"loss": losses[-1]}

        trainer = SupervisedTrainer(
            device=self.device,
            max_epochs=epochs,
            train_data_loader=self.loader("training", shuffle=True, augment=augment),
            network=model,
            optimizer=optimizer,
            loss_function=objective.seg_loss,
            iteration_update=iteration,
            amp=False,
        )
        trainer.run()
        return {"train_loss": float(sum(losses) / max(len(losses), 1)), "steps": float(len(losses))}

    # ----------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def iterate_logits(
        self, model: nn.Module, split: str, with_features: bool = False
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]]:
        """Yield ``(inputs, labels, logits, features)`` over ``split`` in eval mode without gradients."""
        was_training = model.training
        model.eval()
        try:
            for batch in self.loader(split):
                inputs = batch["image"].to(self.device)
                labels = batch["label"].to(self.device)
                if with_features:
                    logits, features = model.forward_features(inputs)
                else:
                    logits, features = model(inputs), {}
                yield inputs, labels, logits, features
        finally:
            model.train(was_training)

    def evaluate(self, model: nn.Module, split: str, metrics: Sequence[str] = ("dice", "hd95", "assd")) -> Dict[str, float]:
        """Mean foreground metrics of ``model`` over the images of ``split``."""
        meter = SegmentationMetrics(self.num_classes, metrics)
        for _, labels, logits, _ in self.iterate_logits(model, split):
            meter.update(logits.argmax(dim=1, keepdim=True).cpu(), labels.cpu())
        return meter.aggregate()
