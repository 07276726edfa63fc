"""What every local engine shares, whatever the task (segmentation, classification).

One engine per site process. A concrete engine (``SegEngine``, ``ClassificationEngine``) adds the data
pipeline, the network, the training loop and the metrics; this base holds the rest, so both behave the
same way where they should:

* the site name, its datalist (the raw JSON's top-level fields in ``datalist_info``) and a copy of the
  server's ``train_config``; determinism seeded from ``train_config["seed"]``;
* the device (CUDA when available, else CPU);
* one optimiser per model object, built once and kept, so Adam moments survive across rounds
  (``train_config["optimizer_state"] = "reset"``: the trained model's optimiser starts each round afresh);
* the per-round learning-rate schedule ``learning_rate * lr_decay_per_round ** round``, derived from
  the round index so a restarted site resumes the same schedule;
* a shuffle generator seeded once per engine (each epoch and round gets a new order, reproducibly);
* the local training loop (:meth:`run_epochs`, an ignite ``SupervisedTrainer``, optionally in mixed precision:
  ``train_config["amp"]``) and its data loaders (:meth:`data_loader`); an engine says only how
  its batches give labels (:meth:`batch_labels`) and how its network gives logits and features
  (:meth:`forward`);
* a site whose training runs as N ranks (``ranks``; ``fedseg.engine.distributed``): rank 0 leads each
  :meth:`run_epochs`, the other ranks join it (:meth:`join_epochs`), the model in ``DistributedDataParallel``;
* differential-privacy switches: ``dp_enabled`` and :meth:`refuse_private_training`, which an engine
  without a DP path calls to fail with a clear message instead of silently training in the clear.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional

import torch
from monai.data import DataLoader
from monai.utils import set_determinism
from torch import nn

from fedseg.config import BUNDLE_DEFAULTED_KEYS, TrainConfig, site_train_config
from fedseg.data.datalist import read_datalist_json
from fedseg.objectives.base import BatchOutput, ClientObjective, RoundContext

if TYPE_CHECKING:  # pragma: no cover
    from monai.engines import SupervisedTrainer

    from fedseg.engine.distributed import RankGroup

SPLITS = ("training", "validation", "test")

#: what a site does with its optimiser's state (Adam moments, step counts) between rounds: "keep" it (NVFlare's
#: learners build the optimiser once) or "reset" it at the start of every round (a fresh local optimiser per
#: round, as in Reddi et al.'s FedOpt experiments)
OPTIMIZER_STATES = ("keep", "reset")

#: the tasks an engine can be built for (``fedseg.engine.factory``)
TASKS = ("segmentation", "classification")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def backward_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: Optional["torch.amp.GradScaler"] = None) -> None:
    """The loss's backward pass and one optimiser step; with a float16 ``scaler``, the loss scaled and the step taken
    through it (torch's AMP recipe)."""
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def channel_moments(images: Iterable[torch.Tensor]) -> "tuple[torch.Tensor, torch.Tensor]":
    """Per-channel mean and standard deviation ``(C,)`` over every pixel of ``images``, each ``(C, *spatial)``
    (summed in float64, one image at a time).

    Raises:
        ValueError: no image.
    """
    total = total_sq = None
    count = 0
    for image in images:
        x = torch.as_tensor(image, dtype=torch.float64).flatten(1)
        total = x.sum(1) if total is None else total + x.sum(1)
        total_sq = (x * x).sum(1) if total_sq is None else total_sq + (x * x).sum(1)
        count += x.shape[1]
    if not count:
        raise ValueError("no image to take channel statistics of")
    mean = total / count
    return mean.float(), (total_sq / count - mean * mean).clamp_min(0).sqrt().float()


class LocalEngine(ABC):
    """Base of the site engines.

    Args:
        site: site name (for messages and state files).
        datalist: path of the site's datalist JSON (or the folder holding ``datalist.json``); None where the data come
            from a user's bundle (``BundleEngine``).
        train_config: effective hyper-parameters sent by the server (copied; engines add resolved keys).
        device: defaults to CUDA when available, else CPU.
        dp_seed: seeds DP-SGD's generators (tests only; engines with a DP path use it).

    Subclasses set ``n_train`` and implement :meth:`_dataset`, :meth:`build_network`,
    :meth:`_optimizer_factory`, ``train``, ``evaluate`` and :meth:`validation_metrics`.
    """

    #: the task this engine serves (``TASKS``)
    task: str = ""

    def __init__(
        self,
        site: str,
        datalist: Optional[os.PathLike],
        train_config: Dict[str, Any],
        device: Optional[torch.device] = None,
        dp_seed: Optional[int] = None,
    ):
        self.site = site
        self.train_config = dict(train_config)
        #: the typed form of ``train_config`` (``fedseg.config.TrainConfig``), kept in step by :meth:`update_train_config`
        self.config: TrainConfig = site_train_config(self.train_config)
        self.device = device or default_device()
        self.seed = self.config.training.seed
        set_determinism(seed=self.seed)
        # a user's bundle reads its own data (dataset_dir): no datalist
        self.datalist_path, self.datalist_info = read_datalist_json(datalist) if datalist is not None else (None, {})
        self.n_train = 0
        self._optimizers: Dict[int, torch.optim.Optimizer] = {}
        self._shuffle_generator = torch.Generator().manual_seed(self.seed)
        self.dp_seed = dp_seed
        #: the site's ranks when its local training runs as N processes (``fedseg.engine.distributed``); None: one
        self.ranks: Optional["RankGroup"] = None

    def update_train_config(self, values: Dict[str, Any], bundle_variables: Optional[Dict[str, Any]] = None) -> None:
        """Record settings the engine resolved (``values``) in ``train_config`` and rebuild :attr:`config` from it
        (``bundle_variables``: the bundle's values of the keys ``train_config`` leaves unset,
        ``fedseg.config.site_train_config``)."""
        self.train_config.update(values)
        self.config = site_train_config(self.train_config, bundle_variables)
        for key in BUNDLE_DEFAULTED_KEYS:  # recorded as the engine uses them (the site client reads train_config)
            if bundle_variables is not None and key in bundle_variables:
                self.train_config.setdefault(key, bundle_variables[key])

    # ----------------------------------------------------------------------------------- components
    @abstractmethod
    def build_network(self) -> nn.Module:
        """A fresh network for this site's task, on ``self.device``."""

    @abstractmethod
    def _optimizer_factory(self) -> Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]:
        """``parameters -> optimiser`` (the learning rate is reset each round by :meth:`prepare_optimizer`)."""

    @property
    def shuffle_generator(self) -> torch.Generator:
        """The generator behind every loader's order (``fedseg.engine.site_state`` persists it)."""
        return self._shuffle_generator

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The engine's optimiser for ``model``; kept per model so Adam moments survive across rounds."""
        key = id(model)
        if key not in self._optimizers:
            self._optimizers[key] = self._optimizer_factory()(model.parameters())
        return self._optimizers[key]

    def round_learning_rate(self, round_: int) -> float:
        """``learning_rate * lr_decay_per_round ** round`` (train_config)."""
        training = self.config.training
        return training.learning_rate * training.lr_decay_per_round ** int(round_)

    def prepare_optimizer(self, model: nn.Module, ctx: RoundContext) -> torch.optim.Optimizer:
        """``make_optimizer(model)`` with this round's learning rate set on every parameter group; its state
        emptied first when ``train_config["optimizer_state"]`` is ``"reset"`` (default ``"keep"``).

        Raises:
            ValueError: an ``optimizer_state`` other than ``OPTIMIZER_STATES``.
        """
        mode = self.config.training.optimizer_state
        if mode not in OPTIMIZER_STATES:
            raise ValueError(f"train_config['optimizer_state'] must be one of {OPTIMIZER_STATES}, got {mode!r}")
        optimizer = self.make_optimizer(model)
        if mode == "reset":
            optimizer.state.clear()  # the next step starts Adam's moments and bias correction from zero
        lr = self.round_learning_rate(ctx.round)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return optimizer

    def local_epochs(self, epochs: Optional[int] = None) -> int:
        """``epochs`` when given, else ``train_config["local_epochs"]``."""
        return int(self.config.schedule.local_epochs if epochs is None else epochs)

    # ----------------------------------------------------------------------------------------- data
    @abstractmethod
    def _dataset(self, split: str, train: bool):
        """The (cached) MONAI dataset of ``split`` with the training or the evaluation transforms."""

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")

    def loader(self, split: str, shuffle: bool = False, train: bool = False, batch_size: Optional[int] = None):
        """``train=True``: the training pipeline in batches of ``batch_size`` (default
        ``train_config["batch_size"]``); ``train=False``: one item at a time. The batch contents are
        the subclass's (see its ``loader`` docstring)."""
        bs = int(batch_size or self.config.training.batch_size) if train else 1
        return self.data_loader(self._dataset(split, train), bs, shuffle, train)

    @property
    def drop_last(self) -> bool:
        """Whether training epochs drop their last incomplete batch (``train_config["drop_last"]``)."""
        return bool(self.config.training.drop_last)

    def data_loader(self, dataset, batch_size: int, shuffle: bool, train: bool, sampler=None) -> DataLoader:
        """A MONAI ``DataLoader`` over ``dataset``: one seeded generator per engine (each epoch and round gets a
        new, reproducible order); training loaders get ``train_config["num_workers"]`` worker processes, drop
        their last incomplete batch with ``train_config["drop_last"]``, and pinned memory when the engine runs
        on CUDA. ``sampler``: the items and their order instead of ``shuffle`` (a rank's share of a site's
        training, ``fedseg.engine.distributed``)."""
        if train and self.drop_last and len(dataset) < batch_size:
            raise ValueError(f"{self.site}: {len(dataset)} training images, fewer than batch_size {batch_size} with drop_last: "
                             "every batch would be dropped and the site would not train; lower batch_size or set drop_last false")
        workers = self.config.runtime.num_workers if train else 0
        if workers < 0:
            raise ValueError(f"train_config['num_workers'] must be >= 0, got {workers}")
        # MONAI's DataLoader (num_workers 0) seeds the dataset's random transforms from the generator, then resets the
        # generator to its initial seed: every round would replay the first round's orders. Undo both
        state = self._shuffle_generator.get_state()
        loader = DataLoader(
            dataset, batch_size=batch_size, shuffle=shuffle and sampler is None, sampler=sampler, num_workers=workers,
            generator=self._shuffle_generator,
            pin_memory=self.device.type == "cuda", persistent_workers=workers > 0, drop_last=train and self.drop_last,
        )
        # its transforms' seed came from the current state (which every epoch advances): the loader with workers, which
        # MONAI leaves alone, and this one start from the same state
        self._shuffle_generator.set_state(state)
        return loader

    def training_batches(self):
        """What one epoch of local training iterates: the training loader (shuffled); an engine may hand batches
        held on the device instead (``SegEngine``: ``fedseg.engine.resident``)."""
        return self.loader("training", shuffle=True, train=True)

    def autocast_dtype(self) -> Optional[torch.dtype]:
        """The mixed-precision dtype of training (``train_config["amp"]``: None, "bfloat16" or "float16").

        Raises:
            ValueError: an unknown name, float16 without CUDA (CPU autocast is bfloat16 only), or AMP together
                with DP-SGD (per-sample clipping is calibrated in float32).
        """
        name = self.config.runtime.amp
        if not name:
            return None
        dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16}
        if name not in dtypes:
            raise ValueError(f"train_config['amp'] must be None, 'bfloat16' or 'float16', got {name!r}")
        if name == "float16" and self.device.type != "cuda":
            raise ValueError(f"{self.site}: amp='float16' needs a CUDA device (this site runs on {self.device}); use 'bfloat16'")
        if self.dp_enabled:
            raise ValueError(f"{self.site}: amp cannot be combined with differential privacy (dp_target_epsilon)")
        return dtypes[name]

    # ------------------------------------------------------------------------------------- privacy
    @property
    def dp_enabled(self) -> bool:
        """Whether local training must be DP-SGD (``train_config["dp_target_epsilon"]`` is set)."""
        return self.config.privacy.dp_target_epsilon is not None

    def refuse_private_training(self, reason: str) -> None:
        """Raise when DP is requested of an engine that cannot provide it: training in the clear while
        the operator believes the weights are private would be worse than not training."""
        if self.dp_enabled:
            raise ValueError(
                f"{self.site}: differential privacy (train_config['dp_target_epsilon']="
                f"{self.train_config['dp_target_epsilon']}) is not supported by the {self.task} engine: {reason}"
            )

    # ----------------------------------------------------------------------------------- evaluation
    @abstractmethod
    def validation_metrics(self, model: nn.Module) -> Dict[str, float]:
        """The scalar validation metrics a site sends with its trained weights (``val_*``)."""

    @abstractmethod
    def evaluate(self, model: nn.Module, split: str, per_image: bool = False):
        """Mean metrics of ``model`` on ``split``; ``(means, rows)`` with ``per_image`` (rows stay at the site)."""

    def save_evaluation_figures(self, model: nn.Module, output_dir: os.PathLike, model_name: str) -> None:
        """Site-local figures of an evaluation (written into the site's workspace, never sent). Default: none."""

    @abstractmethod
    def train(self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, epochs: Optional[int] = None) -> Dict[str, float]:
        """``epochs`` (default ``local_epochs``) epochs of ``objective`` on the training split; returns at
        least ``train_loss`` and ``steps``."""

    # ------------------------------------------------------------------------------ the training loop
    def batch_labels(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """The labels of a training batch on the device (masks ``(B, 1, H, W)`` by default)."""
        return batch["label"].to(self.device)

    def forward(self, model: nn.Module, inputs: torch.Tensor, with_features: bool):
        """``(logits, features)``: ``model.forward_features`` when the objective needs features, else ``{}``."""
        if with_features:
            return model.forward_features(inputs)
        return model(inputs), {}

    def run_epochs(
        self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, optimizer: torch.optim.Optimizer, epochs: int
    ) -> Dict[str, float]:
        """``epochs`` epochs of ``objective.loss`` over the training loader with ``optimizer``; returns
        ``train_loss`` (mean over iterations) and ``steps``. A non-finite loss stops training with an error.

        With ``ranks`` set (a site training as N ranks, rank 0 here): the other ranks join these epochs and each
        trains on its share of every global batch in ``DistributedDataParallel`` (``fedseg.engine.distributed``);
        ``train_loss`` is then the mean over the ranks."""
        if self.ranks is None:
            return self._epochs(model, objective, ctx, optimizer, epochs, self.training_batches())
        return self._lead_rank_epochs(model, objective, ctx, optimizer, epochs)

    def _lead_rank_epochs(
        self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, optimizer: torch.optim.Optimizer, epochs: int
    ) -> Dict[str, float]:
        """Rank 0: send the epochs' inputs to the other ranks, train with them, merge what the objective recorded."""
        from fedseg.engine.distributed import EPOCHS, RanksOutOfStep, without_hooks

        ranks = self.ranks
        if ranks.world_size > 1:
            # one serialisation: the objective's references to the model's parameters (a regulariser) and the
            # optimiser's to the same parameters arrive as references to the receiving rank's copy
            with without_hooks(model):
                ranks.send(EPOCHS, {"model": model, "optimizer": optimizer, "objective": objective, "ctx": ctx,
                                    "epochs": epochs, "generator": self.shuffle_generator.get_state()})
        try:
            metrics = self._rank_epochs(model, objective, ctx, optimizer, epochs)
            if ranks.world_size > 1:
                objective.merge_rank_records(ranks.gather(objective.rank_records())[1:])
        except Exception as e:  # the other ranks may wait in a collective this rank will never reach
            raise RanksOutOfStep(f"{self.site}: local training failed on rank 0 with {type(e).__name__}") from e
        return metrics

    def join_epochs(self, payload: Dict[str, Any]) -> None:
        """Ranks 1..N-1: train rank 0's ``run_epochs`` on this rank's share (``fedseg.engine.distributed.follow``)."""
        model, optimizer, objective = payload["model"], payload["optimizer"], payload["objective"]
        self._shuffle_generator.set_state(payload["generator"].cpu())
        objective.begin_rank_epochs(model)
        self._rank_epochs(model, objective, payload["ctx"], optimizer, int(payload["epochs"]))
        self.ranks.gather(objective.rank_records())

    def _rank_epochs(
        self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, optimizer: torch.optim.Optimizer, epochs: int
    ) -> Dict[str, float]:
        """Every rank: this rank's share of ``epochs`` epochs (per-rank batch ``batch_size / N``), model in DDP."""
        from fedseg.engine.distributed import EngineForward

        ranks = self.ranks
        dataset = self._dataset("training", True)
        # every rank holds the same generator state: one seed, one permutation per epoch, dealt to the ranks
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self._shuffle_generator))
        sampler = ranks.sampler(dataset, seed)
        batch = ranks.per_rank_batch(self.config.training.batch_size)
        if self.drop_last and len(sampler) < batch:
            raise ValueError(f"{self.site}: {len(sampler)} training images per rank, fewer than the per-rank batch {batch} "
                             "with drop_last: no rank would train")
        loader = self.data_loader(dataset, batch, shuffle=False, train=True, sampler=sampler)
        with ranks.sync_batchnorm(model):
            network = ranks.wrap(EngineForward(self, model))
            metrics = self._epochs(model, objective, ctx, optimizer, epochs, loader, network)
        metrics["train_loss"] = ranks.mean(metrics["train_loss"])
        return metrics

    def _epochs(
        self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, optimizer: torch.optim.Optimizer, epochs: int,
        loader: DataLoader, network: Optional[nn.Module] = None,
    ) -> Dict[str, float]:
        """The training loop over ``loader``; ``network(inputs, with_features)`` runs the forward pass when given
        (a DDP wrapper of ``model``), else :meth:`forward`."""
        losses: List[torch.Tensor] = []
        amp = self.autocast_dtype()
        # float16 gradients underflow without loss scaling; bfloat16 has float32's range and needs none
        scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
        layout = self.memory_format()
        # the loss is read back once per epoch, not per step: a per-step read makes the host wait for the device
        # every step, and a device that finishes one step before the host has queued the next idles
        checked = [0]

        def check_losses() -> None:
            if len(losses) > checked[0]:
                recent = torch.stack(losses[checked[0]:])
                checked[0] = len(losses)
                if not bool(torch.isfinite(recent).all()):
                    bad = float(recent[~torch.isfinite(recent)][0])
                    raise FloatingPointError(f"{self.site}: non-finite training loss {bad} at round {ctx.round}")

        def iteration(engine: SupervisedTrainer, batch: Dict[str, torch.Tensor]) -> Dict[str, Any]:
            labels = self.batch_labels(batch)
            # patch mode: each patch carries its whole image's channel statistics (ChannelStatisticsd)
            source = (batch["image_mean"].to(self.device), batch["image_std"].to(self.device)) if "image_mean" in batch else None
            images = batch["image"].to(self.device, non_blocking=True)
            if layout is not None:
                images = images.contiguous(memory_format=layout)
            inputs = objective.prepare_inputs(images, labels, source)
            model.train()
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=self.device.type, dtype=amp or torch.float32, enabled=amp is not None):
                if network is None:
                    logits, features = self.forward(model, inputs, objective.needs_features)
                else:
                    logits, features = network(inputs, objective.needs_features)
                loss = objective.loss(BatchOutput(inputs, labels, logits, features, epoch=engine.state.epoch - 1))
            if self.device.type == "cpu" and not torch.isfinite(loss):  # on the CPU reading it costs nothing
                raise FloatingPointError(f"{self.site}: non-finite training loss {loss.item()} at round {ctx.round}")
            backward_step(loss, optimizer, scaler)
            objective.after_step(model, optimizer)  # e.g. SCAFFOLD's control-variate correction
            losses.append(loss.detach())
            return {"loss": losses[-1]}

        trainer = self.trainer(model, objective, optimizer, loader, epochs, iteration)
        from ignite.engine import Events

        trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda _: check_losses())
        if layout is not None:
            model.to(memory_format=layout)
        try:
            trainer.run()
        finally:
            if layout is not None:
                model.to(memory_format=torch.contiguous_format)
        check_losses()
        values = torch.stack(losses).tolist() if losses else []  # one read-back for the whole round
        return {"train_loss": float(sum(values) / max(len(values), 1)), "steps": float(len(values))}

    def trainer(self, model: nn.Module, objective: ClientObjective, optimizer: torch.optim.Optimizer, loader: Iterable,
                epochs: int, iteration: Callable[["SupervisedTrainer", Any], Dict[str, Any]]) -> "SupervisedTrainer":
        """MONAI's ``SupervisedTrainer`` (an ignite engine) running ``iteration(engine, batch)`` over ``loader`` for
        ``epochs`` epochs: the step itself (forward, the objective's loss, backward, optimiser step) is ``iteration``'s,
        so MONAI's own AMP stays off."""
        from monai.engines import SupervisedTrainer

        return SupervisedTrainer(
            device=self.device,
            max_epochs=epochs,
            train_data_loader=loader,
            network=model,
            optimizer=optimizer,
            loss_function=objective.seg_loss,
            iteration_update=iteration,
            amp=False,
        )

    def memory_format(self) -> Optional[torch.memory_format]:
        """``torch.channels_last`` with ``train_config["channels_last"]`` (2-D networks; the network is converted for
        the epochs only, so weights leave the site and meet other code contiguous), else None."""
        return torch.channels_last if self.config.runtime.channels_last else None
