"""Client objective: the site-side half of a federated method.

The engine calls, per round:
    begin_round(ctx, model)                      once, after the received weights are loaded
    prepare_inputs(inputs, labels) -> inputs     every training iteration, before the forward pass
                                                 (PathFL's style mixing; default: unchanged)
    loss(batch_out) -> scalar tensor             every training iteration
      with differential privacy on (``train_config["dp_target_epsilon"]``), instead:
    data_loss(batch_out) -> scalar tensor        the data term, privatised (per-sample clip + noise)
    parameter_loss(model) -> tensor or None      a term of the weights and server-sent information
                                                 only; its gradient is added after privatisation
      (contract: ``loss(out) == data_loss(out) + parameter_loss(model)``; by default ``data_loss`` is
      ``loss`` and there is no parameter term)
    end_round(ctx, model, engine) -> dict        once, after local training: declared statistics
    save_site_figures(out_dir, ctx)              after the last round's training: site-local figures
    local_training(engine, model, ctx) -> dict   the train task's local training (default: one
                                                 ``engine.train(model, self, ctx)``; FedRep trains head
                                                 then body, Ditto the global then the personal model)
    after_step(model, optimizer)                 after every optimiser step (SCAFFOLD's correction)
    local_state_keys(model) -> keys              state-dict entries that never leave the site (FedBN's
                                                 normalisation layers, FedRep's head): the site sends the
                                                 rest, and a received model may lack exactly these
    outgoing_models(ctx) -> {name: state}        extra named tensors sent with the trained weights
                                                 (SCAFFOLD's control delta; names in ``partial_models``
                                                 may cover a subset of the model's entries)
    handle_task(name, ctx, model, engine)        for method-specific extra tasks (e.g. FedEvi's
                                                 ``evaluate_surrogate``); returns metrics/meta scalars
    handle_weight_task(name, ctx, model, engine) for the extra tasks in ``weight_tasks`` (FedEFM's
                                                 overseas training, gossip): returns weights to send

Only keys listed in ``declared_statistics`` may leave the site in ``FLModel.meta`` (the client loop
enforces it), and each must be a finite scalar or a short list of finite scalars — never images,
labels, predictions or per-image lists. An objective that must send an array that is not data (PathFL's
Gaussian noise batch) declares its name and exact shape in ``declared_arrays``; the server rejects any
other shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Type

import torch
from torch import nn

from fedseg.method_options import MethodOptions, set_options

if TYPE_CHECKING:  # pragma: no cover - the engines import this module, the interface they drive
    # what an objective may call on the site's engine: the protocols of fedseg.engine.api
    from fedseg.engine.api import SiteEngine


class UnknownTaskError(ValueError):
    """A site was asked for a task its method does not have (the server and site disagree on the method)."""


@dataclass
class RoundContext:
    """What a client objective knows about the current round.

    Attributes:
        site: this site's name.
        round: 0-based round index.
        total_rounds: number of rounds in the job.
        server_meta: the ``FLModel.meta`` the server sent with this task (method-specific payload).
        train_config: effective training hyper-parameters sent by the server.
        state_dir: a folder in this site's workspace for state that must survive a process restart.
        models: extra named models the task carried besides the main weights (``fedseg.fl.protocol``
            ``pack_models``; FedEFM's overseas experts and gossip neighbours, SCAFFOLD's global control),
            ``{name: state_dict}``.
        job_key: fingerprint of the job's configuration (``fedseg.engine.site_state.job_key``): state an
            objective kept in ``state_dir`` for another configuration is not used.
    """

    site: str
    round: int
    total_rounds: int
    server_meta: Dict[str, Any] = field(default_factory=dict)
    train_config: Dict[str, Any] = field(default_factory=dict)
    state_dir: Optional[str] = None
    models: Dict[str, Dict[str, torch.Tensor]] = field(default_factory=dict)
    job_key: Optional[str] = None


@dataclass
class BatchOutput:
    """One training iteration's tensors, as the objective sees them.

    Attributes:
        inputs: images ``(B, C_in, H, W)``.
        labels: integer-valued masks ``(B, 1, H, W)`` (0 = background, 1..C-1 = classes); for the
            classification engine class indices ``(B,)`` (long).
        logits: network output ``(B, C, H, W)``; class logits ``(B, K)`` for classification.
        features: named feature maps (``FeatureUNet.forward_features``; the classification engine's ViT
            gives ``{"tokens": (B, N, D)}``); empty unless the objective sets ``needs_features``.
        epoch: 0-based local epoch.
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    logits: torch.Tensor
    features: Dict[str, torch.Tensor]
    epoch: int = 0


