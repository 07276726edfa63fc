"""FedCE recipe (Jiang et al., CVPR 2023): contribution-estimated aggregation by NVFlare's
``FedCEModelAggregator`` / ``PTFedCEHelper``. ``paper`` profile: FedEvi's (the FedEvi table reports FedCE)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedevi import PAPER_PROFILES
from fedseg.strategies.fedce import FedCEOptions


class FedCERecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the strategy's (:class:`FedCEOptions`: ``mode``, ``epsilon``)."""

    strategy_options = JobOptions(FedCEOptions)

    def __init__(self, *, name: str = "fedce", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="fedce", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
