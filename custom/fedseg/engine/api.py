"""The site engine's contract: what objectives and the site client may call on a site engine.

One engine per site process, built by ``fedseg.engine.factory.build_engine(site, datalist, train_config)``. The task
(``train_config["task"]``, else the datalist's top-level ``"task"``, else segmentation) and the job's bundle pick it:

    engine                                         protocol it provides
    fedseg.engine.engine.SegEngine                 :class:`WindowSampledEngine` (segmentation on the suite's bundles)
    fedseg.engine.bundle_engine.BundleEngine       :class:`SegmentationEngine` (a user's MONAI bundle)
    fedseg.engine.classification.ClassificationEngine
                                                   :class:`ClassifierEngine` (FedEFM phase 1, a ViT classifier)

Every one subclasses ``fedseg.engine.base.LocalEngine``, which holds what they share (:class:`SiteEngine`). An
objective types the engine it receives with the narrowest protocol it needs (``ClientObjective.end_round(ctx, model,
engine: SiteEngine)``; GraphFedSeg's and FedEvi's window samples: :class:`WindowSampledEngine`), and checks
``engine.window_sample_available`` before it calls a window-sample member. ``tests/test_engine_protocol.py`` checks
that each engine provides every member of its protocol with the same parameter names, so the contract and the
engines cannot drift apart.

Tensor shapes: ``B`` batch, ``C`` input channels, ``num_classes`` output channels, ``(H, W)`` an image's own size,
``(h, w)`` the network's grid, ``P`` the patch size, ``k`` patches per image; volumes add a depth axis.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover - the engines import the objectives, which name these protocols
    from fedseg.config import TrainConfig
    from fedseg.data.labels import LabelSpace
    from fedseg.engine.distributed import RankGroup
    from fedseg.uncertainty.window_sample import SampledImage

#: a ``fedseg.objectives.base.RoundContext`` and a ``ClientObjective``: the objectives import this module (they are
#: typed against its protocols), so naming their classes here, even for type checking, would be an import cycle
RoundContextLike = Any
ClientObjectiveLike = Any

__all__ = ["SiteEngine", "SegmentationEngine", "WindowSampledEngine", "ClassifierEngine", "ENGINE_PROTOCOLS"]


@runtime_checkable
class SiteEngine(Protocol):
    """What every site engine offers, whatever the task (``fedseg.engine.base.LocalEngine``).

    ``ranks`` is set by the site client when the site trains as N ranks (``fedseg.engine.distributed``): ``train``'s
    epochs then run as DDP over the ranks, everything else on rank 0 only. Differential privacy
    (``train_config["dp_target_epsilon"]`` set) is DP-SGD in ``SegEngine`` only; the other engines refuse it at
    construction (:meth:`refuse_private_training`).
    """

    #: the task the engine serves: "segmentation" or "classification"
    task: str
    #: the site's ranks when its local training runs as N processes; None: one process
    ranks: Optional["RankGroup"]

    @property
    def site(self) -> str:
        """The site's name (messages, state files)."""

    @property
    def device(self) -> torch.device:
        """Where the engine trains and predicts (CUDA when available, else the CPU, unless the site chose)."""

    @property
    def train_config(self) -> Dict[str, Any]:
        """The effective hyper-parameters: the server's ``train_config`` with the keys the engine resolved added."""

    @property
    def config(self) -> "TrainConfig":
        """The typed ``train_config`` (``fedseg.config.TrainConfig``), built once at construction and kept in step with
        what the engine resolved: ``engine.config.training.batch_size``."""

    @property
    def datalist_info(self) -> Dict[str, Any]:
        """The top-level fields of the site's datalist JSON (``{}`` for a user's bundle)."""

    @property
    def n_train(self) -> int:
        """Number of training images (items) of the site."""

    @property
    def num_classes(self) -> int:
        """Output channels of the network: segmentation classes including background, or image classes."""

    @property
    def shuffle_generator(self) -> torch.Generator:
        """The generator behind every training order (``fedseg.engine.site_state`` persists it across restarts)."""

    @property
    def dp_enabled(self) -> bool:
        """Whether local training must be DP-SGD (``train_config["dp_target_epsilon"]`` is set)."""

    def build_network(self) -> nn.Module:
        """A fresh network for the site's task on :attr:`device` (seeded: every site builds the same round-0 weights)."""

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The optimiser of ``model`` (from the bundle and ``train_config``), one per model object, kept across rounds so
        Adam's moments survive."""

    def prepare_optimizer(self, model: nn.Module, ctx: RoundContextLike) -> torch.optim.Optimizer:
        """``make_optimizer(model)`` with this round's learning rate ``learning_rate * lr_decay_per_round ** round`` on
        every parameter group; its state emptied first with ``train_config["optimizer_state"] = "reset"``."""

    def local_epochs(self, epochs: Optional[int] = None) -> int:
        """``epochs`` when given, else ``train_config["local_epochs"]``."""

    def loader(self, split: str, shuffle: bool = False, train: bool = False, batch_size: Optional[int] = None) -> Any:
        """A ``DataLoader`` over ``split`` in ``{"training", "validation", "test"}``; batches are dicts with ``"image"``
        and ``"label"`` (shapes: the engine's protocol). ``train=True``: the training pipeline in batches of
        ``batch_size`` (default ``train_config["batch_size"]``)."""

    def training_batches(self) -> Any:
        """One epoch's training batches, same contents as ``loader("training", shuffle=True, train=True)``; held on
        the device and augmented there (``fedseg.engine.resident``) where the engine can."""

    def train(self, model: nn.Module, objective: ClientObjectiveLike, ctx: RoundContextLike,
              epochs: Optional[int] = None) -> Dict[str, float]:
        """``epochs`` (default ``train_config["local_epochs"]``) local epochs of ``objective.loss`` on
        ``objective.prepare_inputs(images, labels)``, with ``objective.after_step(model, optimizer)`` after every
        optimiser step (SCAFFOLD's correction); parameters with ``requires_grad`` False get no gradient and are left
        alone (FedRep's frozen head or body). Returns at least ``{"train_loss": mean over steps, "steps": float}``.

        With DP on (``SegEngine`` only): Opacus DP-SGD on ``objective.data_loss`` (per-sample clipping + noise), then
        the exact gradient of ``objective.parameter_loss(model)`` (reads no data); the metrics gain ``dp_epsilon``
        (spent so far) and ``dp_delta``."""

    def evaluate(self, model: nn.Module, split: str, *, per_image: bool = False) -> Any:
        """Mean metrics of ``model`` on ``split`` (``{name: float}``); with ``per_image``, ``(means, rows)``, one row
        ``{"id": the image's file name, ...}`` per image in datalist order (rows stay at the site, never sent)."""

    def validation_metrics(self, model: nn.Module) -> Dict[str, float]:
        """The scalar validation metrics the site sends with its trained weights (``val_dice`` / ``val_accuracy``)."""

    def save_evaluation_figures(self, model: nn.Module, output_dir: os.PathLike, model_name: str) -> None:
        """Site-local figures of an evaluation, written under ``output_dir`` (never sent); may write none."""

    def refuse_private_training(self, reason: str) -> None:
        """Raise ``ValueError`` naming ``reason`` when DP is requested of an engine that cannot provide it (training
        in the clear while the operator believes the weights private would be worse than not training)."""


