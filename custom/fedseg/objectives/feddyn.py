"""FedDyn (Acar et al., ICLR 2021), site side: the dynamic regulariser and its per-site state.

Round t, with ``theta`` the received global model and ``g_k`` this site's state (the gradient of its loss at
its previous local model, ``0`` before its first round), local training minimises
    L_k(w) - <g_k, w> + (alpha / 2) ||w - theta||^2                                    (Algorithm 1)
over the trainable parameters, and after training the state becomes ``g_k <- g_k - alpha (w_k - theta)``
(the first-order condition of that minimisation says this is the gradient of ``L_k`` at ``w_k``). The two
extra terms read only weights and the site's state: ``parameter_loss`` (added after privatisation under DP).
``g_k`` is kept in ``ctx.state_dir`` (``feddyn_state.pt``). The server's half is
``fedseg.strategies.feddyn``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from fedseg.method_options import MethodOptions, option

from .base import BatchOutput, ClientObjective, RoundContext
from .site_records import KeepsRoundRecords, cpu_copy

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine

META_KEY = "feddyn"


def feddyn_penalty(params: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]], alpha: float) -> torch.Tensor:
    """``sum_p -<g_p, w_p> + (alpha / 2) ||w_p - theta_p||^2`` over ``(w, theta, g)`` triples (scalar)."""
    total = torch.zeros((), dtype=params[0][0].dtype, device=params[0][0].device)
    for w, theta, g in params:
        total = total - (g * w).sum() + 0.5 * alpha * ((w - theta) ** 2).sum()
    return total


@dataclass(frozen=True)
class FedDynOptions(MethodOptions):
    """FedDyn's options, one set for both halves (the server sends its alpha; a different one at a site is an error)."""

    alpha: float = option(0.01, "the regulariser's weight (FedDyn paper: chosen from {0.1, 0.01, 0.001})")

    def __post_init__(self):
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"FedDyn alpha must be a finite number > 0, got {self.alpha!r}")
        self._set("alpha", float(self.alpha))


class FedDynObjective(KeepsRoundRecords, ClientObjective):
    """FedDyn's site half; options: :class:`FedDynOptions`; ``seg_loss``: the bundle's segmentation loss (set by the
    engine when None)."""

    name = "feddyn"
    records_name = "feddyn_state"
    options_class = FedDynOptions

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self._bound: List[Tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        sent = (ctx.server_meta or {}).get(META_KEY, {}).get("alpha")
        if sent is not None and float(sent) != self.alpha:
            raise ValueError(f"{ctx.site}: FedDyn alpha {self.alpha} differs from the server's {sent}")
        kept = self.site_records(ctx).before(ctx.round)
        state = kept[1]["grad"] if kept else {}
        self._bound = []
        for name, w in model.named_parameters():
            if not w.requires_grad:
                continue
            g = state.get(name)
            g = torch.zeros_like(w) if g is None else g.to(device=w.device, dtype=w.dtype)
            self._bound.append((name, w, w.detach().clone(), g))

    def data_loss(self, out: BatchOutput) -> torch.Tensor:
        return super().loss(out)

    def parameter_loss(self, model: Optional[nn.Module]) -> Optional[torch.Tensor]:
        """``-<g_k, w> + (alpha / 2) ||w - theta||^2`` of the bound parameters."""
        if not self._bound:
            raise RuntimeError("FedDynObjective needs the round's state: call begin_round(ctx, model) first")
        return feddyn_penalty([(w, theta, g) for _, w, theta, g in self._bound], self.alpha)

    def loss(self, out: BatchOutput) -> torch.Tensor:
        return self.data_loss(out) + self.parameter_loss(None)

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SiteEngine) -> Dict[str, Any]:
        """``g_k <- g_k - alpha (w_k - theta)``, kept for the next round."""
        grad = {name: (g - self.alpha * (w.detach() - theta)) for name, w, theta, g in self._bound}
        self.site_records(ctx).save(ctx.round, {"grad": cpu_copy(grad)})
        self._bound = []
        return {}
