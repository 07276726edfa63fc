"""FedBN and FedRep, server side: FedAvg over the shared entries; the local ones never reach the server.

``start`` splits the job's network into local entries (FedBN: every normalisation layer's, FedRep: the
head's; ``fedseg.networks.partition``) and shared ones; the strategy's state holds the shared entries only,
sites send and receive only those (``shared_keys``: the controller validates train results against them),
and each round is FedAvg's sample-weighted mean over them. There is no global model of the local layers:
``global_params()`` (what ``FL_global_model.pt`` holds) fills them with the network's initial values, built
afresh each time rather than kept, and the final evaluation is of each site's own model (shared + its local
layers), which the sites send after training (``submit_model``), plus the cross-site evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from fedseg.fl.protocol import SUBMIT_MODEL_TASK
from fedseg.method_options import option
from fedseg.networks.partition import HEADS, head_state_keys, normalisation_state_keys

from .base import Params
from .fedavg import FedAvgOptions, FedAvgStrategy


@dataclass(frozen=True)
class LocalLayersOptions(FedAvgOptions):
    """FedBN's server options: FedAvg's weighted mean over the shared entries (no robust aggregation)."""

    aggregation: str = option("mean", "the weighted mean (fixed)", init=False)
    trim: float = option(0.1, "unused (fixed)", init=False)


@dataclass(frozen=True)
class FedRepOptions(LocalLayersOptions):
    """FedRep's server options."""

    head: str = option("conv1x1", "the layers kept at each site: conv1x1 (the 1x1 classifier) or last_block (the last "
                       "decoder block plus the classifier)")

    def __post_init__(self):
        if self.head not in HEADS:
            raise ValueError(f"FedRep head must be one of {HEADS}, got {self.head!r}")
        super().__post_init__()


class LocalLayersStrategy(FedAvgStrategy):
    """Base: ``local_keys(network)`` name the entries that stay at the sites."""

    needs_network = True
    evaluates_global = False
    personalized_at_sites = True
    extra_tasks = (SUBMIT_MODEL_TASK,)
    _empty_hint = ""
    options_class = LocalLayersOptions

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.local: List[str] = []

    def local_keys(self, network) -> List[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self, clients: List[str], initial_params: Params) -> None:
        local = self.local_keys(self.network_factory())
        if not local:
            raise ValueError(f"{self.name}: the network has no entries to keep local ({self._empty_hint})")
        unknown = sorted(set(local) - set(initial_params))
        if unknown:
            raise ValueError(f"{self.name}: local entries {unknown[:5]} are not in the initial model")
        self.local = list(local)
        super().start(clients, {k: v for k, v in initial_params.items() if k not in set(local)})

    def shared_keys(self) -> Optional[List[str]]:
        return list(self._global)

    def global_params(self) -> Params:
        """The shared entries plus the network's initial values of the local ones (not kept between calls)."""
        full = {k: v.detach().cpu() for k, v in self.network_factory().state_dict().items()}
        full.update(self._global)
        return full

    def aggregate(self, round_, updates, exchange) -> Dict[str, Any]:
        fields = super().aggregate(round_, updates, exchange)
        fields["local_entries"] = len(self.local)
        return fields


class FedBNStrategy(LocalLayersStrategy):
    """FedBN (Li et al., ICLR 2021): normalisation layers stay local."""

    name = "fedbn"
    objective = "fedbn"
    _empty_hint = "norm='instance' has no affine parameters or running statistics; use norm='batch' or 'instance_affine'"

    def local_keys(self, network) -> List[str]:
        return normalisation_state_keys(network)


class FedRepStrategy(LocalLayersStrategy):
    """FedRep (Collins et al., ICML 2021): the head stays local (``head``: ``"conv1x1"`` or ``"last_block"``)."""

    name = "fedrep"
    objective = "fedrep"
    options_class = FedRepOptions

    def local_keys(self, network) -> List[str]:
        return head_state_keys(network, self.head)
