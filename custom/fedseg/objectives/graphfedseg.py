"""GraphFedSeg client: similarity-regularised local training and the client uncertainty U_i.

Loss (paper Eq. 5, sign as in the paper: similarity is maximised)
    L = L_seg - (lambda1 / 2) * sum_{j != i} W_ij cos(theta_i, theta_j)
      = L_seg - (lambda1 / 2) * <theta_i / ||theta_i||, d_i>
with ``d_i = sum_{j != i} W_ij theta_j / ||theta_j||`` precomputed by the server from the previous
round's graph and local models (``GraphFedSegStrategy.payload``), and theta_i the model's current
parameters over the keys of ``d_i``. No direction (round 0) or lambda1 = 0: L = L_seg.
With differential privacy on (``fedseg.engine.engine``), only L_seg (``data_loss``) is privatised; the
regulariser (``parameter_loss``) reads no training data and its gradient is added after clipping and noise.

Statistic sent to the server: ``uncertainty`` = U_i on the local training images with the trained model,
evidential (Eqs. 3-4, one forward pass) or MC-dropout (T passes); see
``fedseg.uncertainty.client_uncertainty``. The server's meta chooses the estimator; the constructor
options are the fallback when the server sends none.

At native resolution (patch mode) the pass over whole training images is a sliding window over each of
them, several times the cost of the local training. ``uncertainty_windows`` = M (default
``DEFAULT_UNCERTAINTY_WINDOWS``) measures U_i instead on M patch-size windows drawn at the site, seeded
per site and round (``fedseg.uncertainty.window_sample``): the image value is the mean pixel value over the
image's sampled cells, U_i the mean over the sampled images — the same Eqs. 3-4 on a sample of each
image's pixels. ``uncertainty_windows=None`` (or ``"whole_image"``) keeps the sliding window over every
whole image. Resize mode is unaffected (an image is one forward pass there).

``uncertainty_pass="last_epoch"`` (evidential only) skips that extra pass: U_i is the mean image vacuity
of the logits the last local epoch computed for training anyway. Every training image is seen once in
that epoch (Poisson batches under DP see each about once), but by a model that is still being updated
and on augmented images, so it estimates the after-training value; it saves about 1/(3E) of the local
training time (docs/methods.md, GraphFedSeg). ``uncertainty_pass="training_batches"`` (evidential only, the
authors' code): U_i is the mean over every training batch of every local epoch of the batch's mean pixel vacuity.

The authors' code's similarity term (server meta ``regulariser="top_k"``):
``lambda1 (1 - (W_ii [i among them] + <theta_i / ||theta_i||, d_i>) / (sum of their W + 1e-6))`` over the row's
k largest entries (``fedseg.strategies.collaboration_graph.top_k_regulariser``), with ``d_i`` over the
neighbours other than i and the two weights sent by the server. ``uncertainty_loss_weight`` > 0 adds the
authors' ``weight * log(1 + u^2)`` with u the batch's mean vacuity, measured without gradient: a constant per
batch, which changes the reported loss and not one gradient.
"""

from __future__ import annotations

import math

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Union

import torch
from torch import nn

from fedseg.config import BASE_TRAIN_CONFIG
from fedseg.method_options import MethodOptions, option
from fedseg.uncertainty.window_sample import check_window_count
from fedseg.strategies.collaboration_graph import similarity_regulariser, top_k_regulariser
from fedseg.uncertainty.client_uncertainty import (
    check_estimator,
    client_uncertainty,
    evidential_image_uncertainty,
    evidential_pixel_uncertainty,
    image_uncertainty,
    masked_mean,
    mc_dropout_pixel_uncertainty,
)

from .base import BatchOutput, ClientObjective, RoundContext

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SegmentationEngine, WindowSampledEngine

logger = logging.getLogger(__name__)

META_KEY = "graphfedseg"
#: windows per site and round for U_i in patch mode (chosen by measurement: docs/methods.md, GraphFedSeg)
DEFAULT_UNCERTAINTY_WINDOWS = 64
#: the window sample's ``purpose`` (part of its seed): U_i's sample differs from other statistics'
SAMPLE_PURPOSE = "graphfedseg_uncertainty"
#: Opacus' GradSampleModule prefixes parameter names with this
_WRAPPER_PREFIX = "_module."


