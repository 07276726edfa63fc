"""FedRep (Collins et al., ICML 2021), site side: a shared body and a local head, trained in turn.

Each round the site first trains its head for ``head_epochs`` epochs with the body frozen, then the body for
``local_epochs`` epochs with the head frozen (the paper's alternating update), and sends the body only. The
head is FeatureUNet's 1x1 classifier (``head="conv1x1"``, default) or the full-resolution decoder block plus
the classifier (``"last_block"``): ``fedseg.networks.partition.head_state_keys``. Kept at the site like
FedBN's layers (``fedseg.objectives.local_layers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List

from torch import nn

from fedseg.method_options import MethodOptions, option
from fedseg.networks.partition import HEADS, head_state_keys

from .base import RoundContext
from .local_layers import LocalLayersObjective
from .site_records import refuse_dp

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine


@dataclass(frozen=True)
class FedRepSiteOptions(MethodOptions):
    """FedRep's site options."""

    head: str = option("conv1x1", "the layers kept at the site: conv1x1 or last_block (module notes)")
    head_epochs: int = option(1, "local epochs of the head update before the body's local_epochs")

    def __post_init__(self):
        if self.head not in HEADS:
            raise ValueError(f"FedRep head must be one of {HEADS}, got {self.head!r}")
        epochs = self.head_epochs
        if not (isinstance(epochs, int) and not isinstance(epochs, bool) and epochs >= 1):
            raise ValueError(f"FedRep head_epochs must be an integer >= 1, got {epochs!r}")


class FedRepObjective(LocalLayersObjective):
    """Head epochs (body frozen), then body epochs (head frozen); options: :class:`FedRepSiteOptions`; ``seg_loss``:
    the bundle's segmentation loss (set by the engine when None)."""

    name = "fedrep"
    records_name = "fedrep_local_layers"
    options_class = FedRepSiteOptions

    def local_keys(self, model: nn.Module) -> List[str]:
        return head_state_keys(model, self.head)

    def local_training(self, engine: SiteEngine, model: nn.Module, ctx: RoundContext) -> Dict[str, float]:
        """Head epochs (body frozen), then body epochs (head frozen); ``train_loss`` / ``steps`` over both."""
        refuse_dp(ctx, "FedRep", "its alternating head/body updates are not wired to DP-SGD")
        local = set(self.local_state_keys(model))
        params = dict(model.named_parameters())
        head = [p for n, p in params.items() if n in local]
        body = [p for n, p in params.items() if n not in local]
        try:
            _set_trainable(body, False)
            head_metrics = engine.train(model, self, ctx, epochs=self.head_epochs)
            _set_trainable(body, True)
            _set_trainable(head, False)
            body_metrics = engine.train(model, self, ctx)
        finally:  # frozen parameters get no gradient: the optimiser leaves them (and their moments) alone
            _set_trainable(body + head, True)
        steps = head_metrics["steps"] + body_metrics["steps"]
        loss = (head_metrics["train_loss"] * head_metrics["steps"] + body_metrics["train_loss"] * body_metrics["steps"]) / max(steps, 1.0)
        return {"train_loss": loss, "steps": steps, "head_train_loss": head_metrics["train_loss"], "head_steps": head_metrics["steps"]}


def _set_trainable(params, flag: bool) -> None:
    for p in params:
        p.requires_grad_(flag)