class ClientObjective:
    """Default objective: the bundle's segmentation loss, no extra statistics (FedAvg)."""

    name: str = "fedavg"
    #: ask the engine for ``forward_features`` instead of ``forward``
    needs_features: bool = False
    #: the feature maps read during training, by role (``fedseg.networks.feature_taps.FEATURE_ROLES``; a user's
    #: network gives them through forward hooks)
    feature_roles: Tuple[str, ...] = ()
    #: the method reads softmax class probabilities of the logits against class-index labels (a user's bundle whose
    #: head is sigmoid / multi-label is refused)
    needs_class_logits: bool = False
    #: meta keys this objective may send to the server
    declared_statistics: Tuple[str, ...] = ()
    #: extra tasks whose answer is weights (``handle_weight_task``), validated like trained models
    weight_tasks: Tuple[str, ...] = ()
    #: extra tasks whose answer is declared statistics only (``handle_task``)
    statistic_tasks: Tuple[str, ...] = ()
    #: valid range ``(low, high)`` (inclusive) of each declared statistic, checked by the server for every
    #: value (or every element of a list); a result outside it is rejected (``fedseg.fl.screening``)
    statistic_ranges: Dict[str, Tuple[float, float]] = {}
    #: names of the extra models (``outgoing_models``) that may hold a subset of the model's entries, e.g.
    #: SCAFFOLD's control delta (trainable parameters only); each entry is still checked for name, shape and
    #: finite values at the server
    partial_models: Tuple[str, ...] = ()

    #: the objective's options (a :class:`fedseg.method_options.MethodOptions` dataclass): its fields are the
    #: constructor's keywords besides ``seg_loss``, and the objective's attributes of the same names (None: none)
    options_class: Optional[Type[MethodOptions]] = None

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        set_options(self, self.options_class, options)
        self.seg_loss = seg_loss

    def set_seg_loss(self, seg_loss: nn.Module) -> None:
        """The engine hands over the bundle's loss (DiceCE by default) if none was given."""
        if self.seg_loss is None:
            self.seg_loss = seg_loss

    def declared_arrays(self, train_config: Dict[str, Any]) -> Dict[str, Tuple[int, ...]]:
        """``{meta key: exact shape}`` of the float arrays this objective may send (none by default)."""
        return {}

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        """Called after the received weights are loaded into ``model``, before local training."""

    def prepare_inputs(
        self, inputs: torch.Tensor, labels: torch.Tensor, source_statistics: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> torch.Tensor:
        """The training images ``(B, C_in, H, W)`` as the network should see them this iteration. Must
        treat each image on its own (DP-SGD clips per image). ``source_statistics``: per-channel ``(mean, std)``,
        ``(B, C_in)`` each, of the whole images the patches were cut from (patch mode; ``None`` otherwise).
        Default: unchanged."""
        return inputs

    def loss(self, out: BatchOutput) -> torch.Tensor:
        """Scalar training loss for one batch."""
        if self.seg_loss is None:
            raise RuntimeError("no segmentation loss configured")
        return self.seg_loss(out.logits, out.labels)

    def data_loss(self, out: BatchOutput) -> torch.Tensor:
        """The part of :meth:`loss` that reads the batch; what DP-SGD privatises. Must be a mean of
        per-image terms (per-sample gradient clipping bounds each image's influence). Objectives that
        implement :meth:`parameter_loss` return the rest of their loss here."""
        return self.loss(out)

    def parameter_loss(self, model: nn.Module) -> Optional[torch.Tensor]:
        """Optional scalar term that depends only on ``model``'s current parameters and on what the
        server sent — never on training data. ``None``: no such term. Under DP its gradient is added to the
        privatised gradient of :meth:`data_loss` (no privacy cost); without DP the engine uses
        :meth:`loss`, which must equal ``data_loss + parameter_loss``."""
        return None

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SiteEngine) -> Dict[str, Any]:
        """Declared statistics to send with the trained weights (keys from ``declared_statistics``)."""
        return {}

    def save_site_figures(self, out_dir: str, ctx: RoundContext) -> None:
        """Write method-specific figures into the site's own workspace (called after the last round).

        These may show images; they never leave the site.
        """

    def local_training(self, engine: SiteEngine, model: nn.Module, ctx: RoundContext) -> Dict[str, float]:
        """The local training of a train task (after ``begin_round``, before ``end_round``); returns the
        engine's metrics (at least ``train_loss`` and ``steps``). Default: ``local_epochs`` epochs of
        :meth:`loss` on ``model``."""
        return engine.train(model, self, ctx)

    def after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Called by the engine after every optimiser step of local training (default: nothing)."""

    # ----------------------------------------------------- a site training as N ranks (fedseg.engine.distributed)
    def begin_rank_epochs(self, model: nn.Module) -> None:
        """On ranks 1..N-1, on the copy of this objective rank 0 sent with ``model`` for one ``run_epochs``: empty
        what :meth:`rank_records` returns and re-attach anything process-local (module hooks are not sent).
        Default: nothing."""

    def rank_records(self) -> Any:
        """What this rank's share of the epochs recorded that ``end_round`` reads (e.g. sums over batches);
        ``None`` (default) when the objective records nothing during training."""
        return None

    def merge_rank_records(self, records: List[Any]) -> None:
        """On rank 0 after the epochs: fold the other ranks' :meth:`rank_records` into this objective's own, so
        ``end_round`` sees the whole site's training. Default: nothing."""

    def local_state_keys(self, model: nn.Module) -> Tuple[str, ...]:
        """State-dict keys of ``model`` that stay at the site: never sent, and absent from what the server
        sends (default: none; every entry is shared)."""
        return ()

    def outgoing_models(self, ctx: RoundContext) -> Dict[str, Dict[str, torch.Tensor]]:
        """Extra named tensors to send with the trained weights of a train task (default: none)."""
        return {}

    def handle_task(
        self, task_name: str, ctx: RoundContext, model: nn.Module, engine: SiteEngine
    ) -> Dict[str, Any]:
        """Run a task of ``statistic_tasks`` on ``model`` (already loaded with the received weights)."""
        raise UnknownTaskError(f"objective {self.name!r} does not handle task {task_name!r}")

    def handle_weight_task(
        self, task_name: str, ctx: RoundContext, model: nn.Module, engine: SiteEngine
    ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Dict[str, torch.Tensor]], Dict[str, Any]]:
        """Run a task of ``weight_tasks``. Returns ``(main weights or {}, {name: extra weights},
        declared statistics)``; the site packs the weights with ``fedseg.fl.protocol.pack_models``."""
        raise UnknownTaskError(f"objective {self.name!r} does not handle weight task {task_name!r}")