@runtime_checkable
class SegmentationEngine(SiteEngine, Protocol):
    """A segmentation site: ``SegEngine`` (the suite's bundles, built from the site's datalist) and ``BundleEngine`` (a
    user's MONAI bundle read through MONAI's ``ConfigWorkflow``: its data, loss, optimiser class, inferers and
    postprocessing; its evaluation splits are the bundle's validation data, on the grid its preprocessing gives).

    ``loader(split, train=True)`` batches ``{"image": (B*k, C, P, P) float, "label": (B*k, 1, P, P) float class indices
    0..num_classes-1}`` (patch mode: ``k = patch_samples`` patches of ``P = patch_size`` per image; resize mode: ``k =
    1``, ``P = image_size``; volumes in patch mode: 3-D patches ``(B*k, C, X, Y, Z)``, in slice mode one-slice patches
    squeezed to 2-D). ``train=False``: whole images one at a time, ``"image" (1, C, h, w)`` on the network's grid,
    ``"label"`` (and ``"fov"``) ``(1, 1, H, W)`` at the image's own size (volumes: the image on the job's grid, a
    MetaTensor, the label in the scan's own geometry). A user's bundle gives its own batches; labels ``(B, 1, *s)``
    class indices, or ``(B, C, *s)`` one-hot / multi-label, which methods that need class indices refuse.

    Feature maps: ``SegEngine``'s network has ``forward_features``; ``BundleEngine`` reads them by role through forward
    hooks (``fedseg.networks.feature_taps``; an objective names the roles it reads in ``feature_roles``, and one that
    needs softmax class logits sets ``needs_class_logits``).
    """

    @property
    def spatial_mode(self) -> Optional[str]:
        """``"resize"``, ``"patch"`` (native resolution; ``fedseg.engine.spatial``) or, for volumes, ``"slices"``;
        None for a user's bundle (its transforms decide the grid)."""

    @property
    def volumes(self) -> bool:
        """True for CT / MR volume jobs (``spatial_dims`` 3): evaluation loads volumes one at a time, scores are
        inverted to the scan's own geometry (``fedseg.engine.volume.invert_to_scan``) and distances in mm use its
        header."""

    @property
    def label_space(self) -> "LabelSpace":
        """``fedseg.data.labels.LabelSpace`` of the site's data (class names, regions, its stored mask encoding),
        checked against the job's ``num_classes`` / labels / regions at construction."""

    @property
    def window_sample_available(self) -> bool:
        """Whether the window-sample members apply (:class:`WindowSampledEngine`: 2-D images in patch mode); False
        for a user's bundle and in resize mode (every method then scores whole images)."""

    @property
    def predictor(self) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
        """:meth:`predict` as a callable ``predictor(model, inputs) -> scores``."""

    def predict(self, model: nn.Module, inputs: torch.Tensor, with_features: bool = False) -> Any:
        """No grad: class scores of whole images on the network's grid, ``(B, C, h, w) -> (B, num_classes, h, w)``
        (sliding window in patch mode and where the bundle's inferer has one); ``(logits, features)`` with
        ``with_features`` (``SegEngine``: resize mode only)."""

    def iterate_logits(self, model: nn.Module, split: str, with_features: bool = False, network_grid: bool = False
                       ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]]:
        """Eval mode, no grad: yield ``(inputs (1, C, H, W), labels (1, 1, H, W), logits (1, num_classes, H, W),
        features)`` per image of ``split`` at the image's own size (volumes: in the scan's geometry); ``features`` on
        the network's grid, ``{}`` unless ``with_features``. ``network_grid`` (2-D only): ``inputs`` and ``logits``
        stay on the network's grid ``(1, *, h, w)``."""

    def intensity_statistics(self, split: str = "training") -> Tuple[torch.Tensor, torch.Tensor]:
        """``(mean (C,), std (C,))`` per channel of the network's input intensities over every pixel of the split's
        whole images (evaluation preprocessing, decoded one at a time)."""

    def evaluate(self, model: nn.Module, split: str, metrics: Optional[Sequence[str]] = None, per_image: bool = False,
                 largest_component: Optional[bool] = None) -> Any:
        """Mean foreground metrics over the images of ``split``, each scored at its own size (MONAI's metrics,
        ``fedseg.metrics``): ``{"dice", "hd95", "assd"}`` unless ``metrics`` (else ``train_config["eval_metrics"]``)
        names others; with more than two classes or regions the mean over foreground classes plus
        ``"<metric>:<class>"`` and ``"<metric>:<region>"`` keys; ``dice_fov`` / ``hd95_fov`` / ``assd_fov`` with a
        datalist ``"fov"``, ``hd95_mm`` / ``assd_mm`` with a ``"spacing"`` (volumes: from the scan's header).
        ``largest_component`` (None = ``train_config["eval_largest_component"]``): also each metric of the prediction
        reduced to each class's largest connected component, under ``<metric>_lcc``. ``per_image``: ``(means,
        rows)``, one ``{"id": basename of the image, <metric>: value}`` per image in datalist order."""


