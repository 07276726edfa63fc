"""The one local training / evaluation engine every method runs on.

Training is MONAI's ``SupervisedTrainer`` (an ignite engine) with a custom iteration that asks the
method's ``ClientObjective`` for the loss, so methods change *what* is optimised, never *how* the loop
runs. Network, transforms, loss and optimiser come from the MONAI bundle; hyper-parameters from the
server's ``train_config``; evaluation in ``fedseg.engine.evaluation``. The contract objectives rely on: the
``WindowSampledEngine`` protocol of ``fedseg.engine.api``.

Differential privacy (``train_config["dp_target_epsilon"]`` set; ``None`` = off, the default)
--------------------------------------------------------------------------------------------
Local training becomes Opacus DP-SGD, for every method alike (glue in ``privacy.py``):

* **Private**: the objective's data term ``objective.data_loss(batch)`` (for most methods the whole
  ``loss``). Batches are Poisson-sampled (rate ``1 / ceil(N / batch_size)``); each sample's gradient of
  the data term is clipped to ``dp_max_grad_norm``; Gaussian noise of std ``noise_multiplier *
  dp_max_grad_norm`` is added to the sum. The noise multiplier is calibrated once per job
  (``privacy.calibrated_noise_multiplier``, Opacus' search) so that ``total_rounds * local_epochs``
  local epochs spend exactly the budget ``(dp_target_epsilon, dp_delta)`` (PRV accountant); the
  accountant spans all rounds (and survives a site restart through ``ctx.state_dir``).
* **Not privatised, and why**: ``objective.parameter_loss(model)``, a term that depends only on the
  current weights and on information the server sent (GraphFedSeg's similarity regulariser). It reads
  no training record, so its exact gradient is added *after* clipping and noise — post-processing, no
  budget spent. Whatever the server sends is outside this site's guarantee (it is not this site's data).
* **Reported**: ``dp_epsilon`` = epsilon spent so far by this site's weights release, at ``dp_delta``
  (``accountant.get_epsilon(dp_delta)``; reaches at most ``dp_target_epsilon`` after the planned rounds)
  and ``dp_delta``, as train metrics.
* **Not covered by the epsilon**: everything else computed from the training data and sent besides the
  weights — ``train_loss``, the objective's declared statistics (e.g. GraphFedSeg's uncertainty U_i) —
  and ``val_dice`` (validation split). The guarantee also assumes ``data_loss`` is a mean of per-image
  terms (true for DiceCE with ``batch=False``, FVAC's and FedEvi's losses): a term mixing images of a
  batch would make per-sample clipping meaningless.
* The model stays the plain network: Opacus' hooks are attached to it (``wrap_model=False``) only
  inside ``train``; its ``state_dict`` keys and parameter tensors are unchanged.

With DP off the training loop is exactly the one without the feature (``objective.loss`` as before).
"""

from __future__ import annotations

import logging
import math
import os
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from monai.data import CacheDataset
from monai.engines import SupervisedTrainer
from torch import nn

from fedseg.bundle import bundle_for_task, load_bundle
from fedseg.config import BUNDLE_DEFAULTED_KEYS, check_training_options
from fedseg.data.datalist import load_datalist
from fedseg.data.labels import resolve_patch_sampler, site_label_space
from fedseg.data.transforms import resize_scores
from fedseg.engine.base import SPLITS, LocalEngine, channel_moments, default_device
from fedseg.engine.cache import CacheBudget, SiteDataset
from fedseg.engine.evaluation import SegmentationEvaluation
from fedseg.engine.spatial import WholeImagePredictor, check_patch_size, resolve_spatial_settings
from fedseg.engine.volume import invert_to_scan, plain
from fedseg.uncertainty.window_sample import SampledImage, crop_windows, sample_generator, sample_windows, window_cell_size
from fedseg.objectives.base import BatchOutput, ClientObjective, RoundContext

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.privacy import PrivateTraining

logger = logging.getLogger(__name__)

__all__ = ["SegEngine", "SPLITS", "default_device"]


