"""Helpers the baselines' objectives share: their per-round site state and frozen model copies.

Each baseline that keeps state at a site between rounds (SCAFFOLD's control variate, MOON's and FedCE's
previous local model, FedDyn's linear term, Ditto's personal model, FedBN's / FedRep's local layers) keeps it
in a :class:`fedseg.engine.site_state.RoundRecords` under ``ctx.state_dir``: a restarted site process reads
it back, and a round the server re-sends starts from the state before that round.
"""

from __future__ import annotations

import copy
from typing import Dict, Mapping, Optional

import torch
from torch import nn

from fedseg.engine.site_state import RoundRecords

from .base import RoundContext


class KeepsRoundRecords:
    """Mixin: ``self.site_records(ctx)`` is this objective's :class:`RoundRecords` (file ``records_name``)."""

    records_name: str = ""
    _records: Optional[RoundRecords] = None
    _records_for: Optional[tuple] = None

    def site_records(self, ctx: RoundContext) -> RoundRecords:
        ident = (ctx.state_dir, ctx.job_key)
        if self._records is None or self._records_for != ident:
            self._records = RoundRecords(ctx.state_dir, self.records_name, ctx.job_key)
            self._records_for = ident
        return self._records


def cpu_copy(state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A detached CPU copy of a ``{name: tensor}`` mapping (a record must not alias live tensors)."""
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in eval mode whose parameters need no gradient (a fixed reference model)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def refuse_dp(ctx: RoundContext, method: str, reason: str) -> None:
    """Stop with a clear error when differential privacy is requested of a method that cannot provide it."""
    if (ctx.train_config or {}).get("dp_target_epsilon") is not None:
        raise ValueError(f"{method} does not support differential privacy (dp_target_epsilon is set): {reason}")
