"""FedAdam recipe (Reddi et al., ICLR 2021, "Adaptive Federated Optimization"): FedAvg's local training, Adam
on the server over the averaged update (NVFlare's FedOpt server step). ``server_optimizer="sgd"`` with
``server_lr=1, momentum=0.6`` is NVFlare's FedOpt default. ``paper`` profile: FedAvg's."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES


class FedAdamRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): server_optimizer ("adam", "sgd", "adagrad"), server_lr
    (1e-2), beta1 (0.9), beta2 (0.99), tau (1e-3, Adam's epsilon), momentum (SGD only)."""

    def __init__(self, *, name: str = "fedadam", profile: str = "default", num_rounds: Optional[int] = None,
                 server_optimizer: str = "adam", server_lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3, momentum: float = 0.0, **options: Any):
        super().__init__(
            name=name, method="fedadam",
            strategy_args={"server_optimizer": server_optimizer, "server_lr": server_lr, "beta1": beta1, "beta2": beta2,
                           "tau": tau, "momentum": momentum},
            objective_args={},
            profile=profile, profiles=PAPER_PROFILES, num_rounds=num_rounds, **options,
        )