@dataclass(frozen=True)
class GraphFedSegSiteOptions(MethodOptions):
    """GraphFedSeg's site options; the estimator's three are used when the server's meta does not say."""

    uncertainty: str = option("evidential", "the estimator: evidential or mc_dropout")
    mc_samples: int = option(5, "T for mc_dropout")
    uncertainty_pass: str = option("after_training", "after_training, last_epoch or training_batches (module docstring)")
    uncertainty_loss_weight: float = option(0.0, "weight of the constant log(1 + u^2) per batch (module docstring; the "
                                            "authors' code: 0.4); 0 adds nothing")
    uncertainty_windows: Union[int, str, None] = option(
        DEFAULT_UNCERTAINTY_WINDOWS, "in patch mode, the windows the after-training pass draws per round (module "
        "docstring); None or whole_image: a sliding window over every whole image")

    def __post_init__(self):
        check_estimator(self.uncertainty, self.mc_samples, self.uncertainty_pass)
        weight = self.uncertainty_loss_weight
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"uncertainty_loss_weight must be a finite number >= 0, got {weight}")
        self._set("uncertainty_loss_weight", float(weight))
        self._set("uncertainty_windows", check_window_count(self.uncertainty_windows, "uncertainty_windows"))
        self._set("mc_samples", int(self.mc_samples))


