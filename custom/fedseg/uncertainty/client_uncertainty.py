"""Client-level prediction uncertainty U_i for GraphFedSeg (paper Sec. 2.2.2, Eqs. 3-4; Sec. 3.7).

Three-level mean, as in the paper: a value per pixel, its mean over the image's pixels (Eq. 3), and
the mean of the image values over the client's training images (Eq. 4).

Pixel value, evidential (the paper's method): vacuity ``u = C / S`` of the Dirichlet with
``alpha = exp(z) + 1`` read from one forward pass, in (0, 1].

Pixel value, MC-dropout (the paper's Sec. 3.7 comparison, T = 5 or 10 samples): the paper does not
give its formula. The default here is the mutual information between the prediction and the dropout
mask (BALD), ``H[mean_t p_t] - mean_t H[p_t]``, divided by ``log C`` so that it lies in [0, 1] like the
vacuity. Reasons: vacuity measures missing evidence (epistemic), and the mutual information is the
epistemic part of MC-dropout's predictive entropy; it is 0 when the T passes agree (no dropout, or a
saturated network), whereas the predictive entropy would also count the class overlap of a single
deterministic prediction. ``measure="entropy"`` (normalised predictive entropy) and
``measure="variance"`` (class-mean variance of the T softmax outputs, in [0, 0.25]) are available.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Optional, Union

import torch
from torch import nn

from .evidential import dirichlet_alpha, vacuity

MC_MEASURES = ("mutual_information", "entropy", "variance")
#: client uncertainty estimators: evidential vacuity (the paper's) or MC-dropout (its Sec. 3.7 comparison)
UNCERTAINTY_METHODS = ("evidential", "mc_dropout")
#: when a site measures U_i on its training images: one extra pass with the trained model (the paper's
#: description), the logits its last local epoch computed anyway, or the mean over every training batch of every
#: local epoch of the batch's mean vacuity (the authors' code) — the last two evidential only (see GraphFedSeg docs)
UNCERTAINTY_PASSES = ("after_training", "last_epoch", "training_batches")
#: passes that read the logits training computes (no pass of their own)
TRAINING_PASSES = ("last_epoch", "training_batches")


def check_estimator(uncertainty: str, mc_samples: int, uncertainty_pass: str = "after_training") -> None:
    """Raise ``ValueError`` for an unknown estimator or pass, ``mc_samples < 1``, or "last_epoch" with
    MC-dropout (which needs its own T stochastic passes, so there is nothing to reuse from training).
    One check for the server strategy and the site objective."""
    if uncertainty not in UNCERTAINTY_METHODS:
        raise ValueError(f"uncertainty must be one of {UNCERTAINTY_METHODS}, got {uncertainty!r}")
    if int(mc_samples) < 1:
        raise ValueError(f"mc_samples must be >= 1, got {mc_samples}")
    if uncertainty_pass not in UNCERTAINTY_PASSES:
        raise ValueError(f"uncertainty_pass must be one of {UNCERTAINTY_PASSES}, got {uncertainty_pass!r}")
    if uncertainty_pass in TRAINING_PASSES and uncertainty != "evidential":
        raise ValueError(f"uncertainty_pass={uncertainty_pass!r} needs uncertainty='evidential' (MC-dropout needs its own passes)")


def evidential_pixel_uncertainty(logits: torch.Tensor) -> torch.Tensor:
    """The evidential pixel value, vacuity ``C / S``: ``(B, C, *spatial)`` logits -> ``(B, 1, *spatial)`` float32.

    Logits are clamped at 80 before ``exp`` (``dirichlet_alpha``), so saturated outputs stay finite.
    """
    return vacuity(dirichlet_alpha(logits.to(torch.float32)))


def image_uncertainty(pixel_values: torch.Tensor) -> torch.Tensor:
    """Eq. (3): each image's mean pixel value, ``(B, *)`` pixel values (either estimator's) -> ``(B,)`` float64."""
    return pixel_values.flatten(1).to(torch.float64).mean(dim=1)


def evidential_image_uncertainty(logits: torch.Tensor) -> torch.Tensor:
    """Eq. (3) with the evidential pixel value: ``(B, C, *spatial)`` logits -> ``(B,)`` float64."""
    return image_uncertainty(evidential_pixel_uncertainty(logits))


def masked_mean(pixel_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``pixel_values`` over the true pixels of ``mask`` (same shape, or broadcastable), as a 0-d
    float64 tensor: one image's value from the cells of a window sample
    (``fedseg.uncertainty.window_sample``), ``(n, 1, *patch)`` values and masks of its n windows.

    Raises:
        ValueError: an empty mask (no pixel to average).
    """
    mask = torch.broadcast_to(mask, pixel_values.shape)
    count = int(mask.sum())
    if count == 0:
        raise ValueError("masked_mean: the mask selects no pixel")
    return pixel_values.to(torch.float64)[mask].sum() / count