@runtime_checkable
class WindowSampledEngine(SegmentationEngine, Protocol):
    """A segmentation engine that can score a sample of windows instead of whole images (``SegEngine``; used by
    GraphFedSeg's ``U_i`` and FedEvi's G/A/R when ``window_sample_available``: 2-D images in patch mode).

    A window sample is a list of ``fedseg.uncertainty.window_sample.SampledImage(index, shape, cells)``: cells of the
    non-overlapping ``window_cell`` tiling of the split's images on the network's grid.
    """

    @property
    def window_cell(self) -> int:
        """Cell of a sample window: the sliding window's stride, ``patch_size * (1 - sw_overlap)``."""

    def grid_shapes(self, split: str) -> List[Tuple[int, ...]]:
        """Spatial shape ``(h, w)`` of each image of ``split`` on the network's grid, datalist order."""

    def window_sample(self, split: str, num_windows: int, round_: int, purpose: str) -> List["SampledImage"]:
        """``num_windows`` cells of the split's tiling, spread evenly over its images, seeded by (``train_config``
        seed, site, ``round_``, ``purpose``); every cell when ``num_windows`` >= their number.

        Raises:
            ValueError: the window sample does not apply (``window_sample_available`` False), an empty split."""

    def iterate_windows(self, split: str, sample: Sequence["SampledImage"]
                        ) -> Iterator[Tuple["SampledImage", torch.Tensor, torch.Tensor]]:
        """Yield ``(entry, windows (n, C, P, P), masks (n, 1, P, P) bool)`` on the device per image of ``sample``: the
        window that scores each sampled cell and the cell's own pixels in it."""

    def iterate_window_logits(self, model: nn.Module, split: str, sample: Sequence["SampledImage"]
                              ) -> Iterator[Tuple["SampledImage", torch.Tensor, torch.Tensor]]:
        """Eval mode, no grad: yield ``(entry, logits (n, num_classes, P, P), masks (n, 1, P, P))``, one forward pass
        per window, no blending."""


