"""FedAvgM recipe (Hsu et al., 2019, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification"): FedAvg's local training, a server SGD step with momentum over the averaged update (NVFlare's FedOpt
server step with ``torch.optim.SGD``). The suite's FedAvg with a larger server step: on the real retina federation it
closes most of FedAvg's gap to the pooled model (docs/methods.md, FedAvgM), so a method's lead
over FedAvg is best read against it too. ``paper`` profile: FedAvg's."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES
from fedseg.strategies.fedopt import FedOptOptions
from fedseg.strategies.server_step import DEFAULT_SERVER_MOMENTUM

#: server momentum: NVFlare's FedOpt default (the server step's default too). Measured on the real retina federation at
#: 100 rounds: 0.6 holds its lead over FedAvg (+0.085 Dice per seed, three seeds), 0.9 (Hsu et al.'s usual value) leads
#: at 30 rounds, then oscillates and ends below FedAvg (-0.023, seed 0; docs/methods.md, FedAvgM).
DEFAULT_MOMENTUM = DEFAULT_SERVER_MOMENTUM


class FedAvgMRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the strategy's (:class:`FedOptOptions`) ``server_lr`` (here 1.0:
    the averaged update itself, as FedAvg), ``momentum`` (here :data:`DEFAULT_MOMENTUM`; 0 is FedAvg's step) and
    ``weighting``; the server optimiser is SGD. Its ``server_lr`` is FedOpt's, not the server step's."""

    strategy_options = JobOptions(FedOptOptions, names=("server_lr", "momentum", "weighting"),
                                  fixed={"server_optimizer": "sgd"},
                                  defaults={"server_lr": 1.0, "momentum": DEFAULT_MOMENTUM})

    def __init__(self, *, name: str = "fedavgm", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="fedavgm", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
