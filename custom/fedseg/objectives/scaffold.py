"""SCAFFOLD (Karimireddy et al., ICML 2020), site side: NVFlare's ``PTScaffoldHelper`` on our engine.

Per round, with ``c`` the server's control variate (received as the extra model ``scaffold_c_global``) and
``c_i`` this site's own:
  * after every optimiser step ``w <- w - lr (c - c_i)`` (``PTScaffoldHelper.model_update``, through the
    engine's ``after_step`` hook, with the step's learning rate);
  * after local training ``c_i+ = c_i - c + (w_global - w) / (K lr)`` (SCAFFOLD's option II, K = the round's
    steps; ``terms_update``), and the site sends ``delta c_i = c_i+ - c_i`` as the extra model
    ``scaffold_c_delta`` (trainable parameters only) next to its weights.
``c_i`` is the site's state between rounds: kept in ``ctx.state_dir`` (``scaffold_control.pt``) so that a
restarted site process continues with it; a round the server re-sends starts from ``c_i`` before that round.
The correction is defined for plain SGD; with the bundle's Adam it is applied after each Adam step, as
NVFlare's helper does with whatever optimiser a client uses (docs/methods.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

import torch
from nvflare.app_opt.pt.scaffold import PTScaffoldHelper, get_lr_values
from torch import nn

from .base import ClientObjective, RoundContext
from .site_records import KeepsRoundRecords, cpu_copy, frozen_copy

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine

#: extra model the server sends: the global control variate c
CONTROL_GLOBAL = "scaffold_c_global"
#: extra model a site returns: its control delta c_i+ - c_i
CONTROL_DELTA = "scaffold_c_delta"


class ScaffoldObjective(KeepsRoundRecords, ClientObjective):
    """The bundle's segmentation loss with SCAFFOLD's control-variate correction (module notes)."""

    name = "scaffold"
    partial_models = (CONTROL_DELTA,)
    records_name = "scaffold_control"

    def __init__(self, seg_loss: Optional[nn.Module] = None):
        super().__init__(seg_loss=seg_loss)
        self.helper: Optional[PTScaffoldHelper] = None
        self._model_id: Optional[int] = None
        self._c_global: Dict[str, torch.Tensor] = {}
        self._c_local: Dict[str, torch.Tensor] = {}
        self._global_model: Optional[nn.Module] = None
        self._lr: Optional[float] = None
        self._delta: Dict[str, Any] = {}

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        if CONTROL_GLOBAL not in ctx.models:
            raise ValueError(f"{ctx.site}: the SCAFFOLD task carries no global control ('{CONTROL_GLOBAL}'); "
                             "the server must run the scaffold strategy")
        if self.helper is None or self._model_id != id(model):
            self.helper = PTScaffoldHelper()
            self.helper.init(model)  # c and c_i start at zero
            self._model_id = id(model)
        kept = self.site_records(ctx).before(ctx.round)
        zeros = {k: torch.zeros_like(v) for k, v in self.helper.c_local.state_dict().items()}
        self.helper.c_local.load_state_dict({**zeros, **(kept[1]["c_local"] if kept else {})})
        self.helper.load_global_controls(ctx.models[CONTROL_GLOBAL])
        self._c_global, self._c_local = self.helper.get_params()
        self._global_model = frozen_copy(model)  # w_global, for c_i+ = ... + (w_global - w) / (K lr)
        self._lr, self._delta = None, {}

    def after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._lr = get_lr_values(optimizer)[0]
        self.helper.model_update(model, self._lr, self._c_global, self._c_local)

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SiteEngine) -> Dict[str, Any]:
        if self._lr is None:
            raise RuntimeError(f"{ctx.site}: SCAFFOLD trained no step this round (empty training split?)")
        self.helper.terms_update(model, self._lr, self._c_global, self._c_local, self._global_model)
        self.site_records(ctx).save(ctx.round, {"c_local": cpu_copy(self.helper.c_local.state_dict())})
        self._delta = {k: torch.as_tensor(v) for k, v in self.helper.get_delta_controls().items()}
        self._global_model = None
        return {}

    def outgoing_models(self, ctx: RoundContext) -> Dict[str, Dict[str, torch.Tensor]]:
        """``{"scaffold_c_delta": {parameter: delta c_i}}`` of this round's training."""
        if not self._delta:
            raise RuntimeError(f"{ctx.site}: no SCAFFOLD control delta computed this round")
        return {CONTROL_DELTA: self._delta}
