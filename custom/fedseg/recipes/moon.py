"""MOON recipe (Li, He and Song, CVPR 2021): model-contrastive loss on the pooled U-Net bottleneck, FedAvg
aggregation. ``paper`` profile: FVAC's (the FVAC table reports MOON on vessels)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.objectives.moon import MOONOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fvac import PAPER_PROFILES
from fedseg.strategies.fedavg import FedAvgOptions


class MOONRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the objective's (:class:`MOONOptions`: ``mu``, ``temperature``,
    ``representation``); FedAvg's sample-weighted average at the server."""

    strategy_options = JobOptions(FedAvgOptions, names=(), fixed={"weighting": "samples"})
    objective_options = JobOptions(MOONOptions)

    def __init__(self, *, name: str = "moon", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="moon", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
