"""Ditto (Li et al., ICML 2021), site side: NVFlare's ``PTDittoHelper`` on our engine.

Each round the site trains two models from the weights it received (``w_global``):
  1. the global model: the bundle's segmentation loss for ``local_epochs`` epochs (FedAvg's local update),
     sent to the server;
  2. its personal model ``v``: ``L_seg(v) + (lambda / 2) ||v - w_global||^2`` (the helper's
     ``PTFedProxLoss(ditto_lambda)``) for ``personal_epochs`` epochs (default ``local_epochs``), kept at the
     site. Round 0 starts ``v`` from ``w_global``.
``v`` and its optimiser state are kept after every round in ``ctx.state_dir`` (``ditto_personal.pt``, keyed
by round; the helper's own single file would let a re-sent round train ``v`` twice). After training the task
``submit_model`` returns ``v`` for the personalised and cross-site evaluations. lambda -> infinity pins
``v`` to ``w_global`` (tested); lambda = 0 is local training.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional

import torch
from nvflare.app_opt.pt.ditto import PTDittoHelper
from torch import nn

from fedseg.fl.protocol import SUBMIT_MODEL_TASK
from fedseg.config import BASE_TRAIN_CONFIG
from fedseg.method_options import MethodOptions, option

from .base import ClientObjective, RoundContext, UnknownTaskError
from .fedprox import FedProxObjective
from .site_records import KeepsRoundRecords, cpu_copy, refuse_dp

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine


class RoundKeyedDittoHelper(PTDittoHelper):
    """NVFlare's Ditto helper whose storage is the objective's round-keyed site records and whose local
    training is the engine's (``local_train``). ``fresh_optimizer_state`` is the optimiser's state as built, for a
    round with no personal model kept before it."""

    def __init__(self, records, **kwargs):
        super().__init__(**kwargs)
        self.records = records
        self.fresh_optimizer_state = copy.deepcopy(self.optimizer.state_dict())

    def load_model(self, global_weights, round_: int = 0) -> Optional[int]:
        """``v`` (and its optimiser state) after the newest round ``< round_``, else ``global_weights``."""
        kept = self.records.before(round_)
        if kept is None:
            self.model.load_state_dict(global_weights)
            self.optimizer.load_state_dict(self.fresh_optimizer_state)
            self.epoch_of_start_time = 0
            return None
        self.model.load_state_dict(kept[1]["model"])
        self.optimizer.load_state_dict(kept[1]["optimizer"])
        self.epoch_of_start_time = kept[0] + 1
        return kept[0]

    def save_model(self, round_: int = 0) -> None:
        self.records.save(round_, {"model": cpu_copy(self.model.state_dict()),
                                   "optimizer": copy.deepcopy(self.optimizer.state_dict())})

    def local_train(self, engine: SiteEngine, model_global: nn.Module, ctx: RoundContext) -> Dict[str, float]:
        """``model_epochs`` epochs of ``L_seg(v) + prox_criterion(v, w_global)`` with the engine."""
        objective = FedProxObjective(mu=self.prox_criterion.mu, seg_loss=self.criterion)
        objective.prox = self.prox_criterion
        objective.anchor(self.model, model_global)
        try:
            return engine.train(self.model, objective, ctx, epochs=self.model_epochs)
        finally:
            objective.release()


@dataclass(frozen=True)
class DittoOptions(MethodOptions):
    """Ditto's site options."""

    ditto_lambda: float = option(0.1, "weight of the personal model's proximal term (PTDittoHelper's default; the Ditto "
                                 "paper tunes lambda per data set)")
    personal_epochs: Optional[int] = option(None, "local epochs of the personal model (None: local_epochs)")

    def __post_init__(self):
        lam, epochs = self.ditto_lambda, self.personal_epochs
        if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
            raise ValueError(f"Ditto lambda must be a finite number >= 0, got {lam!r}")
        if epochs is not None and not (isinstance(epochs, int) and epochs >= 1):
            raise ValueError(f"Ditto personal_epochs must be None or an integer >= 1, got {epochs!r}")
        self._set("ditto_lambda", float(lam))


class DittoObjective(KeepsRoundRecords, ClientObjective):
    """A global and a personal model per site (NVFlare's ``PTDittoHelper``); options: :class:`DittoOptions`;
    ``seg_loss``: the bundle's segmentation loss (set by the engine when None)."""

    name = "ditto"
    weight_tasks = (SUBMIT_MODEL_TASK,)
    records_name = "ditto_personal"
    options_class = DittoOptions

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self.helper: Optional[RoundKeyedDittoHelper] = None
        self._received: Dict[str, torch.Tensor] = {}

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        self._received = cpu_copy(model.state_dict())  # w_global of this round

    def _helper(self, engine: SiteEngine, ctx: RoundContext) -> RoundKeyedDittoHelper:
        if self.helper is None:
            personal = engine.build_network()
            optimizer = engine.make_optimizer(personal)
            local_epochs = ctx.train_config.get("local_epochs", BASE_TRAIN_CONFIG["local_epochs"])
            epochs = int(self.personal_epochs or local_epochs)
            self.helper = RoundKeyedDittoHelper(
                self.site_records(ctx), criterion=self.seg_loss, model=personal, optimizer=optimizer,
                device=engine.device, app_dir=ctx.state_dir or os.getcwd(), ditto_lambda=self.ditto_lambda,
                model_epochs=epochs,
            )
        self.helper.records = self.site_records(ctx)
        return self.helper

    def local_training(self, engine: SiteEngine, model: nn.Module, ctx: RoundContext) -> Dict[str, float]:
        """The global model's update (sent), then the personal model's (kept); metrics of both."""
        refuse_dp(ctx, "Ditto", "it trains a second (personal) model whose privacy accounting is not wired")
        metrics = engine.train(model, self, ctx)  # also hands this objective the bundle's loss
        helper = self._helper(engine, ctx)
        global_model = engine.build_network()
        global_model.load_state_dict(self._received)
        helper.load_model(self._received, ctx.round)
        personal = helper.local_train(engine, global_model, ctx)
        helper.save_model(ctx.round)
        return {**metrics, "personal_train_loss": personal["train_loss"], "personal_steps": personal["steps"]}

    def handle_weight_task(self, task_name: str, ctx: RoundContext, model: nn.Module, engine: SiteEngine):
        """``submit_model``: the personal model after this site's last training."""
        if task_name != SUBMIT_MODEL_TASK:
            raise UnknownTaskError(f"objective {self.name!r} does not handle weight task {task_name!r}")
        kept = self.site_records(ctx).before(ctx.round)
        if kept is None:
            raise RuntimeError(f"{ctx.site}: no personal model kept: this site never trained in this job")
        return dict(kept[1]["model"]), {}, {}