@runtime_checkable
class ClassifierEngine(SiteEngine, Protocol):
    """An image-classification site (``ClassificationEngine``, FedEFM phase 1: a ViT over a global label space).

    ``loader`` batches ``{"image": (B, C, S, S) float in [0, 1], "label": (B,) long}`` with ``S = vit_image_size``,
    evaluation included; ``evaluate`` gives ``{"accuracy", "balanced_accuracy", "accuracy_class_<k>"}`` (rows ``{id,
    label, prediction, correct}``) and ``validation_metrics`` ``{"val_accuracy"}``; with ``objective.needs_features``
    the ViT's patch tokens reach the objective as ``BatchOutput.features = {"tokens": (B, N, D)}``. No DP (refused);
    the segmentation members (``predict``, ``iterate_logits``, ``intensity_statistics``) do not exist.
    """

    def predict_classes(self, model: nn.Module, split: str) -> Tuple[List[int], List[int]]:
        """``(predicted class per image, true class per image)`` over ``split`` in datalist order (eval mode)."""


#: each engine class (by module path and name) and the protocol it provides, for the contract test and for readers
ENGINE_PROTOCOLS: Dict[str, type] = {
    "fedseg.engine.engine.SegEngine": WindowSampledEngine,
    "fedseg.engine.bundle_engine.BundleEngine": SegmentationEngine,
    "fedseg.engine.classification.ClassificationEngine": ClassifierEngine,
}
