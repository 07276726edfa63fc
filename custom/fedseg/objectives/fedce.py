"""FedCE (Jiang et al., CVPR 2023), site side: the leave-one-out ("minus") model score, by NVFlare's helper.

Before local training the site builds, with ``PTFedCEHelper``, the global model without its own
contribution, ``(w_global - c_k w_k^prev) / (1 - c_k)`` (``c_k``: its contribution weight, sent by the
server in ``meta["fedce_coef"]``; ``w_k^prev``: its trained model of the previous round, kept in
``ctx.state_dir`` as ``fedce_previous_model.pt``), and scores it on its validation split:
``fedce_minus_val = 1 - Dice`` (the helper's convention: larger = the site contributed more, i.e. the model
without it does worse on its data). In round 0 there is no previous model and no weight: the helper's
minus model is then the global model itself. Only that scalar leaves the site, with the trained weights.
The server's half is NVFlare's ``FedCEModelAggregator`` (``fedseg.strategies.fedce``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_opt.pt.fedce import FedCEConstants, PTFedCEHelper
from torch import nn

from .base import ClientObjective, RoundContext
from .site_records import KeepsRoundRecords, cpu_copy

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SegmentationEngine

MINUS_SCORE = FedCEConstants.MINUS_MODEL_SCORE  # "fedce_minus_val"
WEIGHTS = FedCEConstants.CONTRIBUTION_WEIGHTS  # "fedce_coef"


class FedCEObjective(KeepsRoundRecords, ClientObjective):
    """The bundle's segmentation loss; declares ``fedce_minus_val`` (module notes)."""

    name = "fedce"
    declared_statistics = (MINUS_SCORE,)
    statistic_ranges = {MINUS_SCORE: (0.0, 1.0)}  # 1 - Dice
    records_name = "fedce_previous_model"

    def __init__(self, seg_loss: Optional[nn.Module] = None):
        super().__init__(seg_loss=seg_loss)
        self._score: Optional[float] = None

    def minus_model(self, ctx: RoundContext, model: nn.Module) -> nn.Module:
        """The helper's leave-one-out model from the received weights in ``model`` (left unchanged)."""
        weights = dict((ctx.server_meta or {}).get(WEIGHTS) or {})
        weight = PTFedCEHelper.get_contribution_weight(FLModel(params={}, meta={WEIGHTS: weights}), ctx.site)
        kept = self.site_records(ctx).before(ctx.round)
        return PTFedCEHelper.make_minus_model(model, kept[1]["model"] if kept else {}, weight)

    def local_training(self, engine: SegmentationEngine, model: nn.Module, ctx: RoundContext) -> Dict[str, float]:
        minus = self.minus_model(ctx, model)
        self._score = 1.0 - float(engine.evaluate(minus, "validation", metrics=("dice",))["dice"])
        del minus
        return engine.train(model, self, ctx)

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SegmentationEngine) -> Dict[str, Any]:
        self.site_records(ctx).save(ctx.round, {"model": cpu_copy(model.state_dict())})
        if self._score is None:
            raise RuntimeError(f"{ctx.site}: FedCE's minus-model score was not computed this round")
        score, self._score = self._score, None
        return {MINUS_SCORE: score}