class GraphFedSegObjective(ClientObjective):
    """Segmentation loss + neighbour-similarity regulariser; sends the client uncertainty. Options:
    :class:`GraphFedSegSiteOptions`; ``seg_loss``: the bundle's segmentation loss (DiceCE) unless given."""

    name = "graphfedseg"
    needs_class_logits = True
    declared_statistics = ("uncertainty",)
    statistic_ranges = {"uncertainty": (0.0, math.inf)}  # U is a mean of per-image uncertainties
    options_class = GraphFedSegSiteOptions

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self.lambda1 = 0.0
        self._round_uncertainty = self.uncertainty
        self._round_mc_samples = self.mc_samples
        self._round_pass = self.uncertainty_pass
        self._last_epoch = 0
        self._training_values: List[torch.Tensor] = []
        self._params: List[torch.Tensor] = []
        self._direction: Optional[List[torch.Tensor]] = None
        #: the server's ``regulariser`` ("paper" or "top_k") and the top-k term's two weights
        self._regulariser = "paper"
        self._top_k_weights = (0.0, 0.0)

    @property
    def regulariser_active(self) -> bool:
        """Whether ``loss`` adds the similarity term this round."""
        return self._direction is not None

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        meta = ctx.server_meta.get(META_KEY) or {}
        self.lambda1 = float(meta.get("lambda1", 0.0))
        self._round_uncertainty = meta.get("uncertainty", self.uncertainty)
        self._round_mc_samples = int(meta.get("mc_samples", self.mc_samples))
        self._round_pass = meta.get("uncertainty_pass", self.uncertainty_pass)
        check_estimator(self._round_uncertainty, self._round_mc_samples, self._round_pass)
        self._last_epoch = int(ctx.train_config.get("local_epochs", BASE_TRAIN_CONFIG["local_epochs"])) - 1
        self._training_values = []
        direction = meta.get("direction")
        self._regulariser = meta.get("regulariser", "paper")
        if self._regulariser not in ("paper", "top_k"):
            raise ValueError(f"server meta regulariser must be 'paper' or 'top_k', got {self._regulariser!r}")
        self._top_k_weights = (float(meta.get("self_weight", 0.0)), float(meta.get("weight_sum", 0.0)))
        self._params, self._direction = [], None
        if direction and self.lambda1 > 0:
            self._params, self._direction = _bind_direction(model, direction)

    def loss(self, out: BatchOutput) -> torch.Tensor:
        seg = self.data_loss(out)
        reg = self.parameter_loss(None)
        return seg if reg is None else seg + reg

    def data_loss(self, out: BatchOutput) -> torch.Tensor:
        """L_seg: the only term that reads training data (privatised under DP). With
        ``uncertainty_pass="last_epoch"`` it also keeps the last epoch's image vacuities (``(B,)`` each), with
        ``"training_batches"`` every batch's mean vacuity (0-d each); ``uncertainty_loss_weight`` adds its constant."""
        batch_values = None
        if self._round_pass == "training_batches" or self.uncertainty_loss_weight > 0:
            batch_values = evidential_image_uncertainty(out.logits.detach())  # (B,), no gradient
        if self._round_pass == "last_epoch" and out.epoch == self._last_epoch:
            self._training_values.append(evidential_image_uncertainty(out.logits.detach()))
        elif self._round_pass == "training_batches":
            self._training_values.append(batch_values.mean())
        loss = super().loss(out)
        if self.uncertainty_loss_weight > 0:
            loss = loss + self.uncertainty_loss_weight * torch.log1p(batch_values.mean() ** 2).to(loss.dtype)
        return loss

    def parameter_loss(self, model: Optional[nn.Module]) -> Optional[torch.Tensor]:
        """The similarity regulariser ``-(lambda1 / 2) <theta_i / ||theta_i||, d_i>``, or ``None`` when
        inactive. It reads only the parameters bound in ``begin_round`` and the server's direction ``d_i``
        (built from the other sites' models), so under DP its gradient is added after privatisation."""
        if self._direction is None:
            return None
        # per-parameter dot products on the live parameters: no (D,) concatenation to build and
        # back-propagate through every step (docs/methods.md, GraphFedSeg)
        if self._regulariser == "top_k":
            self_weight, weight_sum = self._top_k_weights
            return top_k_regulariser(self._params, self._direction, self_weight, weight_sum, self.lambda1)
        return similarity_regulariser(self._params, self._direction, self.lambda1)

    # a site training as N ranks: each rank keeps the last-epoch vacuities of its share; rank 0 gets them all
    def begin_rank_epochs(self, model: nn.Module) -> None:
        self._training_values = []

    def rank_records(self) -> Optional[List[torch.Tensor]]:
        return [v.detach().cpu() for v in self._training_values] or None

    def merge_rank_records(self, records: List[Any]) -> None:
        for values in records:
            self._training_values.extend(v.to(self._training_values[0].device) if self._training_values else v
                                         for v in values or [])

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: "SegmentationEngine") -> Dict[str, Any]:
        self._params, self._direction = [], None  # do not hold the model past the round
        values, self._training_values = self._training_values, []
        if values:  # "last_epoch" / "training_batches": measured during training
            return {"uncertainty": client_uncertainty(values)}
        # "after_training", or a last epoch that saw no image (possible with DP's Poisson batches)
        if self._round_uncertainty == "mc_dropout" and not any(
            isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()
        ):
            logger.warning("mc_dropout uncertainty on a model without active dropout: U will be 0")
        if self.uncertainty_windows is not None and engine.window_sample_available:
            values = self._sampled_image_values(ctx, model, engine)
        else:
            values = self._whole_image_values(model, engine)
        return {"uncertainty": client_uncertainty(values)}

    def _whole_image_values(self, model: nn.Module, engine: "SegmentationEngine") -> List[torch.Tensor]:
        """Eq. 3 on every whole training image (sliding window in patch mode): ``(1,)`` per image."""
        if self._round_uncertainty == "evidential":
            return [evidential_image_uncertainty(logits) for _, _, logits, _ in engine.iterate_logits(model, "training")]
        values = []
        for batch in engine.loader("training"):
            images = batch["image"].to(engine.device)
            pixel_values = mc_dropout_pixel_uncertainty(model, images, self._round_mc_samples, forward=engine.predictor)
            values.append(image_uncertainty(pixel_values))
        return values

    def _sampled_image_values(self, ctx: RoundContext, model: nn.Module, engine: "WindowSampledEngine") -> List[torch.Tensor]:
        """Eq. 3 on this round's window sample: per sampled image, the mean pixel value over its sampled
        cells (0-d float64 each)."""
        sample = engine.window_sample("training", self.uncertainty_windows, ctx.round, SAMPLE_PURPOSE)
        if self._round_uncertainty == "evidential":
            return [masked_mean(evidential_pixel_uncertainty(logits), masks)
                    for _, logits, masks in engine.iterate_window_logits(model, "training", sample)]
        return [masked_mean(mc_dropout_pixel_uncertainty(model, windows, self._round_mc_samples).unsqueeze(1), masks)
                for _, windows, masks in engine.iterate_windows("training", sample)]


def _bind_direction(model: nn.Module, direction: Mapping[str, Any]) -> tuple:
    """The model's parameters in the direction's key order and the direction as one tensor per parameter,
    shaped, typed and placed like that parameter."""
    named = {n[len(_WRAPPER_PREFIX) :] if n.startswith(_WRAPPER_PREFIX) else n: p for n, p in model.named_parameters()}
    missing = [k for k in direction if k not in named]
    if missing:
        raise ValueError(f"neighbour direction has keys that are not model parameters: {missing[:5]}")
    params = [named[k] for k in direction]
    chunks = []
    for key, param in zip(direction, params):
        value = torch.as_tensor(direction[key])
        if value.numel() != param.numel():
            raise ValueError(f"direction[{key!r}] has {value.numel()} entries, the parameter {param.numel()}")
        chunks.append(value.reshape(param.shape).to(device=param.device, dtype=param.dtype))
    return params, chunks
