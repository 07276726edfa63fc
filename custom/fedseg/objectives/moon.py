"""MOON (Li, He and Song, CVPR 2021): model-contrastive learning on a representation of the image.

``L = L_seg + mu * l_con`` with, for each training image (patch),
    l_con = -log( exp(sim(z, z_glob) / tau) / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)) )
where ``sim`` is the cosine similarity and ``z``, ``z_glob``, ``z_prev`` are the representations of the image
by the model being trained, the global model received this round, and this site's model after its previous
round (both frozen, eval mode, no gradient). The representation is the U-Net's ``bottleneck`` feature map
(its deepest, most global map) averaged over space: ``(B, C)``; MOON's projection head is not added (it
would change the network every other method trains). In round 0 there is no previous model: the received
global model stands in (MOON's reference code starts its model pool the same way), so ``l_con`` starts at
``log 2``. The previous model is kept in ``ctx.state_dir`` (``moon_previous_model.pt``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from fedseg.method_options import MethodOptions, option
from fedseg.networks.feature_taps import network_features

from .base import BatchOutput, ClientObjective, RoundContext
from .site_records import KeepsRoundRecords, cpu_copy, frozen_copy

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine


def pooled_representation(feature_map: torch.Tensor) -> torch.Tensor:
    """``(B, C, *spatial) -> (B, C)``: the mean over the spatial axes."""
    return feature_map.flatten(2).mean(dim=2)


def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """MOON's ``l_con`` averaged over the batch; ``z``, ``z_glob``, ``z_prev``: ``(B, D)``. The positive pair is
    ``(z, z_glob)``, the negative ``(z, z_prev)`` (cross-entropy with target 0 over the two logits)."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


@dataclass(frozen=True)
class MOONOptions(MethodOptions):
    """MOON's site options."""

    mu: float = option(1.0, "weight of the contrastive term (MOON paper: 1 to 10 depending on the data set)")
    temperature: float = option(0.5, "tau (MOON paper: 0.5)")
    representation: str = option("bottleneck", "the FeatureUNet feature map the term compares")

    def __post_init__(self):
        if not (math.isfinite(self.mu) and self.mu >= 0):
            raise ValueError(f"MOON mu must be a finite number >= 0, got {self.mu!r}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"MOON temperature must be > 0, got {self.temperature!r}")
        self._set("mu", float(self.mu))
        self._set("temperature", float(self.temperature))


class MOONObjective(KeepsRoundRecords, ClientObjective):
    """The bundle's loss plus MOON's model-contrastive term; options: :class:`MOONOptions`; ``seg_loss``: the bundle's
    segmentation loss (set by the engine when None)."""

    name = "moon"
    needs_features = True
    records_name = "moon_previous_model"
    options_class = MOONOptions

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self.feature_roles = (self.representation,)
        self._global: Optional[nn.Module] = None
        self._previous: Optional[nn.Module] = None

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        names = getattr(model, "feature_names", None)
        if names is not None and self.representation not in names:
            raise ValueError(f"MOON representation {self.representation!r} is not a feature of the network; choose from {names}")
        self._global = frozen_copy(model)
        kept = self.site_records(ctx).before(ctx.round)
        self._previous = frozen_copy(model)
        if kept is not None:
            self._previous.load_state_dict(kept[1]["model"])

    def _represent(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return pooled_representation(network_features(model, inputs, self.feature_roles)[1][self.representation])

    def loss(self, out: BatchOutput) -> torch.Tensor:
        if self._global is None:
            raise RuntimeError("MOONObjective.loss needs the global model: call begin_round(ctx, model) first")
        seg = super().loss(out)
        z = pooled_representation(out.features[self.representation])
        with torch.no_grad():
            z_glob = self._represent(self._global, out.inputs)
            z_prev = self._represent(self._previous, out.inputs)
        return seg + self.mu * model_contrastive_loss(z, z_glob, z_prev, self.temperature)

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SiteEngine) -> Dict[str, Any]:
        self.site_records(ctx).save(ctx.round, {"model": cpu_copy(model.state_dict())})
        self._global = self._previous = None
        return {}
