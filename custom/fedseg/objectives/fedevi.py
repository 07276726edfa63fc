"""FedEvi client: evidential training and the surrogate-evaluation task.

Train task: the loss is evidential Dice + annealed KL (``EvidentialSegLoss``); it replaces the bundle's
segmentation loss. ``end_round`` then scores the freshly trained local model theta_k^r on the validation split:
A = mean over images of the pixel-mean aleatoric uncertainty and R_paper = mean over images of 1 / (pixel-mean
aleatoric uncertainty), sent with the weights. This is the model and the moment the authors' code uses (their site
scores its own model before it receives anything), so nothing needs keeping for a second task.

Surrogate task (the round's second task): with the received surrogate weights, G = mean over validation images of
the pixel-mean epistemic uncertainty. It cannot ride on the next round's train task: the surrogate is
sum_k beta_k^{r-1} theta_k^r over *this* round's local models, and this round's global model needs every site's G
of it (beta^r), so it exists only between the two tasks. Only these three scalars leave the site. "Image-level" here
follows the paper's Eqs. 6-7 (a sum over images of an uncertainty per image) and the reference code (pixel mean per
image); a pixel-wise 1/U_ale would be dominated by confident pixels, whose aleatoric uncertainty is ~1e-30.

At native resolution (patch mode) two sliding windows over every whole validation image cost about as
much as the local training. ``surrogate_windows`` = M (default ``DEFAULT_SURROGATE_WINDOWS``) computes
G, A and R_paper instead on M patch-size windows of the validation images drawn at the site, seeded per
site and round, the same windows for both models (``fedseg.uncertainty.window_sample``): an image's
uncertainty is the mean over its sampled cells' pixels, the three statistics the same means over the
sampled images. ``surrogate_windows=None`` (or ``"whole_image"``) keeps the whole images. Resize mode is
unaffected.

Where the pixel uncertainties are measured (whole images): ``uncertainty_grid="image"`` (default) at each
image's own size, the scores interpolated back as for the metrics; ``"network"`` on the grid the network
predicts on (the resized or rescaled image), as the reference code does (it never resizes back). The
epistemic part is clamped at 0 against rounding unless ``clamp_epistemic=False`` (reference code).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from fedseg.method_options import MethodOptions, option
from fedseg.uncertainty.window_sample import check_window_count
from fedseg.uncertainty.client_uncertainty import masked_mean
from fedseg.uncertainty.evidential import aleatoric_uncertainty, dirichlet_alpha, epistemic_uncertainty

from .base import BatchOutput, ClientObjective, RoundContext
from .evidential_losses import EvidentialSegLoss

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SegmentationEngine

SURROGATE_TASK = "evaluate_surrogate"
#: floor on an image's mean aleatoric uncertainty before taking 1/U (keeps R_paper finite)
MIN_ALEATORIC = 1e-12
#: validation windows per site and round in patch mode (chosen by measurement: docs/methods.md, FedEvi)
DEFAULT_SURROGATE_WINDOWS = 32
#: the window sample's ``purpose`` (part of its seed)
SAMPLE_PURPOSE = "fedevi_surrogate"
#: where the surrogate task measures pixel uncertainties (module docstring)
UNCERTAINTY_GRIDS = ("image", "network")


def _per_image_mean(pixel_map: torch.Tensor) -> torch.Tensor:
    """``(B, 1, *spatial)`` -> ``(B,)`` float64 mean over pixels."""
    return pixel_map.flatten(1).to(torch.float64).mean(dim=1)


@dataclass(frozen=True)
class FedEviSiteOptions(MethodOptions):
    """FedEvi's site options."""

    kl_weight: float = option(0.01, "lambda of the KL regulariser (paper: 0.01)")
    anneal_rounds: int = option(10, "KL ramp length in rounds (paper: 10)")
    dice_form: str = option("dice", "dice (reference code) or bayes_risk (expected-moment form)")
    eps: float = option(1e-5, "Dice smoothing")
    surrogate_windows: Union[int, str, None] = option(
        DEFAULT_SURROGATE_WINDOWS, "in patch mode, the validation windows the surrogate task draws per round (module "
        "docstring); None or whole_image: every whole validation image")
    uncertainty_grid: str = option("image", "where whole-image uncertainties are measured: image (each image's own "
                                   "size) or network (the network's grid; 2-D images)")
    clamp_epistemic: bool = option(True, "clamp the pixel epistemic uncertainty at 0, or keep it as computed")

    def __post_init__(self):
        self._set("surrogate_windows", check_window_count(self.surrogate_windows, "surrogate_windows"))
        if self.uncertainty_grid not in UNCERTAINTY_GRIDS:
            raise ValueError(f"uncertainty_grid must be one of {UNCERTAINTY_GRIDS}, got {self.uncertainty_grid!r}")
        self._set("clamp_epistemic", bool(self.clamp_epistemic))