def mc_pixel_uncertainty(probs: torch.Tensor, measure: str = "mutual_information") -> torch.Tensor:
    """Pixel-wise uncertainty from T stochastic softmax outputs.

    Args:
        probs: ``(T, B, C, *spatial)`` class probabilities of T dropout samples.
        measure: "mutual_information" (default), "entropy" or "variance" (see module docstring).

    Returns:
        ``(B, *spatial)`` float64, >= 0.
    """
    if measure not in MC_MEASURES:
        raise ValueError(f"measure must be one of {MC_MEASURES}, got {measure!r}")
    probs = probs.to(torch.float64)
    if measure == "variance":
        return probs.var(dim=0, unbiased=False).mean(dim=1)
    num_classes = probs.shape[2]
    mean = probs.mean(dim=0)  # (B, C, *spatial)
    predictive_entropy = -torch.special.xlogy(mean, mean).sum(dim=1)
    if measure == "entropy":
        return predictive_entropy / math.log(num_classes)
    expected_entropy = -torch.special.xlogy(probs, probs).sum(dim=2).mean(dim=0)
    # >= 0 by Jensen; rounding can leave -1e-17 when all samples agree
    return (predictive_entropy - expected_entropy).clamp_min(0.0) / math.log(num_classes)


def mc_dropout_pixel_uncertainty(
    model: nn.Module,
    x: torch.Tensor,
    num_samples: int = 5,
    measure: str = "mutual_information",
    forward: Optional[Callable[[nn.Module, torch.Tensor], torch.Tensor]] = None,
) -> torch.Tensor:
    """MC-dropout pixel values: T stochastic passes over images (or windows) ``x`` ``(B, C_in, *spatial)``; the image
    values of Eq. (3) are :func:`image_uncertainty` of them.

    ``forward(model, x)`` gives the logits of one pass (default ``model(x)``; the engine's sliding-window
    predictor for whole images at native resolution).

    Dropout layers run in train mode (random masks), every other module in eval mode (e.g. BatchNorm
    uses its running statistics); the model's original train/eval flags are restored afterwards.

    Returns:
        ``(B, *spatial)`` float64 pixel values (:func:`mc_pixel_uncertainty`).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    modes = {module: module.training for module in model.modules()}
    try:
        model.eval()
        for module in model.modules():
            if isinstance(module, nn.modules.dropout._DropoutNd):
                module.train()
        with torch.no_grad():
            run = forward or (lambda m, images: m(images))
            probs = torch.stack([torch.softmax(run(model, x).float(), dim=1) for _ in range(num_samples)])
    finally:
        for module, training in modes.items():
            module.train(training)
    return mc_pixel_uncertainty(probs, measure)


def client_uncertainty(image_values: Union[torch.Tensor, Iterable[torch.Tensor]]) -> float:
    """Eq. (4): mean of the per-image values, given as one ``(N,)`` tensor or an iterable of ``(B,)`` batches."""
    if isinstance(image_values, torch.Tensor):
        values = image_values.reshape(-1)
    else:
        batches = [v.reshape(-1) for v in image_values]
        values = torch.cat(batches) if batches else torch.empty(0)
    if values.numel() == 0:
        raise ValueError("no images to average the uncertainty over")
    result = float(values.to(torch.float64).mean())
    if not math.isfinite(result):
        raise ValueError(f"client uncertainty is not finite: {result}")
    return result


__all__ = [
    "MC_MEASURES",
    "TRAINING_PASSES",
    "UNCERTAINTY_METHODS",
    "UNCERTAINTY_PASSES",
    "check_estimator",
    "client_uncertainty",
    "evidential_image_uncertainty",
    "evidential_pixel_uncertainty",
    "image_uncertainty",
    "masked_mean",
    "mc_dropout_pixel_uncertainty",
    "mc_pixel_uncertainty",
]
