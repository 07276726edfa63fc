"""FedOpt / FedAdam (Reddi et al., ICLR 2021): a server optimiser over the sites' averaged update.

FedAvg's sample-weighted average followed by the suite's server step (``fedseg.strategies.server_step``): with
``delta = sum_k p_k w_k - w`` the server treats ``-delta`` as a gradient and takes one step of its optimiser on the
global model's trainable parameters; buffers (batch-norm statistics) take the average. ``server_optimizer="adam"`` is
FedAdam: Adam(lr = ``server_lr``, betas = (``beta1``, ``beta2``), eps = ``tau``); ``"sgd"`` with ``momentum`` is FedAvgM.
The optimiser's moments are part of the server checkpoint. Every other method takes the same step through its
``server_optimizer`` option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

from fedseg.method_options import MethodOptions, option

from .aggregation import check_weighting, site_weights, weighted_average
from .base import ClientUpdate, Exchange, Params, ServerStrategy
from .server_step import ServerStep, ServerStepConfig

SERVER_OPTIMIZERS = ("adam", "sgd", "adagrad")


@dataclass(frozen=True)
class FedOptOptions(MethodOptions):
    """FedOpt's server options (FedAdam's defaults)."""

    server_optimizer: str = option("adam", "adam (FedAdam), sgd (with momentum: FedAvgM; NVFlare's FedOpt default is SGD, "
                                   "lr 1.0, momentum 0.6) or adagrad (FedAdagrad)")
    server_lr: float = option(1e-2, "the server learning rate (eta)")
    beta1: float = option(0.9, "Adam's first moment decay (FedAdam: 0.9)")
    beta2: float = option(0.99, "Adam's second moment decay (FedAdam: 0.99)")
    tau: float = option(1e-3, "adaptivity / epsilon of Adam and Adagrad (FedAdam: 1e-3)")
    momentum: float = option(0.0, "SGD momentum")
    weighting: str = option("samples", "samples or uniform average of the sites' models")

    def __post_init__(self):
        if self.server_optimizer not in SERVER_OPTIMIZERS:
            raise ValueError(f"server_optimizer must be one of {SERVER_OPTIMIZERS}, got {self.server_optimizer!r}")
        check_weighting(self.weighting)
        for name in ("server_lr", "beta1", "beta2", "tau", "momentum"):
            self._set(name, float(getattr(self, name)))
        self.step_config()  # the server step checks lr, betas, eps and momentum (one set of checks for every method)

    def step_config(self) -> ServerStepConfig:
        return ServerStepConfig(self.server_optimizer, self.server_lr, self.momentum, (self.beta1, self.beta2), self.tau)


class FedOptStrategy(ServerStrategy):
    """FedAvg's average, then a server optimiser step; options: :class:`FedOptOptions`."""

    name = "fedopt"
    he_refusal_reason = ("FedAdam and FedAvgM step the global model with an optimiser whose moments the server keeps of the model's update, which needs the update in the clear")
    objective = "fedavg"
    needs_network = True
    options_class = FedOptOptions
    #: the server optimiser's step and its NVFlare generator (built by ``start``)
    step: ServerStep
    generator: Any

    def step_config(self) -> ServerStepConfig:
        return self.options.step_config()

    def optimizer_args(self) -> Dict[str, Any]:
        """NVFlare's ``optimizer_args`` form of the server optimiser (recorded on the generator)."""
        return self.step_config().optimizer_args()

    def start(self, clients: List[str], initial_params: Params) -> None:
        super().start(clients, initial_params)
        network = self.network_factory().cpu()
        network.load_state_dict(self._global)
        self.step = ServerStep(self.step_config(), network)
        self.generator = self.step.generator

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        weights = site_weights(self.weighting, {s: updates[s].n_samples for s in sites}, sites)
        average = weighted_average([updates[s].params for s in sites], weights)
        self._global, update_norm = self.step.step(self._global, average)
        return {"aggregation_weight": dict(zip(sites, weights)), "average_update_norm": update_norm,
                "server_lr": self.step.lr}

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "server_optimizer_state": self.step.state_dict()["optimizer"]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.generator.model.load_state_dict(self._global)
        self.generator.optimizer.load_state_dict(state["server_optimizer_state"])