class FedEviObjective(ClientObjective):
    """Evidential loss + G / A / R_paper for the server's weight update; options: :class:`FedEviSiteOptions`;
    ``seg_loss``: accepted for the common interface (FedEvi trains with its evidential loss instead)."""

    name = "fedevi"
    needs_class_logits = True
    declared_statistics = ("G", "A", "R_paper")
    statistic_tasks = (SURROGATE_TASK,)
    # mean epistemic / aleatoric uncertainties and a mean of 1/aleatoric: none is negative
    statistic_ranges = {"G": (0.0, math.inf), "A": (0.0, math.inf), "R_paper": (0.0, math.inf)}

    options_class = FedEviSiteOptions

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self.evidential_loss = EvidentialSegLoss(
            dice_form=self.dice_form, kl_weight=self.kl_weight, anneal_rounds=self.anneal_rounds, eps=self.eps
        )
        self._ctx: Optional[RoundContext] = None

    # --- train task -----------------------------------------------------------------------------

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        self._ctx = ctx

    def loss(self, out: BatchOutput) -> torch.Tensor:
        """Evidential Dice + ``kl_annealing_weight(round + 1)`` * KL; labels are ``(B, 1, H, W)`` class indices."""
        if self._ctx is None:
            raise RuntimeError("FedEviObjective.loss needs the round: call begin_round(ctx, model) first")
        return self.evidential_loss(out.logits, out.labels, self._ctx.round + 1)

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: "SegmentationEngine") -> Dict[str, Any]:
        """``{"A", "R_paper"}`` of the model as it left this round's training (sent with the weights)."""
        sample, grid = self._where(engine, ctx.round)
        aleatoric = _per_image(engine, model, aleatoric_uncertainty, sample, grid)
        return local_statistics(aleatoric)

    # --- surrogate task -------------------------------------------------------------------------

    def handle_task(self, task_name: str, ctx: RoundContext, model: nn.Module, engine: "SegmentationEngine") -> Dict[str, Any]:
        """``"evaluate_surrogate"``: ``model`` holds the surrogate; returns ``{"G"}`` (a float)."""
        if task_name != SURROGATE_TASK:
            return super().handle_task(task_name, ctx, model, engine)
        round_ = int((ctx.server_meta or {}).get("fedevi", {}).get("round", ctx.round))
        sample, grid = self._where(engine, round_)
        epistemic = functools.partial(epistemic_uncertainty, clamp=self.clamp_epistemic)
        return {"G": float(_per_image(engine, model, epistemic, sample, grid).mean())}

    def _where(self, engine: "SegmentationEngine", round_: int) -> Tuple[Optional[List], bool]:
        """Where the round's uncertainties are measured: this round's window sample (patch mode with
        ``surrogate_windows``; the same cells for G and A), and whether on the network's grid."""
        sample = None  # whole images, or this round's windows for both models
        if self.surrogate_windows is not None and engine.window_sample_available:
            sample = engine.window_sample("validation", self.surrogate_windows, int(round_), SAMPLE_PURPOSE)
        return sample, self.uncertainty_grid == "network" and not getattr(engine, "volumes", False)

    def surrogate_statistics(self, engine: "SegmentationEngine", surrogate: nn.Module, local_model: nn.Module,
                             round_: int) -> Dict[str, float]:
        """``{"G", "A", "R_paper"}`` of round ``round_`` with this objective's options (grid, clamp, window
        sample): :func:`surrogate_statistics`. Independent of which task runs it: the surrogate task, or any placement
        that holds the surrogate and this round's local model."""
        sample, grid = self._where(engine, round_)
        return surrogate_statistics(engine, surrogate, local_model, sample=sample, network_grid=grid,
                                    clamp_epistemic=self.clamp_epistemic)


def surrogate_statistics(engine: "SegmentationEngine", surrogate: nn.Module, local_model: nn.Module, sample: Optional[List] = None,
                         network_grid: bool = False, clamp_epistemic: bool = True) -> Dict[str, float]:
    """FedEvi's three site statistics on the validation split, as the authors' code computes them:

        G       = mean over validation images of the pixel-mean epistemic uncertainty of ``surrogate``
                  (sum_k beta_k^{r-1} theta_k^r: last round's weights over this round's local models)
        A       = the same mean of the aleatoric uncertainty of ``local_model`` (theta_k^r, the site's model right
                  after this round's local training, before it receives any other model)
        R_paper = mean over the same images of 1 / (pixel-mean aleatoric uncertainty)

    Both models in eval mode without gradients, one whole validation image at a time through the evaluation
    pipeline (no augmentation); ``network_grid``: on the grid the network predicts on (the reference code's), else at
    each image's own size; with a window ``sample`` (``engine.window_sample``) on its cells. Returns floats.
    """
    epistemic = functools.partial(epistemic_uncertainty, clamp=clamp_epistemic)
    gap = float(_per_image(engine, surrogate, epistemic, sample, network_grid).mean())
    aleatoric = _per_image(engine, local_model, aleatoric_uncertainty, sample, network_grid)
    return {"G": gap, **local_statistics(aleatoric)}


def local_statistics(aleatoric: torch.Tensor) -> Dict[str, float]:
    """``{"A", "R_paper"}`` from the per-image pixel-mean aleatoric uncertainties ``(N_val,)`` of a local model."""
    return {"A": float(aleatoric.mean()), "R_paper": float((1.0 / aleatoric.clamp_min(MIN_ALEATORIC)).mean())}


def _per_image(engine: "SegmentationEngine", model: nn.Module, uncertainty, sample: Optional[List] = None,
               network_grid: bool = False) -> torch.Tensor:
    """Pixel-mean uncertainty of every validation image, ``(N_val,)`` float64 on the CPU (at the image's own
    size, or on the network's grid with ``network_grid``); with a window ``sample`` (``engine.window_sample``),
    of every sampled image over its sampled cells' pixels."""
    values = []
    if sample is None:
        for _inputs, _labels, logits, _features in engine.iterate_logits(model, "validation", network_grid=network_grid):
            values.append(_per_image_mean(uncertainty(dirichlet_alpha(logits.float()))).cpu())
    else:
        for _entry, logits, masks in engine.iterate_window_logits(model, "validation", sample):
            values.append(masked_mean(uncertainty(dirichlet_alpha(logits.float())), masks).reshape(1).cpu())
    if not values:
        raise RuntimeError("the validation split is empty: FedEvi needs validation images")
    return torch.cat(values)
