"""FedProx (Li et al., MLSys 2020): the segmentation loss plus a proximal term to the received global model.

``L = L_seg + (mu / 2) ||w - w_global||^2`` over the trainable parameters, with NVFlare's
``PTFedProxLoss`` computing the term. ``w_global`` is a frozen copy of the weights the site received this
round. The term reads no data (``parameter_loss``): under DP its exact gradient is added after
privatisation. ``mu = 0`` is FedAvg: the term is still computed (it is exactly 0 and adds exactly 0 to every
gradient), so the ablation row ``prox0=fedprox:mu=0`` runs the same code path as ``fedprox``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional

import torch
from nvflare.app_opt.pt.fedproxloss import PTFedProxLoss
from torch import nn

from fedseg.method_options import MethodOptions, option

from .base import BatchOutput, ClientObjective, RoundContext
from .site_records import frozen_copy

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine


@dataclass(frozen=True)
class FedProxOptions(MethodOptions):
    """FedProx's site options."""

    mu: float = option(0.01, "weight of the proximal term (NVFlare's PTFedProxLoss default; the FedProx paper tunes it "
                       "over {0.001, 0.01, 0.1, 1})")

    def __post_init__(self):
        if not (isinstance(self.mu, (int, float)) and math.isfinite(self.mu) and self.mu >= 0):
            raise ValueError(f"FedProx mu must be a finite number >= 0, got {self.mu!r}")
        self._set("mu", float(self.mu))


class FedProxObjective(ClientObjective):
    """The bundle's loss plus ``(mu / 2) ||w - w_global||^2``; options: :class:`FedProxOptions`; ``seg_loss``: the
    bundle's segmentation loss (set by the engine when None)."""

    name = "fedprox"
    options_class = FedProxOptions

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self.prox = PTFedProxLoss(mu=self.mu)
        self._model: Optional[nn.Module] = None
        self._anchor: Optional[nn.Module] = None

    def anchor(self, model: nn.Module, reference: nn.Module) -> None:
        """Penalise ``model``'s distance to ``reference`` (copied and frozen) from now on."""
        self._model, self._anchor = model, frozen_copy(reference)

    def release(self) -> None:
        """Drop the model references (after the round)."""
        self._model = self._anchor = None

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        self.anchor(model, model)  # the weights just received

    def data_loss(self, out: BatchOutput) -> torch.Tensor:
        return super().loss(out)

    def parameter_loss(self, model: Optional[nn.Module]) -> Optional[torch.Tensor]:
        """``(mu / 2) sum_p ||w_p - w_global_p||^2`` of the bound model (scalar tensor)."""
        if self._anchor is None:
            raise RuntimeError("FedProxObjective needs the global model: call begin_round(ctx, model) first")
        return self.prox(self._model, self._anchor)

    def loss(self, out: BatchOutput) -> torch.Tensor:
        return self.data_loss(out) + self.parameter_loss(None)

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SiteEngine) -> Dict[str, Any]:
        self.release()
        return {}
