"""FedOpt / FedAdam (Reddi et al., ICLR 2021): a server optimiser over the sites' averaged update.

FedAvg's sample-weighted average followed by the suite's server step (``fedseg.strategies.server_step``): with
``delta = sum_k p_k w_k - w`` the server treats ``-delta`` as a gradient and takes one step of its optimiser on the
global model's trainable parameters; buffers (batch-norm statistics) take the average. ``server_optimizer="adam"`` is
FedAdam: Adam(lr = ``server_lr``, betas = (``beta1``, ``beta2``), eps = ``tau``); ``"sgd"`` with ``momentum`` is FedAvgM.
The optimiser's moments are part of the server checkpoint. Every other method takes the same step through its
``server_optimizer`` option.
"""

from __future__ import annotations

from typing import Any, Dict, List

from .aggregation import site_weights, weighted_average
from .base import ClientUpdate, Exchange, Params, ServerStrategy
from .server_step import ServerStep, ServerStepConfig

SERVER_OPTIMIZERS = ("adam", "sgd", "adagrad")


class FedOptStrategy(ServerStrategy):
    """Args:
        server_optimizer: ``"adam"`` (FedAdam), ``"sgd"`` (with ``momentum``: NVFlare's FedOpt default is SGD,
            lr 1.0, momentum 0.6) or ``"adagrad"`` (FedAdagrad).
        server_lr: the server learning rate (eta).
        beta1, beta2: Adam's moment decays (FedAdam: 0.9, 0.99).
        tau: adaptivity / epsilon of Adam and Adagrad (FedAdam: 1e-3).
        momentum: SGD momentum.
        weighting: ``"samples"`` or ``"uniform"`` average of the sites' models.
    """

    name = "fedopt"
    objective = "fedavg"
    needs_network = True

    def __init__(self, server_optimizer: str = "adam", server_lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3, momentum: float = 0.0, weighting: str = "samples"):
        super().__init__()
        if server_optimizer not in SERVER_OPTIMIZERS:
            raise ValueError(f"server_optimizer must be one of {SERVER_OPTIMIZERS}, got {server_optimizer!r}")
        if weighting not in ("samples", "uniform"):
            raise ValueError(f"weighting must be 'samples' or 'uniform', got {weighting!r}")
        self.server_optimizer = server_optimizer
        self.server_lr = float(server_lr)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.tau = float(tau)
        self.momentum = float(momentum)
        self.weighting = weighting
        self.step_config()  # the server step checks lr, betas, eps and momentum (one set of checks for every method)
        self.step: ServerStep = None
        self.generator = None  # the step's NVFlare generator, after start

    def config(self) -> Dict[str, Any]:
        return self.attributes_config("server_optimizer", "server_lr", "beta1", "beta2", "tau", "momentum", "weighting")

    def step_config(self) -> ServerStepConfig:
        return ServerStepConfig(self.server_optimizer, self.server_lr, self.momentum, (self.beta1, self.beta2), self.tau)

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
