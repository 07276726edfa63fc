"""Server strategy: the server-side half of a federated method.

The controller (``fedseg.fl.controller.FedSegController``) drives the rounds and calls:
    start(clients, initial_params)            once
    payload(site, round) -> SitePayload       the model (and meta) each site trains from
    aggregate_round(round, updates, exchange) after the train task: ``aggregate`` (the method's rule), then the
                                              server step when one is attached; returns the round's report fields
    finish()                                  once, after the last round (e.g. FedEFM's final averaging)
    global_params()                           the model evaluated as ``final.global`` (unless
                                              ``evaluates_global`` is False: FedBN, FedRep)
    personalized_params()                     per-site models evaluated as ``final.personalized`` (or None;
                                              with ``personalized_at_sites`` the controller asks the sites
                                              for them after training: Ditto, FedBN, FedRep)
    shared_keys()                             the state-dict entries sites send and receive (None: all)
    state_dict() / load_state_dict(state)     what a restarted server needs to continue (``fl.checkpoint``)

``exchange(task_name, {site: SitePayload}) -> {site: ClientUpdate}`` lets a strategy run a second
task inside a round (FedEvi's surrogate evaluation) without knowing about NVFlare.
Parameters are ``Dict[str, torch.Tensor]`` on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Type

import torch

from fedseg.method_options import MethodOptions, set_options

Params = Dict[str, torch.Tensor]


@dataclass
class SitePayload:
    """What the server sends to one site: weights plus method-specific meta (scalars, small vectors)."""

    params: Params
    meta: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """One site's validated result for a task.

    Attributes:
        site: site name.
        params: trained weights (empty for tasks that return statistics only).
        n_samples: number of local training images.
        metrics: scalar metrics (train_loss, val_dice, ...).
        meta: the declared statistics the objective sent (e.g. GraphFedSeg's uncertainty).
        models: extra named models a weight task returned (FedEFM's overseas experts), each validated
            against the global model's names and shapes.
    """

    site: str
    params: Params
    n_samples: int = 0
    metrics: Dict[str, float] = field(default_factory=dict)
    meta: Dict[str, Any] = field(default_factory=dict)
    models: Dict[str, Params] = field(default_factory=dict)


Exchange = Callable[[str, Dict[str, SitePayload]], Dict[str, ClientUpdate]]


class ServerStrategy:
    """Base class; subclasses implement ``aggregate`` and may override the rest."""

    name: str = "base"
    #: the client objective this strategy pairs with by default
    objective: str = "fedavg"
    #: task names besides train/evaluate that ``aggregate`` sends through ``exchange``
    extra_tasks: tuple = ()
    #: ``False`` for strategies without a global model during training (FedEFM's DFL): the controller
    #: then saves no per-round global checkpoint, only the one ``finish`` produces
    has_global_model: bool = True
    #: ``False`` where the global model is incomplete without a site's own layers (FedBN, FedRep): the
    #: controller then evaluates only the personalised models
    evaluates_global: bool = True
    #: the personalised models live at the sites (Ditto, FedBN, FedRep): after training the controller asks
    #: each site for its model (task ``submit_model``), evaluates it and runs the cross-site evaluation
    personalized_at_sites: bool = False
    #: set ``True`` to get ``network_factory`` (a callable building the job's network) from the controller
    needs_network: bool = False
    #: the strategy's options (a :class:`fedseg.method_options.MethodOptions` dataclass): its fields are the
    #: constructor's keywords and the strategy's attributes of the same names (None: no options)
    options_class: Optional[Type[MethodOptions]] = None
    #: why this strategy cannot aggregate encrypted models (``fedseg.fl.homomorphic``), or None where its server step
    #: is a weighted sum of the sites' models with weights from plaintext statistics (``weighted_average`` then sums
    #: ciphertexts); :meth:`he_refusal` may refine it by option
    he_refusal_reason: Optional[str] = "its server step is not a weighted sum of the sites' models"

    def __init__(self, **options: Any) -> None:
        set_options(self, self.options_class, options)
        self.clients: List[str] = []
        self._global: Params = {}
        #: set by the controller before ``start``
        self.total_rounds: int = 0
        #: set by the controller before ``start`` when ``needs_network``: builds the job's network (CPU)
        self.network_factory = None
        #: the server optimiser stepping the global model after each aggregation (``attach_server_step``), or None
        self.server_step = None

    def config(self) -> Dict[str, Any]:
        """Effective hyper-parameters, written into ``report.json['config']``: the strategy's name, then its options
        in field order."""
        return {"strategy": self.name, **(self.options.as_dict() if self.options is not None else {})}

    def start(self, clients: List[str], initial_params: Params) -> None:
        self.clients = list(clients)
        self._global = {k: v.detach().clone() for k, v in initial_params.items()}

    def payload(self, site: str, round_: int) -> SitePayload:
        return SitePayload(params=self._global)

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------------------- server step
    def attach_server_step(self, step) -> None:
        """Step the global model by ``step`` (``fedseg.strategies.server_step.ServerStep``) after every aggregation;
        call after ``start``. Only the global model moves: what the method keeps beside it (personalised models,
        weights, graphs, controls) is its aggregation's, as without the step.

        Raises:
            ValueError: the strategy has no global model during training (FedEFM's DFL).
        """
        if not self.has_global_model:
            raise ValueError(f"{self.name}: no global model during training (the sites mix their own), so no server "
                             "step applies; use server_optimizer=none")
        self.server_step = step

    def aggregate_round(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        """:meth:`aggregate`, then the attached server step from the model the sites trained from along the
        aggregation's update (report fields ``server_update_norm``, ``server_lr``)."""
        step = self.server_step
        if step is None:
            return self.aggregate(round_, updates, exchange)
        previous = clone_params(self._global)  # a strategy may change its dict in place
        fields = self.aggregate(round_, updates, exchange)
        stepped, norm = step.step(previous, self._global)
        self.set_global(stepped)
        return {**fields, "server_update_norm": norm, "server_lr": step.lr}

    def set_global(self, params: Params) -> None:
        """Replace the global model (after the server step); strategies that keep copies of it override this."""
        self._global = params

    def finish(self) -> Dict[str, Any]:
        """Called once after the last round; returns report fields (none by default)."""
        return {}

    def he_refusal(self) -> Optional[str]:
        """Why this strategy, with its options, cannot aggregate encrypted models (one line), or None when it can."""
        return self.he_refusal_reason

    def global_params(self) -> Params:
        return self._global

    # ------------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> Dict[str, Any]:
        """Everything the strategy learnt so far, to continue after a server restart.

        Holds CPU tensors, lists, numbers and strings only, so that ``torch.load(weights_only=True)``
        reads it back (a checkpoint file is never executed). Subclasses extend the dict with their own
        state (FedEvi's beta, GraphFedSeg's graph and personalised models, ...) and must restore it in
        :meth:`load_state_dict`; what ``start`` derives from the clients alone is not stored.
        """
        state = {
            "name": self.name,
            "config": self.config(),
            "clients": list(self.clients),
            "global": clone_params(self._global),
        }
        if self.server_step is not None:
            state["server_step"] = self.server_step.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; call after ``start`` with the same clients.

        Raises ValueError when the state belongs to another strategy, other options or other sites:
        continuing with it would mix two different runs.
        """
        if state.get("name") != self.name:
            raise ValueError(f"checkpoint is of strategy {state.get('name')!r}, this job runs {self.name!r}")
        differing = sorted(
            k for k in set(state.get("config", {})) | set(self.config()) if state.get("config", {}).get(k) != self.config().get(k)
        )
        if differing:
            raise ValueError(f"checkpoint was written with other {self.name} options: {differing}")
        if list(state.get("clients", [])) != list(self.clients):
            raise ValueError(f"checkpoint is for sites {state.get('clients')}, this job started with {self.clients}")
        step = self.server_step
        if (step is None) != ("server_step" not in state):
            written = state.get("server_step", {}).get("config", "none")
            raise ValueError(f"checkpoint was written with server step {written}, this job runs "
                             f"{step.config.as_dict() if step is not None else 'none'}")
        if step is not None:
            step.load_state_dict(state["server_step"])
        self._global = clone_params(state["global"])

    def personalized_params(self) -> Optional[Dict[str, Params]]:
        return None

    def shared_keys(self) -> Optional[List[str]]:
        """The state-dict entries a site trains for the federation and sends back (None: every entry);
        the server validates train results against them. Call after ``start``."""
        return None


def parameter_keys(network) -> List[str]:
    """Names of the trainable parameters of ``network`` (``named_parameters``; buffers such as batch-norm
    statistics are not among them)."""
    return [name for name, p in network.named_parameters() if p.requires_grad]


def clone_params(params: Params) -> Params:
    """A detached CPU copy of a state dict, so that a checkpoint never aliases live training tensors (entries that
    are not tensors, the ciphertexts of an encrypted aggregation, are never changed in place and are kept as they are)."""
    return {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
