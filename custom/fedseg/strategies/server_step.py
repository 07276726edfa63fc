"""A server optimiser over the global model any strategy produces (FedOpt's pseudo-gradient, Reddi et al. 2021).

With ``w`` the global model the sites trained from and ``w'`` the one a strategy's aggregation proposes (FedAvg's
mean, FedEvi's evidential mix, GraphFedSeg's dual-layer model, ...), ``delta = w' - w`` is the round's update and
``-delta`` the gradient of one step of a server optimiser on the trainable parameters:

    sgd-momentum (FedAvgM, Hsu et al. 2019):  v <- mu v + delta;  w <- w + lr v
    adam (FedAdam):                          Adam(lr, betas, eps) on the gradient -delta

``lr = 1`` and ``mu = 0`` give ``w'`` itself. Buffers (batch-norm statistics) and integer entries take the proposed
values. The step is NVFlare's ``PTFedOptModelShareableGenerator.server_update`` on a server copy of the job's network
(the optimiser is built here rather than from an NVFlare engine component); its moments are part of the server
checkpoint. One mechanism for every strategy: ``ServerStrategy.aggregate_round`` applies it after ``aggregate``, and
FedAdam / FedAvgM (``FedOptStrategy``) are FedAvg with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
from nvflare.app_opt.pt.fedopt import PTFedOptModelShareableGenerator

Params = Dict[str, torch.Tensor]

#: ``server_optimizer`` values a method accepts ("none": no step, the strategy's model as it is)
SERVER_STEPS = ("none", "sgd-momentum", "adam")
#: the optimisers a step can run (FedOpt's ``sgd`` / ``adagrad`` besides the two above)
_OPTIMIZERS = {"sgd-momentum": torch.optim.SGD, "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}
#: server momentum when none is given: NVFlare's FedOpt default (the suite's FedAvgM, ``fedseg.recipes.fedavgm``)
DEFAULT_SERVER_MOMENTUM = 0.6


@dataclass(frozen=True)
class ServerStepConfig:
    """Args:
        optimizer: ``"sgd-momentum"`` (heavy ball), ``"adam"``, or FedOpt's ``"sgd"`` / ``"adagrad"``.
        lr: the server learning rate (1.0: the strategy's own step, scaled by the momentum only).
        momentum: SGD momentum (sgd-momentum, sgd).
        betas: Adam's moment decays.
        eps: Adam's / Adagrad's epsilon (FedAdam's adaptivity tau).
    """

    optimizer: str = "sgd-momentum"
    lr: float = 1.0
    momentum: float = DEFAULT_SERVER_MOMENTUM
    betas: Tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-3

    def __post_init__(self):
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"server optimizer must be one of {sorted(_OPTIMIZERS)}, got {self.optimizer!r}")
        if not float(self.lr) > 0:
            raise ValueError(f"server_lr must be > 0, got {self.lr}")
        if not 0 <= float(self.momentum) < 1:
            raise ValueError(f"server momentum must lie in [0, 1), got {self.momentum}")
        betas = tuple(float(b) for b in self.betas)
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"server betas must be two values in [0, 1), got {self.betas}")
        if not float(self.eps) > 0:
            raise ValueError(f"server eps must be > 0, got {self.eps}")
        object.__setattr__(self, "betas", betas)

    def as_dict(self) -> Dict[str, Any]:
        """What the report and the checkpoint record (only the options the optimiser reads)."""
        out: Dict[str, Any] = {"server_optimizer": self.optimizer, "server_lr": float(self.lr)}
        if self.optimizer.startswith("sgd"):
            out["server_momentum"] = float(self.momentum)
        if self.optimizer == "adam":
            out["server_betas"] = list(self.betas)
        if self.optimizer in ("adam", "adagrad"):
            out["server_eps"] = float(self.eps)
        return out

    def optimizer_args(self) -> Dict[str, Any]:
        """NVFlare's ``optimizer_args`` form (recorded on the generator)."""
        cls = _OPTIMIZERS[self.optimizer]
        if cls is torch.optim.Adam:
            args = {"lr": float(self.lr), "betas": self.betas, "eps": float(self.eps)}
        elif cls is torch.optim.Adagrad:
            args = {"lr": float(self.lr), "eps": float(self.eps)}
        else:
            args = {"lr": float(self.lr), "momentum": float(self.momentum)}
        return {"path": f"torch.optim.{cls.__name__}", "args": args}


def server_step_config(server_optimizer: Optional[str] = "none", server_lr: float = 1.0,
                       server_momentum: float = DEFAULT_SERVER_MOMENTUM, server_betas=(0.9, 0.99),
                       server_eps: float = 1e-3) -> Optional[ServerStepConfig]:
    """A method's ``server_*`` options -> the step's configuration, or None for ``"none"``.

    Raises:
        ValueError: an unknown optimiser name or an out-of-range option.
    """
    if server_optimizer in (None, "none"):
        return None
    if server_optimizer not in SERVER_STEPS:
        raise ValueError(f"server_optimizer must be one of {SERVER_STEPS}, got {server_optimizer!r}")
    return ServerStepConfig(server_optimizer, server_lr, server_momentum, tuple(server_betas), server_eps)


class ServerStep:
    """The step of :class:`ServerStepConfig` on a network's trainable parameters.

    Args:
        config: the optimiser and its options.
        network: the job's network (a CPU copy the step owns: it names the trainable parameters and carries the
            optimiser's view of the global model).
    """

    def __init__(self, config: ServerStepConfig, network: torch.nn.Module):
        self.config = config
        network = network.cpu()
        args = config.optimizer_args()
        generator = PTFedOptModelShareableGenerator(optimizer_args=args, source_model=network, device="cpu")
        # what the generator's START_RUN handler does with an NVFlare engine, done without one
        generator.model, generator.device = network, torch.device("cpu")
        generator.optimizer = _OPTIMIZERS[config.optimizer](network.parameters(), **args["args"])
        generator.optimizer_name = args["path"]
        self.generator = generator
        self._parameters = {name for name, _ in network.named_parameters()}

    @property
    def lr(self) -> float:
        return float(self.generator.optimizer.param_groups[-1]["lr"])

    def step(self, previous: Params, proposed: Params) -> Tuple[Params, float]:
        """``(stepped model, ||proposed - previous||)``: one optimiser step from ``previous`` along ``proposed -
        previous``; entries of ``proposed`` that are not trainable parameters of the network are taken as they are.

        ``previous`` / ``proposed``: ``{name: tensor}`` with the same names (a subset of the network's state, e.g.
        FedBN's shared entries).
        """
        stepped_names = [k for k, v in proposed.items() if k in self._parameters and torch.is_floating_point(v)]
        diff = {k: (proposed[k] - previous[k]).numpy() for k in stepped_names}
        with torch.no_grad():
            # the optimiser steps from the model the sites trained from (a strategy may have changed its global
            # model between rounds, e.g. a restored checkpoint)
            for name, parameter in self.generator.model.named_parameters():
                if name in diff:
                    parameter.copy_(previous[name])
        state, updated = self.generator.server_update(diff)  # -diff is the optimiser's gradient
        stepped = {k: (state[k].detach().cpu().clone() if k in updated else v) for k, v in proposed.items()}
        norm = sum(float((torch.as_tensor(d, dtype=torch.float64) ** 2).sum()) for d in diff.values()) ** 0.5
        return stepped, norm

    def state_dict(self) -> Dict[str, Any]:
        return {"config": self.config.as_dict(), "optimizer": _clone_nested(self.generator.optimizer.state_dict())}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Raises ValueError when the state was written with another server optimiser or other options."""
        if state.get("config") != self.config.as_dict():
            raise ValueError(f"checkpoint's server step {state.get('config')} differs from this job's {self.config.as_dict()}")
        self.generator.optimizer.load_state_dict(state["optimizer"])


def _clone_nested(value):
    """Deep copy of an optimiser state dict with its tensors cloned (the live one changes every step)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _clone_nested(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_nested(v) for v in value)
    return value
