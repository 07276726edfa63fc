"""FedAdam recipe (Reddi et al., ICLR 2021, "Adaptive Federated Optimization"): FedAvg's local training, Adam
on the server over the averaged update (NVFlare's FedOpt server step). ``server_optimizer="sgd"`` with
``server_lr=1, momentum=0.6`` is NVFlare's FedOpt default. ``paper`` profile: FedAvg's."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES
from fedseg.strategies.fedopt import FedOptOptions


class FedAdamRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the strategy's (:class:`FedOptOptions`) but ``weighting``:
    ``server_optimizer`` ("adam", "sgd", "adagrad"), ``server_lr``, ``beta1``, ``beta2``, ``tau`` (Adam's epsilon),
    ``momentum`` (SGD only). Its ``server_optimizer`` and ``server_lr`` are FedOpt's, not the server step's."""

    strategy_options = JobOptions(FedOptOptions, names=("server_optimizer", "server_lr", "beta1", "beta2", "tau",
                                                        "momentum"))

    def __init__(self, *, name: str = "fedadam", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="fedadam", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
