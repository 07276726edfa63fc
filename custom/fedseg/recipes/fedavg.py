"""FedAvg recipe: the baseline every method is compared with."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.strategies.fedavg import FedAvgOptions

# McMahan et al. report no segmentation setting; "paper" here mirrors the GraphFedSeg comparison
# (Adam 5e-4, batch 4, E = 2, 250 rounds) so FedAvg numbers line up with the headline method.
PAPER_PROFILES = {
    "paper": {
        "num_rounds": 250,
        "train_config": {"data_profile": "paper", "image_size": 384, "learning_rate": 5e-4, "batch_size": 4, "local_epochs": 2},
    }
}


class FedAvgRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the strategy's (:class:`FedAvgOptions`: ``weighting``, and
    ``aggregation="median"`` / ``"trimmed_mean"`` with ``trim``: robust FedAvg for federations that cannot trust every
    site)."""

    strategy_options = JobOptions(FedAvgOptions)

    def __init__(self, *, name: str = "fedavg", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="fedavg", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
