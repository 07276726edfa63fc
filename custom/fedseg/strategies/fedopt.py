"""FedOpt / FedAdam (Reddi et al., ICLR 2021): a server optimiser over the sites' averaged update.

With ``delta = sum_k p_k w_k - w`` (FedAvg's average minus the current global model; ``p_k = n_k / sum n``)
the server treats ``-delta`` as a gradient and takes one step of its optimiser on the global model's
trainable parameters; buffers (batch-norm statistics) take the averaged update ``w + delta``, as NVFlare
does. The step is NVFlare's ``PTFedOptModelShareableGenerator.server_update`` on a server copy of the job's
network; the generator's optimiser is built here (``server_optimizer``) instead of from an NVFlare engine
component. ``server_optimizer="adam"`` is FedAdam: Adam(lr = ``server_lr``, betas = (``beta1``, ``beta2``),
eps = ``tau``); the optimiser's moments are part of the server checkpoint.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from nvflare.app_opt.pt.fedopt import PTFedOptModelShareableGenerator

from .aggregation import site_weights, weighted_average
from .base import ClientUpdate, Exchange, Params, ServerStrategy, clone_params

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
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"beta1 and beta2 must lie in [0, 1), got {beta1}, {beta2}")
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if weighting not in ("samples", "uniform"):
            raise ValueError(f"weighting must be 'samples' or 'uniform', got {weighting!r}")
        self.server_optimizer = server_optimizer
        self.server_lr = float(server_lr)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.tau = float(tau)
        self.momentum = float(momentum)
        self.weighting = weighting
        self.generator: PTFedOptModelShareableGenerator = None

    def config(self) -> Dict[str, Any]:
        return {"strategy": self.name, "server_optimizer": self.server_optimizer, "server_lr": self.server_lr,
                "beta1": self.beta1, "beta2": self.beta2, "tau": self.tau, "momentum": self.momentum,
                "weighting": self.weighting}

    def optimizer_args(self) -> Dict[str, Any]:
        """NVFlare's ``optimizer_args`` form of the server optimiser (recorded on the generator)."""
        if self.server_optimizer == "adam":
            return {"path": "torch.optim.Adam", "args": {"lr": self.server_lr, "betas": (self.beta1, self.beta2), "eps": self.tau}}
        if self.server_optimizer == "adagrad":
            return {"path": "torch.optim.Adagrad", "args": {"lr": self.server_lr, "eps": self.tau}}
        return {"path": "torch.optim.SGD", "args": {"lr": self.server_lr, "momentum": self.momentum}}

    def start(self, clients: List[str], initial_params: Params) -> None:
        super().start(clients, initial_params)
        network = self.network_factory().cpu()
        network.load_state_dict(self._global)
        args = self.optimizer_args()
        generator = PTFedOptModelShareableGenerator(optimizer_args=args, source_model=network, device="cpu")
        # what the generator's START_RUN handler does with an NVFlare engine, done without one
        generator.model, generator.device = network, torch.device("cpu")
        optimizer_class = {"torch.optim.Adam": torch.optim.Adam, "torch.optim.Adagrad": torch.optim.Adagrad,
                           "torch.optim.SGD": torch.optim.SGD}[args["path"]]
        generator.optimizer = optimizer_class(network.parameters(), **args["args"])
        generator.optimizer_name = args["path"]
        self.generator = generator

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        weights = site_weights(self.weighting, {s: updates[s].n_samples for s in sites}, sites)
        average = weighted_average([updates[s].params for s in sites], weights)
        floats = [k for k, v in self._global.items() if torch.is_floating_point(v)]
        diff = {k: (average[k] - self._global[k]).numpy() for k in floats}
        state, updated = self.generator.server_update(diff)  # -diff is the gradient of the server optimiser
        new_global = {}
        for key, value in self._global.items():
            if key in updated:
                new_global[key] = state[key].detach().cpu().clone()
            elif key in diff:  # buffers: the averaged update
                new_global[key] = value + torch.as_tensor(diff[key])
            else:  # integer counters: as FedAvg's average takes them
                new_global[key] = average[key].clone()
        self._global = new_global
        update_norm = sum(float((torch.as_tensor(d, dtype=torch.float64) ** 2).sum()) for d in diff.values()) ** 0.5
        return {"aggregation_weight": dict(zip(sites, weights)), "average_update_norm": update_norm,
                "server_lr": self.generator.optimizer.param_groups[-1]["lr"]}

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "server_optimizer_state": _clone_nested(self.generator.optimizer.state_dict())}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.generator.model.load_state_dict(self._global)
        self.generator.optimizer.load_state_dict(state["server_optimizer_state"])


def _clone_nested(value):
    """Deep copy of an optimiser state dict with its tensors cloned (the live one changes every step)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _clone_nested(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_nested(v) for v in value)
    return value