class SegEngine(LocalEngine):
    """Local segmentation engine of one site (shared parts: ``fedseg.engine.base.LocalEngine``).

    Spatial mode (``resize`` or native-resolution ``patch``; ``fedseg.engine.spatial``) is the config's
    ``spatial_mode`` where set, else the datalist's. Training batches are ``batch_size`` images, each
    giving ``patch_samples`` patches in patch mode; evaluation runs image by image on the whole image
    (sliding window in patch mode) and scores at the image's own size. Decoded images are cached once per
    process up to ``cache_max_mb`` (``fedseg.engine.cache``); the rest are decoded on each access.

    Args:
        site: site name (for messages and state files).
        datalist: path of the site's decathlon-style datalist (training / validation / test).
        train_config: effective hyper-parameters (``local_epochs``, ``batch_size``, ``learning_rate``,
            ``image_size``, ...); bundle variables among them override the bundle's defaults.
        bundle_dir: the MONAI bundle folder (default: ``train_config["bundle"]``, else ``bundles/unet2d_seg``).
        device: defaults to CUDA when available, else CPU.
        dp_seed: seeds DP-SGD's sampling and noise generators — for tests only. ``None`` (default)
            draws them from OS entropy, as a deployment must: noise derived from a seed the server
            knows (``train_config["seed"]``) could be subtracted.
    """

    def __init__(
        self,
        site: str,
        datalist: os.PathLike,
        train_config: Dict[str, Any],
        bundle_dir: Optional[os.PathLike] = None,
        device: Optional[torch.device] = None,
        dp_seed: Optional[int] = None,
    ):
        super().__init__(site, datalist, train_config, device=device, dp_seed=dp_seed)
        check_training_options(self.train_config)
        self.data = load_datalist(datalist)
        self.update_train_config(resolve_spatial_settings(self.train_config, self.datalist_info, f"({site}: {datalist})"))
        # the site's classes must be the job's (fedseg.data.labels); the stored encoding is the site's own
        self.label_space = site_label_space(self.train_config, self.datalist_info, f"site {site}'s datalist {self.datalist_path}")
        self.update_train_config({"num_classes": self.label_space.num_classes})
        self.update_train_config({"patch_sampler": resolve_patch_sampler(self.train_config, self.label_space)})
        #: the data are CT / MR volumes (3-D patches or slices; fedseg.data.volumes)
        self.volumes = self.config.volume.spatial_dims == 3
        if self.volumes:
            self._prepare_volumes(site)
        if self.dp_enabled and self.config.spatial.spatial_mode == "patch" and self.config.spatial.patch_samples != 1:
            # DP-SGD clips per sample: with k patches per image one image would be k "samples" and the
            # accounted epsilon would be wrong. One patch per Poisson-drawn image keeps the unit the image.
            logger.info("%s: DP-SGD in patch mode draws one patch per image (patch_samples=1)", site)
            self.update_train_config({"patch_samples": 1})
        self.parser = load_bundle(bundle_dir or bundle_for_task(self.train_config), self.train_config)
        if self.volumes and "target_spacing" not in self.parser:
            raise ValueError(f"{site}: the bundle {self.parser['bundle_root']} is 2-D; volumes need a volume bundle "
                             "(bundles/volume_seg). FedEFM's downstream UNETR is 2-D only.")
        # the bundle's own patch and sliding-window settings where the job leaves them unset
        self.update_train_config({}, bundle_variables={key: self.parser[key] for key in BUNDLE_DEFAULTED_KEYS})
        check_patch_size(self.config, len(self.parser["channels"]))
        self.spatial_mode: str = self.config.spatial.spatial_mode
        spatial = self.config.spatial
        if self.volumes:
            logger.info("%s: volumes, spatial mode %s, patches %s voxels x %s per volume, target spacing %s mm, %s",
                        site, self.spatial_mode, self.parser.get_parsed_content("crop_size"), spatial.patch_samples,
                        self.config.volume.target_spacing, self.config.volume.modality)
        else:
            logger.info(
                "%s: spatial mode %s (%s), rescale %s", site, self.spatial_mode,
                f"patches {spatial.patch_size} px x {spatial.patch_samples} per image"
                if self.spatial_mode == "patch" else f"images resized to {self.config.network.image_size} px",
                spatial.rescale,
            )
        self.num_classes = int(self.parser["num_classes"])
        self.n_train = len(self.data["training"])
        self._train_transform = self.parser.get_parsed_content("train_preprocessing")
        self._eval_transform = self.parser.get_parsed_content("val_preprocessing")
        self.predictor = WholeImagePredictor(self.config)
        self.cache = CacheBudget(self.config.cache.cache_max_mb, int(self.parser["in_channels"]))
        self._datasets: Dict[Tuple[str, bool], CacheDataset] = {}
        self._grid_shapes: Dict[str, List[Tuple[int, ...]]] = {}
        self._private: Dict[int, "PrivateTraining"] = {}
        #: the training split held on the device (fedseg.engine.resident); None = not decided yet, False = the loader
        self._resident: Any = None
        #: test metrics, the validation Dice and the site's figures (``fedseg.engine.evaluation``)
        self.evaluation = SegmentationEvaluation(self)

    def _prepare_volumes(self, site: str) -> None:
        """Volume jobs: every entry's image and label share one geometry and the declared channels (headers only), the
        network's input channels are the volumes' (``image_channels``, else 1), and slice mode may centre patches on
        foreground slices only (FedEvi's prostate setting)."""
        from fedseg.data.volumes import check_volume_pair

        names = self.config.volume.image_channels
        expected = len(names) if names else 1
        if int(self.train_config.get("in_channels") or expected) != expected:
            raise ValueError(f"{site}: the job's in_channels={self.train_config['in_channels']} but its volumes have {expected} "
                             f"channel(s) ({names or 'one volume per file'}); set in_channels={expected}")
        self.update_train_config({"in_channels": expected})
        for split, entries in self.data.items():
            for i, e in enumerate(entries):
                try:
                    check_volume_pair(e["image"], e["label"], names)
                except ValueError as exc:
                    raise type(exc)(f"{exc} ({split}[{i}] of {self.datalist_path})") from exc
        if self.config.volume.slice_foreground_only:
            if self.config.spatial.spatial_mode != "slices":
                raise ValueError(f"{site}: slice_foreground_only needs spatial_mode 'slices'")
            # patch centres on foreground voxels only: every training slice shows the structure
            self.update_train_config({"patch_neg": 0.0, "patch_ratios": [0.0] + [1.0] * (self.label_space.num_classes - 1)})

    # ----------------------------------------------------------------------------------- components
    def build_network(self) -> nn.Module:
        """A fresh network from the bundle's ``network_def``, on ``self.device``."""
        # lazy=False: the parser would otherwise hand back the instance it built on the first call
        return self.parser.get_parsed_content("network_def", instantiate=True, lazy=False).to(self.device)

    def build_loss(self) -> nn.Module:
        return self.parser.get_parsed_content("loss", instantiate=True)

    def _optimizer_factory(self):
        """The bundle's ``optimizer_factory`` (``make_optimizer`` keeps one optimiser per model)."""
        return self.parser.get_parsed_content("optimizer_factory", instantiate=True)

    # ----------------------------------------------------------------------------------------- data
    def _dataset(self, split: str, train: bool) -> CacheDataset:
        self._check_split(split)
        key = (split, train)
        if key not in self._datasets:
            transform = self._train_transform if train else self._eval_transform
            entries = self.data[split]
            # only image/label (and, for evaluation, a FOV every entry of the split has) go through the
            # transforms: optional extras differ between datalists and would break pooled collation
            keys = ("image", "label") + (("fov",) if not train and all("fov" in e for e in entries) else ())
            items = self._items(entries, keys)
            if self.spatial_mode == "patch" and any("rescale" in e for e in entries):
                # a pooled datalist states each data set's factor per entry (fedseg.data.transforms.Rescaled)
                for item, e in zip(items, entries):
                    item["rescale"] = float(e.get("rescale", self.config.spatial.rescale))
            # CacheDataset caches everything up to the first random transform (decoding, resizing or
            # rescaling) once per process, within the site's memory budget; patches and augmentation
            # are drawn afresh every epoch
            cache_num = self.cache.reserve(items, self.config, train)
            # training items beyond the budget may be kept decoded on local disk (train_config cache_dir)
            self._datasets[key] = SiteDataset(items, transform, cache_num, self.config.cache.cache_dir if train else None,
                                              self.train_config)
        return self._datasets[key]

    def _items(self, entries: Sequence[Dict[str, Any]], keys: Sequence[str]) -> List[Dict[str, Any]]:
        """The transform inputs of datalist entries: their ``keys``, plus the stored mask encoding each label is
        decoded with (``label_values``, which ``load_datalist`` puts in every entry of a datalist that declares
        them; absent for class-index and binary masks)."""
        return [{k: e[k] for k in tuple(keys) + (("label_values",) if "label_values" in e else ())} for e in entries]

    def training_batches(self):
        """One epoch's training batches: held on the device and augmented there (``fedseg.engine.resident``) where
        the site's training split is wholly cached and its random transforms have a batch form, else the per-sample
        loader. Decided once per engine; ``train_config["resident_data"] = False`` keeps the loader."""
        if self._resident is False:
            return super().training_batches()
        if self._resident is None:
            from fedseg.engine.resident import resident_training_data

            dataset = self._dataset("training", True)
            if self.drop_last and len(dataset) < self.config.training.batch_size:
                return super().training_batches()  # the loader's own check names the problem
            self._resident = resident_training_data(dataset, self.device, self.config, self.num_classes) or False
            if self._resident is False:
                return super().training_batches()
            logger.info("%s: %d training images held on %s (%.0f MB%s), batches augmented there", self.site, self._resident.n,
                        self._resident.store_device, self._resident.nbytes / 2**20, ", pinned" if self._resident.pinned else "")
        from fedseg.engine.resident import ResidentLoader

        return ResidentLoader(self._resident, self.shuffle_generator)

    def loader(self, split: str, shuffle: bool = False, train: bool = False, batch_size: Optional[int] = None):
        """``train=True``: the training pipeline (random patches in patch mode, augmentation when
        ``augment``), batches of ``{"image": (B*k, C, P, P), "label": (B*k, 1, P, P)}`` (k = ``patch_samples``
        in patch mode, P = ``patch_size``; k = 1 and P = ``image_size`` in resize mode).
        ``train=False``: whole images one at a time, ``{"image": (1, C, h, w)`` on the network's grid,
        ``"label": (1, 1, H, W)`` (and ``"fov"``) at the image's own size ``}``."""
        return super().loader(split, shuffle=shuffle, train=train, batch_size=batch_size)

    # ------------------------------------------------------------------------------------- privacy

    def private_training(self, model: nn.Module, ctx: RoundContext) -> "PrivateTraining":
        """The Opacus state of ``model`` (privacy engine, DP optimiser, Poisson loader), built on first use
        and kept for the job: its accountant composes every round. Budget planned for
        ``ctx.total_rounds * local_epochs`` epochs."""
        if not self.dp_enabled:
            raise RuntimeError("differential privacy is off (train_config['dp_target_epsilon'] is None)")
        key = id(model)
        if key not in self._private:
            from fedseg.engine.privacy import PrivateTraining  # Opacus is imported only when DP is on

            privacy = self.config.privacy
            epochs = int(ctx.total_rounds) * self.config.schedule.local_epochs
            self._private[key] = PrivateTraining(
                model,
                self.make_optimizer(model),
                self._dataset("training", train=True),
                batch_size=self.config.training.batch_size,
                target_epsilon=privacy.dp_target_epsilon,
                delta=privacy.dp_delta,
                epochs=epochs,
                max_grad_norm=privacy.dp_max_grad_norm,
                seed=self.dp_seed,
                device=self.device,
            )
        private = self._private[key]
        private.restore(ctx.state_dir, ctx.round)
        return private

    # ------------------------------------------------------------------------------------- training
    def train(
        self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, epochs: Optional[int] = None
    ) -> Dict[str, float]:
        """Run ``epochs`` (default ``local_epochs``) epochs of ``objective.loss`` on the training split. Returns ``train_loss``
        (mean over all local iterations) and ``steps``; with DP on (module docstring) DP-SGD on
        ``objective.data_loss`` + ``objective.parameter_loss``, and also ``dp_epsilon`` / ``dp_delta``."""
        objective.set_seg_loss(self.build_loss())
        optimizer = self.prepare_optimizer(model, ctx)
        epochs = self.local_epochs(epochs)
        if self.dp_enabled:
            if self.ranks is not None and self.ranks.world_size > 1:
                # Opacus accounts one process's Poisson sampling; sharding it over ranks is not that mechanism
                raise ValueError(f"{self.site}: differential privacy (dp_target_epsilon) needs one training process; "
                                 f"this site trains as {self.ranks.world_size} ranks (site_ranks)")
            return self._train_private(model, objective, ctx, epochs)
        return self.run_epochs(model, objective, ctx, optimizer, epochs)

    def _train_private(self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, epochs: int) -> Dict[str, float]:
        """``train`` with DP-SGD: same trainer, Poisson batches, privatised data term (module docstring)."""
        _check_dp_objective(objective)
        private = self.private_training(model, ctx)
        losses = []
        steps = [0]

        def iteration(engine: SupervisedTrainer, batch) -> Dict[str, Any]:
            labels = batch[1].to(self.device)
            inputs = batch[0].to(self.device)
            if inputs.shape[0] > 0:
                inputs = objective.prepare_inputs(inputs, labels)
            model.train()
            private.zero_grad()
            data_loss: Optional[torch.Tensor] = None
            if inputs.shape[0] == 0:  # Poisson sampling drew nobody: a noise-only step
                private.empty_batch()
            else:
                if objective.needs_features:
                    logits, features = model.forward_features(inputs)
                else:
                    logits, features = model(inputs), {}
                data_loss = objective.data_loss(BatchOutput(inputs, labels, logits, features, epoch=engine.state.epoch - 1))
                data_loss.backward()  # per-sample gradients land in p.grad_sample (Opacus hooks)
            parameter_loss = objective.parameter_loss(model)
            total = sum(float(t.detach()) for t in (data_loss, parameter_loss) if t is not None)
            if not math.isfinite(total):
                raise FloatingPointError(f"{self.site}: non-finite training loss {total} at round {ctx.round}")
            private.step(parameter_loss)
            objective.after_step(model, private.optimizer)  # post-processing of the private step
            steps[0] += 1
            if data_loss is not None:
                losses.append(total)
            return {"loss": total}

        with private.training():
            self.trainer(model, objective, private.optimizer, private.data_loader, epochs, iteration).run()
        private.save(ctx.state_dir, ctx.round)
        return {
            "train_loss": float(sum(losses) / max(len(losses), 1)),
            "steps": float(steps[0]),
            "dp_epsilon": private.epsilon,
            "dp_delta": private.delta,
        }

    # ----------------------------------------------------------------------------------- statistics
    @torch.no_grad()
    def intensity_statistics(self, split: str = "training") -> Tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and standard deviation ``(C_in,)`` of the network's input intensities over
        every pixel of every image of ``split`` (whole images after the evaluation preprocessing). Images
        are decoded one at a time, outside the cache."""
        from monai.data import Dataset

        entries = self.data[split]
        if not entries:
            raise ValueError(f"{self.site}: split {split!r} is empty")
        dataset = Dataset(self._items(entries, ("image", "label")), transform=self._eval_transform)
        return channel_moments(plain(item["image"]) for item in dataset)

    # ----------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def predict(self, model: nn.Module, inputs: torch.Tensor, with_features: bool = False):
        """Class scores of whole images on the network's grid: ``(B, C, h, w) -> (B, num_classes, h, w)``
        (sliding window in patch mode); ``(logits, features)`` with ``with_features``."""
        return self.predictor(model, inputs, with_features)

    @torch.no_grad()
    def iterate_logits(
        self, model: nn.Module, split: str, with_features: bool = False, network_grid: bool = False
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]]:
        """Yield ``(inputs, labels, logits, features)`` for each image of ``split`` in eval mode without
        gradients, at the image's own size: ``inputs (1, C, H, W)``, ``labels (1, 1, H, W)``, ``logits
        (1, num_classes, H, W)``; ``features`` on the network's grid. ``network_grid=True`` (2-D images only):
        ``inputs`` and ``logits`` stay on the network's grid ``(1, *, h, w)`` (the resized or rescaled image),
        ``labels`` at the image's own size.

        Raises:
            ValueError: ``network_grid`` for volumes (their scores are always inverted to the scan's geometry).
        """
        if network_grid and self.volumes:
            raise ValueError(f"{self.site}: network_grid applies to 2-D images; volume scores are scored in the scan's geometry")
        for batch, logits, features in self.scored_batches(model, split, with_features, resize_back=not network_grid):
            labels = plain(batch["label"]).to(self.device)
            if self.volumes:
                inputs = invert_to_scan(batch, batch["image"], self._eval_transform).to(self.device)
            elif network_grid:
                inputs = plain(batch["image"]).to(self.device)
            else:
                inputs = resize_scores(batch["image"].to(self.device), labels.shape[2:])
            yield inputs, labels, logits, features

    def scored_batches(self, model: nn.Module, split: str, with_features: bool, resize_back: bool = True):
        """Yield ``(batch, logits, features)`` per image of ``split`` (the evaluation loader's batch), the model in
        eval mode: ``logits`` at the image's own size (``resize_back``; volumes: inverted to the scan's geometry),
        else on the network's grid."""
        was_training = model.training
        model.eval()
        try:
            for batch in self.loader(split):
                inputs = batch["image"].to(self.device)
                out = self.predict(model, inputs, with_features)
                logits, features = out if with_features else (out, {})
                if self.volumes:
                    # scores inverted to the scan's own orientation, spacing and shape (Invertd) before the argmax
                    yield batch, invert_to_scan(batch, logits, self._eval_transform), features
                elif resize_back:
                    # scores back to the image's own size before the argmax (thin structures survive)
                    yield batch, resize_scores(logits, batch["label"].shape[2:]), features
                else:
                    yield batch, logits, features
        finally:
            model.train(was_training)

    # ------------------------------------------------------------------------------ window sample
    def grid_shapes(self, split: str) -> List[Tuple[int, ...]]:
        """Spatial shape of every image of ``split`` on the network's grid (after the evaluation
        preprocessing, e.g. the datalist's ``rescale``), in datalist order; read once per process."""
        self._check_split(split)
        if split not in self._grid_shapes:
            dataset = self._dataset(split, False)
            self._grid_shapes[split] = [tuple(int(s) for s in dataset[i]["image"].shape[1:]) for i in range(len(dataset))]
        return self._grid_shapes[split]

    @property
    def window_cell(self) -> int:
        """Cell of a sample window: the sliding window's stride, ``patch_size * (1 - sw_overlap)``."""
        return window_cell_size(int(self.config.spatial.patch_size), self.config.sliding_window.sw_overlap)

    @property
    def window_sample_available(self) -> bool:
        """A window sample applies: 2-D images in patch mode. Resize mode scores a whole image in one forward pass;
        volumes (3-D patches or slices) keep the pass over every whole volume (the sample is 2-D only)."""
        return self.spatial_mode == "patch" and not self.volumes

    def window_sample(self, split: str, num_windows: int, round_: int, purpose: str) -> List[SampledImage]:
        """``num_windows`` cells of the ``window_cell`` tiling of the whole images of ``split``, each to be scored
        by one patch-size window, seeded by (``train_config`` seed, site, round, ``purpose``) — deterministic,
        different per site and round, drawn here (``fedseg.uncertainty.window_sample``). Patch mode only: in
        resize mode an image is one forward pass.

        Raises:
            ValueError: resize mode, an empty split, or ``num_windows < 1``.
        """
        if not self.window_sample_available:
            raise ValueError(f"{self.site}: a window sample needs 2-D images in spatial_mode 'patch' (this site: "
                             f"{'volumes, ' if self.volumes else ''}spatial_mode {self.spatial_mode!r})")
        shapes = self.grid_shapes(split)
        if not shapes:
            raise ValueError(f"{self.site}: split {split!r} is empty")
        generator = sample_generator(self.seed, self.site, round_, f"{purpose}/{split}")
        return sample_windows(shapes, self.window_cell, int(num_windows), generator)

    @torch.no_grad()
    def iterate_windows(self, split: str, sample: Sequence[SampledImage]) -> Iterator[Tuple[SampledImage, torch.Tensor, torch.Tensor]]:
        """Yield ``(entry, windows (n, C, P, P), masks (n, 1, P, P) bool)`` on the device for each image of
        ``sample`` (``window_sample``): the network inputs that score its cells and the cells' own pixels."""
        dataset = self._dataset(split, False)
        patch = int(self.config.spatial.patch_size)
        for entry in sample:
            image = torch.as_tensor(dataset[entry.index]["image"]).to(self.device)
            windows, masks = crop_windows(image, entry.cells, patch, self.window_cell)
            yield entry, windows, masks

    @torch.no_grad()
    def iterate_window_logits(
        self, model: nn.Module, split: str, sample: Sequence[SampledImage]
    ) -> Iterator[Tuple[SampledImage, torch.Tensor, torch.Tensor]]:
        """Yield ``(entry, logits (n, num_classes, P, P), masks (n, 1, P, P))`` for each image of ``sample``:
        one eval-mode forward pass per window without gradients (``sw_batch_size`` windows at a time), no
        blending — each cell's pixels are scored by the one window that holds it."""
        step = max(self.config.sliding_window.sw_batch_size, 1)
        was_training = model.training
        model.eval()
        try:
            for entry, windows, masks in self.iterate_windows(split, sample):
                logits = torch.cat([model(windows[i : i + step]) for i in range(0, len(windows), step)])
                yield entry, logits, masks
        finally:
            model.train(was_training)

    def evaluate(
        self,
        model: nn.Module,
        split: str,
        metrics: Optional[Sequence[str]] = None,
        per_image: bool = False,
        largest_component: Optional[bool] = None,
    ):
        """Mean foreground metrics of ``model`` over the images of ``split``, each scored at its own size; ``(means,
        rows)`` with ``per_image`` (``fedseg.engine.evaluation.SegmentationEvaluation.evaluate``)."""
        return self.evaluation.evaluate(model, split, metrics=metrics, per_image=per_image, largest_component=largest_component)

    def validation_metrics(self, model: nn.Module) -> Dict[str, float]:
        """``{"val_dice": mean Dice on the validation split}``, sent with the trained weights
        (``fedseg.engine.evaluation.SegmentationEvaluation.validation_metrics``)."""
        return self.evaluation.validation_metrics(model)

    def save_evaluation_figures(self, model: nn.Module, output_dir: os.PathLike, model_name: str) -> None:
        """Overlay strip (image / truth / prediction) of the test split, for the global model only."""
        self.evaluation.save_figures(model, output_dir, model_name)


def _check_dp_objective(objective: ClientObjective) -> None:
    """An objective with a parameter-only term must also split it out of its data term."""
    cls = type(objective)
    if cls.parameter_loss is not ClientObjective.parameter_loss and cls.data_loss is ClientObjective.data_loss:
        raise TypeError(
            f"objective {objective.name!r} implements parameter_loss but not data_loss: under DP its loss() "
            "would be privatised whole and the parameter term's gradient discarded; implement data_loss"
        )
