"""The site engine for any MONAI bundle: the user's network, data, loss, optimiser, inferers and postprocessing, read
through MONAI's own ``ConfigWorkflow``, trained by the suite's loop so that every method's objective applies.

What is taken from the bundle (``train_config["bundle"]``, a folder; ``fedseg.bundle.read_bundle``):

    network_def                     the network (``build_network``; tagged for feature-level methods,
                                    ``fedseg.networks.feature_taps``)
    train#dataset, train#dataloader the training data and preprocessing; the loader's batch size, workers and collate
    train#trainer#loss_function     the loss the objective wraps (``objective.seg_loss``)
    train#trainer#optimizer         its class and hyper-parameters, rebuilt for each model the site trains; the
                                    learning rate is its ``lr`` times ``lr_decay_per_round ** round``
    train#inferer                   the training forward pass
    validate#dataset / #inferer /   validation and the final evaluation ("validation" and "test" are the bundle's
    #postprocessing                 validation data); Dice / HD95 / ASSD (MONAI's metrics, ``fedseg.metrics``) from
                                    the postprocessed ``pred`` and ``label``
    validate#preprocessing          (else ``validate#dataset``'s transform) the deterministic pipeline the training
                                    images also go through where a method scores them whole (GraphFedSeg's U_i,
                                    PathFL's intensity statistics)

The epochs are the job's ``local_epochs`` (the bundle's ``max_epochs`` does not apply); the bundle's handlers do not
run (its writers point into the site's workspace all the same). Per-site values (``dataset_dir``, ...) arrive in
``train_config["bundle_overrides"]``, merged by the site from the job's ``--set`` ids and its ``--site-overrides``.

The engine's device-resident batches and batched augmentation (``fedseg.engine.resident``) apply where the bundle's
training transforms allow it (its deterministic prefix cached, every random transform with a batch form), else the
bundle's own pipeline runs through the per-sample loader; the log says which. Not on this path, each refused with one
line: differential privacy and a site training as several ranks; a window sample (every method falls back to whole
images).
Batches are ``{"image": (B, C_in, *spatial), "label": (B, 1, *spatial)}`` class indices, or ``(B, C, *spatial)`` for a
bundle whose labels are one-hot / multi-label (methods that need class indices refuse those).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from monai.data import DataLoader, Dataset, decollate_batch
from monai.data.meta_tensor import MetaTensor
from torch import nn

from fedseg.bundle import BundleError, network_from_workflow, read_bundle
from fedseg.data.labels import LabelSpace
from fedseg.engine.base import LocalEngine, channel_moments
from fedseg.engine.evaluation import eval_metric_names
from fedseg.engine.volume import plain
from fedseg.metrics import SegmentationMetrics
from fedseg.networks.feature_taps import FeatureLayerError, feature_module_name, has_native_features, network_features
from fedseg.objectives.base import ClientObjective, RoundContext

logger = logging.getLogger(__name__)

__all__ = ["BundleEngine", "class_index_map"]


def class_index_map(t: torch.Tensor) -> torch.Tensor:
    """``(C, *spatial)`` one-hot / scores or ``(1, *spatial)`` class indices -> ``(1, *spatial)`` class indices."""
    t = plain(t)
    if t.shape[0] == 1:
        return t.round().long()
    return t.argmax(dim=0, keepdim=True)


class _PlainBatches:
    """A loader whose batches' MetaTensors become plain tensors (sized, re-iterable: ignite reads its length)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            # MetaTensors as plain tensors: their metadata is not needed in the training loop
            yield {k: plain(v) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class BundleEngine(LocalEngine):
    """Local engine of one site over a user's MONAI bundle (module notes).

    Args:
        site: site name.
        train_config: the job's hyper-parameters; ``bundle`` (the folder), ``bundle_overrides`` ``{config id: value}``
            (the job's and this site's, merged), ``bundle_writers_dir`` (where the bundle's writers point).
        bundle_dir: the bundle folder at this site (default ``train_config["bundle"]``).
        device: default: the bundle's ``device`` id.

    Raises:
        BundleError: a missing required property, an unknown override id, empty training or validation data,
            a network whose output channels disagree with the labels.
    """

    task = "segmentation"

    def __init__(self, site: str, train_config: Dict[str, Any], bundle_dir: Optional[os.PathLike] = None,
                 device: Optional[torch.device] = None, dp_seed: Optional[int] = None):
        super().__init__(site, None, train_config, device=device, dp_seed=dp_seed)
        self.refuse_private_training("a user's bundle trains with its own data pipeline, which DP-SGD's Poisson sampling "
                                     "and per-sample clipping are not wired to")
        root = Path(bundle_dir or self.config.bundle.bundle)
        self.bundle_dir = root
        # bundle_writers_dir is the site's own (not a job option): where the bundle's writers point in its workspace
        self.workflow = read_bundle(root, self.config.bundle.bundle_overrides, self.train_config.get("bundle_writers_dir"),
                                    where=site)
        parser = self.workflow.parser
        self.parser = parser
        if device is None and "device" in parser:
            self.device = torch.device(parser.get_parsed_content("device"))
        self.spatial_mode = None  # the bundle's own transforms decide the grid
        self.window_sample_available = False
        self.train_dataset = self._parsed("train#dataset")
        self.n_train = len(self.train_dataset)
        if self.n_train == 0:
            raise BundleError(f"{site}: the bundle's training data is empty: no images under dataset_dir "
                              f"{parser.get('dataset_dir', '(unset)')!r}")
        loader = self._parsed("train#dataloader") if "train#dataloader" in parser else None
        self.update_train_config({"batch_size": int(getattr(loader, "batch_size", None) or 1),
                                  "num_workers": int(getattr(loader, "num_workers", 0) or 0)})
        if "validate#dataset" not in parser:
            raise BundleError(f"{site}: bundle {root} has no validate#dataset (MONAI's val_dataset property): the site "
                              "validates and evaluates on it")
        self.val_dataset = self._parsed("validate#dataset")
        if len(self.val_dataset) == 0:
            raise BundleError(f"{site}: the bundle's validation data is empty (validate#dataset under dataset_dir "
                              f"{parser.get('dataset_dir', '(unset)')!r})")
        self.loss = self._parsed("train#trainer#loss_function")
        optimizer = self._parsed("train#trainer#optimizer")
        self._optimizer_class, self._optimizer_defaults = type(optimizer), dict(optimizer.defaults)
        self.train_inferer = self._parsed("train#inferer")
        self.val_inferer = self._parsed("validate#inferer") if "validate#inferer" in parser else self.train_inferer
        self.postprocessing = self._parsed("validate#postprocessing") if "validate#postprocessing" in parser else None
        if "validate#preprocessing" in parser:
            self.eval_transform = self._parsed("validate#preprocessing")
        else:
            self.eval_transform = getattr(self.val_dataset, "transform", None)
        self.num_classes = self._output_channels()
        self.label_space = LabelSpace(names=self._class_names(), declared=True)
        first = self.val_dataset[0]
        first = first[0] if isinstance(first, list) else first
        self._check_labels(torch.as_tensor(first["label"])[None], "validation")
        self._label_channels = int(torch.as_tensor(first["label"]).shape[0])
        self.update_train_config({"spatial_dims": int(torch.as_tensor(first["image"]).ndim - 1), "num_classes": self.num_classes})
        self.volumes = self.config.volume.spatial_dims == 3
        self._labels_checked = False
        #: the training split held on the device (fedseg.engine.resident); None = not decided yet, False = the loader
        self._resident: Any = None
        #: the feature maps the objective being trained reads (``ClientObjective.feature_roles``)
        self._roles: Tuple[str, ...] = ()
        self._datasets: Dict[Tuple[str, bool], Any] = {}
        logger.info("%s: bundle %s, %d training / %d validation items, %d classes, %d-D, batch %d, on %s", site, root,
                    self.n_train, len(self.val_dataset), self.num_classes, self.config.volume.spatial_dims,
                    self.config.training.batch_size, self.device)

    # ----------------------------------------------------------------------------------- components
    def _parsed(self, config_id: str) -> Any:
        return self.parser.get_parsed_content(config_id)

    def build_network(self) -> nn.Module:
        """A fresh ``network_def`` on the device (the job's seed: the server's initial weights)."""
        return network_from_workflow(self.workflow, self.train_config).to(self.device)

    def build_loss(self) -> nn.Module:
        return self.loss

    def _optimizer_factory(self):
        cls, defaults = self._optimizer_class, self._optimizer_defaults
        return lambda params: cls(params, **defaults)

    def round_learning_rate(self, round_: int) -> float:
        """The bundle optimiser's ``lr`` times ``lr_decay_per_round ** round`` (the job's schedule over rounds)."""
        lr = float(self._optimizer_defaults.get("lr", self.config.training.learning_rate))
        return lr * self.config.training.lr_decay_per_round ** int(round_)

    def _output_channels(self) -> int:
        """``network_def#out_channels`` where the bundle states it, else the head's (``feature_taps.find_head_layer``)."""
        if "network_def#out_channels" in self.parser:
            return int(self._parsed("network_def#out_channels"))
        from fedseg.bundle import bundle_network_fields

        network = network_from_workflow(self.workflow, self.train_config)
        channels = bundle_network_fields(self.train_config, network).get("num_classes")
        if channels is None:
            raise BundleError(f"{self.site}: cannot tell the number of output channels of {type(network).__name__}: set "
                              "network_def#out_channels or head_layer")
        return int(channels)

    def _class_names(self) -> Tuple[str, ...]:
        """The classes' names from the bundle's metadata (``network_data_format#outputs#pred#channel_def``), else
        ``background, class_1, ...``."""
        key = "_meta_#network_data_format#outputs#pred#channel_def"
        names = {}
        try:
            names = dict(self.parser.get(key) or {}) if key in self.parser else {}
        except Exception:  # noqa: BLE001 - metadata is optional and free-form
            names = {}
        out = [str(names.get(str(i), names.get(i, "background" if i == 0 else f"class_{i}"))) for i in range(self.num_classes)]
        return tuple(out) if len(set(out)) == len(out) else tuple(["background"] + [f"class_{i}" for i in range(1, self.num_classes)])

    def _check_labels(self, labels: torch.Tensor, split: str) -> None:
        """``(B, 1 or C, *spatial)`` labels fit the network's ``num_classes`` output channels."""
        labels = plain(labels)
        if labels.shape[1] == 1:
            top = float(labels.max()) if labels.numel() else 0.0
            if top >= self.num_classes:
                raise BundleError(f"{self.site}: the network has {self.num_classes} output channels but the {split} labels "
                                  f"hold class {int(top)}: set network_def#out_channels to the number of classes")
        elif labels.shape[1] != self.num_classes:
            raise BundleError(f"{self.site}: the network has {self.num_classes} output channels but the {split} labels "
                              f"have {labels.shape[1]} channels")

    @property
    def class_index_labels(self) -> bool:
        """Whether the bundle's labels are class indices (one channel), which softmax-based methods need."""
        return self._label_channels == 1

    def check_objective(self, objective: ClientObjective, model: nn.Module) -> None:
        """Refuse, with one line, a method this bundle cannot serve: softmax class logits (FedEvi's evidence) on a
        head that is not a multi-class segmentation head; a feature-level method on a network without its layer;
        a sliding-window training inferer under a feature-level method."""
        if getattr(objective, "needs_class_logits", False):
            sigmoid = bool(getattr(self.loss, "sigmoid", False) or getattr(getattr(self.loss, "dice", None), "sigmoid", False))
            if self.num_classes < 2 or sigmoid or not self.class_index_labels:
                raise BundleError(f"{self.site}: {objective.name} needs softmax class logits over class-index labels, but "
                                  f"this bundle's head is not a segmentation head of that kind ({self.num_classes} output "
                                  f"channel(s){', sigmoid loss' if sigmoid else ''}"
                                  f"{', one-hot / multi-label labels' if not self.class_index_labels else ''})")
        if objective.needs_features and not has_native_features(model):
            from monai.inferers import SimpleInferer

            for role in objective.feature_roles:
                feature_module_name(model, role)  # FeatureLayerError names feature_layer
            if not isinstance(self.train_inferer, SimpleInferer):
                raise FeatureLayerError(f"{self.site}: {objective.name} reads a feature map during training, which needs "
                                        f"the bundle's train#inferer to be a SimpleInferer (got {type(self.train_inferer).__name__})")

    # ----------------------------------------------------------------------------------------- data
    def _dataset(self, split: str, train: bool):
        """Training with ``train``: the bundle's ``train#dataset``; else the split's images through the deterministic
        evaluation pipeline (the training split too: ``train#dataset``'s items, ``validate#preprocessing``)."""
        self._check_split(split)
        if train:
            if split != "training":
                raise ValueError(f"{self.site}: only the training split has a training pipeline")
            return self.train_dataset
        if split != "training":
            return self.val_dataset
        if ("training", False) not in self._datasets:
            data = self._parsed("train#dataset#data") if "train#dataset#data" in self.parser else getattr(self.train_dataset, "data", None)
            if data is None:
                raise BundleError(f"{self.site}: the bundle's train#dataset has no data list to score whole images from")
            self._datasets[("training", False)] = Dataset(list(data), transform=self.eval_transform)
        return self._datasets[("training", False)]

    def training_batches(self):
        """One epoch's training batches: held on the device and augmented there (``fedseg.engine.resident``) where the
        bundle's training transforms allow it (every random transform has a batch form, the split fits the site's
        cache budget), else the bundle's own pipeline through the per-sample loader. Decided once per engine, and said."""
        if self._resident is None:
            self._resident = self._resident_training() or False
        if self._resident is False:
            return _PlainBatches(super().training_batches())
        from fedseg.engine.resident import ResidentLoader

        return ResidentLoader(self._resident, self.shuffle_generator)

    def _resident_training(self):
        """The training split cached through its deterministic transforms (the bundle's own ``CacheDataset``, else one
        made here over ``train#dataset``'s items and transform: the same items, the same numbers) and held on the
        device with the batch form of its random transforms; None, with the reason logged, where that does not apply."""
        from monai.data import CacheDataset
        from monai.transforms import Compose, RandomizableTrait, Transform

        from fedseg.engine.resident import resident_training_data

        if not self.config.runtime.resident_data:
            return None
        dataset = self.train_dataset
        if not isinstance(dataset, CacheDataset):
            transform = getattr(dataset, "transform", None)
            if type(dataset) is not Dataset or not isinstance(transform, Compose):
                logger.info("%s: the bundle's training dataset (%s) is used as it is: per-sample loader", self.site,
                            type(dataset).__name__)
                return None
            # the deterministic prefix of one item, times the items: what caching the split would hold in memory
            first = transform.get_index_of_first(lambda t: isinstance(t, RandomizableTrait) or not isinstance(t, Transform))
            head = Compose(transform.transforms[:first]) if first is not None else transform
            probe = head(dict(dataset.data[0]))
            nbytes = sum(torch.as_tensor(v).element_size() * torch.as_tensor(v).numel() for v in probe.values()
                         if isinstance(v, torch.Tensor))
            max_mb = self.config.cache.cache_max_mb  # None: unbounded
            if max_mb is not None and nbytes * len(dataset.data) > float(max_mb) * 2**20:
                logger.info("%s: the training split (about %.0f MB decoded) exceeds cache_max_mb: per-sample loader",
                            self.site, nbytes * len(dataset.data) / 2**20)
                return None
            dataset = CacheDataset(list(dataset.data), transform=transform, cache_rate=1.0, num_workers=0, progress=False)
        resident = resident_training_data(dataset, self.device, self.config, self.num_classes)
        if resident is not None:
            logger.info("%s: %d training items held on %s, the bundle's random transforms applied there in batches",
                        self.site, resident.n, resident.store_device)
        return resident

    def batch_labels(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        labels = batch["label"].to(self.device)
        if not self._labels_checked:  # once per engine: the first batch's labels against the network's channels
            self._check_labels(labels, "training")
            self._labels_checked = True
        return labels

    def forward(self, model: nn.Module, inputs: torch.Tensor, with_features: bool):
        """``(logits, features)`` through the bundle's training inferer; the features by role
        (``fedseg.networks.feature_taps``) when the objective needs them."""
        if with_features:
            return network_features(model, inputs, self._roles, forward=lambda x: self.train_inferer(x, model))
        return self.train_inferer(inputs, model), {}

    # ------------------------------------------------------------------------------------- training
    def train(self, model: nn.Module, objective: ClientObjective, ctx: RoundContext, epochs: Optional[int] = None) -> Dict[str, float]:
        """``epochs`` (default ``local_epochs``) epochs of ``objective.loss`` (wrapping the bundle's loss) over the
        bundle's training loader; returns ``train_loss`` and ``steps``."""
        self.check_objective(objective, model)
        self._roles = tuple(objective.feature_roles)
        objective.set_seg_loss(self.loss)
        optimizer = self.prepare_optimizer(model, ctx)
        return self.run_epochs(model, objective, ctx, optimizer, self.local_epochs(epochs))

    # ----------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def predict(self, model: nn.Module, inputs: torch.Tensor, with_features: bool = False):
        """Class scores of whole images through the bundle's validation inferer (a sliding window where it has one):
        ``(B, C_in, *spatial) -> (B, C, *spatial)``; ``(logits, features)`` with ``with_features``."""
        if with_features:
            return network_features(model, inputs, forward=lambda x: self.val_inferer(x, model))
        return self.val_inferer(inputs, model)

    @property
    def predictor(self):
        return lambda model, inputs: self.predict(model, inputs)

    def _scored(self, model: nn.Module, split: str, with_features: bool = False):
        """Yield ``(batch, logits, features)`` for every evaluation batch of ``split``, the model in eval mode."""
        was_training = model.training
        model.eval()
        # a loader draws its base seed from the engine's generator when iterated: evaluation must not move the
        # training's order and augmentation (how often a site validates does not change what it trains)
        state = self.shuffle_generator.get_state()
        try:
            for batch in self.loader(split):
                images = batch["image"].to(self.device)
                out = self.predict(model, images, with_features)
                logits, features = out if with_features else (out, {})
                yield batch, logits, features
        finally:
            model.train(was_training)
            self.shuffle_generator.set_state(state)

    @torch.no_grad()
    def iterate_logits(self, model: nn.Module, split: str, with_features: bool = False, network_grid: bool = False
                       ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]]:
        """``(inputs (1, C_in, *s), labels (1, 1, *s) class indices, logits (1, C, *s), features)`` per image of
        ``split`` on the grid the bundle's evaluation preprocessing gives (``network_grid`` is that grid already)."""
        for batch, logits, features in self._scored(model, split, with_features):
            labels = torch.stack([class_index_map(x) for x in plain(batch["label"])]).float().to(self.device)
            yield plain(batch["image"]).to(self.device), labels, plain(logits), features

    def intensity_statistics(self, split: str = "training") -> Tuple[torch.Tensor, torch.Tensor]:
        """Per-channel ``(mean (C_in,), std (C_in,))`` of the network's input over every pixel of the split's whole
        images through the evaluation preprocessing."""
        items = (item[0] if isinstance(item, list) else item for item in self._dataset(split, False))
        return channel_moments(plain(item["image"]) for item in items)

    def _postprocessed(self, model: nn.Module, split: str):
        """Yield ``(name, pred (1, *s), label (1, *s), spacing)`` per image: the bundle's postprocessing applied to
        ``{image, label, pred}`` as its evaluator would, then both reduced to class indices."""
        index = 0
        for batch, logits, _ in self._scored(model, split):
            batch = dict(batch)
            batch["pred"] = logits
            for item in decollate_batch(batch):
                out = self.postprocessing(item) if self.postprocessing is not None else item
                out = out[0] if isinstance(out, list) else out
                label = out["label"]
                name = _item_name(item, index)
                spacing = None
                if self.volumes and isinstance(label, MetaTensor):
                    from fedseg.engine.volume import scan_spacing

                    spacing = scan_spacing(label[None])
                yield name, class_index_map(out["pred"]), class_index_map(label), spacing
                index += 1

    def evaluate(self, model: nn.Module, split: str, metrics: Optional[Sequence[str]] = None, per_image: bool = False,
                 largest_component: Optional[bool] = None):
        """Mean foreground metrics (Dice / HD95 / ASSD; with volumes also in mm) of ``model`` over the bundle's
        ``split`` images, each scored from the bundle's postprocessed prediction against its postprocessed label
        (``fedseg.metrics``, MONAI's metrics). ``per_image``: ``(means, rows)``, one row per image
        ``{"id": file name, <metric>: value}`` (site-local)."""
        meter = SegmentationMetrics(self.num_classes, eval_metric_names(self.config, metrics), label_space=self.label_space)
        names: List[str] = []
        for name, pred, label, spacing in self._postprocessed(model, split):
            meter.update(pred[None].cpu(), label[None].cpu(), spacing=spacing)
            names.append(name)
        if not names:
            raise ValueError(f"{self.site}: split {split!r} is empty")
        means = meter.aggregate()
        rows = [{"id": name, **values} for name, values in zip(names, meter.per_image())]
        return (means, rows) if per_image else means

    def validation_metrics(self, model: nn.Module) -> Dict[str, float]:
        """``{"val_dice": mean Dice on the bundle's validation data}``."""
        return {"val_dice": self.evaluate(model, "validation", metrics=("dice",))["dice"]}


def _item_name(item: Dict[str, Any], index: int) -> str:
    """The image file's name of a decollated item (its ``filename_or_obj``), else its index."""
    image = item.get("image")
    meta = getattr(image, "meta", None) or item.get("image_meta_dict") or {}
    name = meta.get("filename_or_obj") if isinstance(meta, dict) else None
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return os.path.basename(str(name)) if name else f"item_{index}"
