"""FedEFM's silo side (``shared/methods/fedefm.md``): distil from overseas experts, train guests, gossip.

Tasks a silo answers (the server side is ``fedseg.strategies.fedefm``):
  * ``train``: round 0 (no experts) plain cross-entropy; afterwards the EMD-weighted distillation of
    ``fedseg.foundation.distillation_loss`` with the experts received as extra models ``expert@<j>``
    (frozen teachers). Sends the weights plus ``teacher_emd`` / ``teacher_weights`` (one value per
    teacher, in the order of ``RoundContext.server_meta["fedefm_teachers"]``, averaged over the round's
    batches).
  * ``overseas_train``: for every guest model ``guest@<i>`` received, train a copy on this silo's data
    with cross-entropy for ``overseas_epochs`` and send it back (the expert ``theta_i,this``).
  * ``gossip`` (DFL): mix the received own model with the in-neighbour models ``neighbour@<k>``.
The network is a ``fedseg.foundation.ViTClassifier``: ``forward_features(x) -> (logits (B, K), tokens
(B, N, D))``; the engine passes the tokens as ``BatchOutput.features`` when ``needs_features`` is set.
"""

from __future__ import annotations

import math

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fedseg.foundation.distillation import distillation_loss
from fedseg.foundation.topology import gossip_mix
from fedseg.method_options import MethodOptions, option

from .base import BatchOutput, ClientObjective, RoundContext

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine

OVERSEAS_TASK = "overseas_train"
GOSSIP_TASK = "gossip"


class CrossEntropyObjective(ClientObjective):
    """Plain cross-entropy on class logits ``(B, K)`` against class indices ``(B,)``: the overseas
    experts' objective and the classification FedAvg baseline."""

    name = "cross_entropy"

    def loss(self, out: BatchOutput) -> torch.Tensor:
        return F.cross_entropy(out.logits, out.labels.long().view(-1))


def _tokens(features: Any) -> torch.Tensor:
    """The student's dense tokens ``(B, N, D)`` from ``BatchOutput.features`` (a dict or the tensor)."""
    if isinstance(features, dict):
        if "tokens" not in features:
            raise KeyError(f"FedEFM needs the ViT's dense tokens; got features {sorted(features)}")
        return features["tokens"]
    return features


@dataclass(frozen=True)
class FedEFMSiteOptions(MethodOptions):
    """FedEFM's site options: ``L = (1-a) CE + sum_t w_t [a T^2 KL + mu EMD_t]``, ``w = softmax(-EMD / tau)``."""

    alpha: float = option(0.5, "weight a of the distillation against the cross-entropy")
    temperature: float = option(4.0, "logit softening T")
    tau: float = option(0.1, "temperature of the teacher weights softmax(-EMD / tau)")
    mu: float = option(0.1, "weight of the EMD term")
    use_emd: bool = option(True, "off: the w/o EMD ablation (uniform teacher weights, no EMD term)")
    overseas_epochs: int = option(1, "local epochs an overseas expert trains at its host")
    gossip_self_weight: float = option(0.5, "DFL mixing weight on the silo's own model (the server's value)")

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")
        if self.temperature <= 0 or self.tau <= 0:
            raise ValueError(f"temperature and tau must be positive, got {self.temperature}, {self.tau}")
        if int(self.overseas_epochs) < 1:
            raise ValueError(f"overseas_epochs must be at least 1, got {self.overseas_epochs}")
        for name in ("alpha", "temperature", "tau", "mu", "gossip_self_weight"):
            self._set(name, float(getattr(self, name)))
        self._set("use_emd", bool(self.use_emd))
        self._set("overseas_epochs", int(self.overseas_epochs))


class FedEFMObjective(ClientObjective):
    """Cross-entropy plus EMD-weighted distillation from the overseas experts; options: :class:`FedEFMSiteOptions`."""

    name = "fedefm"
    declared_statistics = ("teacher_emd", "teacher_weights")
    # an EMD is a distance; the teacher weights are a softmax
    statistic_ranges = {"teacher_emd": (0.0, math.inf), "teacher_weights": (0.0, 1.0)}
    weight_tasks = (OVERSEAS_TASK, GOSSIP_TASK)
    options_class = FedEFMSiteOptions

    def __init__(self, **options: Any):
        super().__init__(**options)
        self._teachers: List[nn.Module] = []
        # frozen teacher and guest networks are kept by name and reloaded each round: stable objects
        # keep the engine's per-model optimisers valid and memory flat over the rounds
        self._frozen: Dict[str, nn.Module] = {}
        self._guests: Dict[str, nn.Module] = {}
        self._sums: Optional[Dict[str, torch.Tensor]] = None
        self._batches = 0

    @property
    def needs_features(self) -> bool:  # type: ignore[override]
        return bool(self._teachers) and self.use_emd

    # ------------------------------------------------------------------------------- distillation
    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        if ctx.train_config.get("dp_target_epsilon"):
            raise ValueError("FedEFM does not support DP-SGD (its teachers see every batch unclipped)")
        names = [f"expert@{j.replace('/', '_')}" for j in ctx.server_meta.get("fedefm_teachers", [])]
        missing = [n for n in names if n not in ctx.models]
        if missing:
            raise ValueError(f"{ctx.site}: the task names teachers {missing} it did not carry")
        self._teachers = [self._load(self._frozen, n, model, ctx.models[n], frozen=True) for n in names]
        self._sums, self._batches = None, 0

    def loss(self, out: BatchOutput) -> torch.Tensor:
        labels = out.labels.long().view(-1)
        if not self._teachers:
            return F.cross_entropy(out.logits, labels)
        with torch.no_grad():
            teacher_out = [t.forward_features(out.inputs) for t in self._teachers]
        loss, info = distillation_loss(
            out.logits,
            _tokens(out.features) if self.use_emd else None,
            labels,
            [z for z, _ in teacher_out],
            [f for _, f in teacher_out] if self.use_emd else None,
            alpha=self.alpha,
            temperature=self.temperature,
            tau=self.tau,
            mu=self.mu,
            use_emd=self.use_emd,
        )
        record = {"weights": info["weights"]}
        if info["emd"] is not None:
            record["emd"] = info["emd"]
        self._sums = record if self._sums is None else {k: self._sums[k] + v for k, v in record.items()}
        self._batches += 1
        return loss

    # a site training as N ranks: per-batch sums and the batch count of every rank's share add up on rank 0
    def begin_rank_epochs(self, model: nn.Module) -> None:
        self._sums, self._batches = None, 0

    def rank_records(self) -> Optional[Tuple[Dict[str, torch.Tensor], int]]:
        return None if self._sums is None else ({k: v.detach().cpu() for k, v in self._sums.items()}, self._batches)

    def merge_rank_records(self, records: List[Any]) -> None:
        for record in records:
            if record is None:
                continue
            sums, batches = record
            if self._sums is None:
                self._sums = sums
            else:
                self._sums = {k: self._sums[k] + sums[k].to(self._sums[k].device) for k in self._sums}
            self._batches += batches

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SiteEngine) -> Dict[str, Any]:
        if not self._sums:
            return {}
        out = {"teacher_weights": (self._sums["weights"] / self._batches).tolist()}
        if "emd" in self._sums:
            out["teacher_emd"] = (self._sums["emd"] / self._batches).tolist()
        return out

    # ---------------------------------------------------------------------------------- weight tasks
    def handle_weight_task(
        self, task_name: str, ctx: RoundContext, model: nn.Module, engine
    ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Dict[str, torch.Tensor]], Dict[str, Any]]:
        if task_name == OVERSEAS_TASK:
            guests = sorted(n for n in ctx.models if n.startswith("guest@"))
            if not guests:
                raise ValueError(f"{ctx.site}: overseas task without guest models")
            trained = {}
            for name in guests:
                guest = self._load(self._guests, name, model, ctx.models[name], frozen=False)
                engine.train(guest, CrossEntropyObjective(), ctx, epochs=self.overseas_epochs)
                trained[name] = guest.state_dict()
            return {}, trained, {}
        if task_name == GOSSIP_TASK:
            neighbours = [ctx.models[n] for n in sorted(ctx.models) if n.startswith("neighbour@")]
            return gossip_mix(model.state_dict(), neighbours, self.gossip_self_weight), {}, {}
        return super().handle_weight_task(task_name, ctx, model, engine)

    @staticmethod
    def _load(pool: Dict[str, nn.Module], name: str, like: nn.Module, state: Dict[str, torch.Tensor], frozen: bool) -> nn.Module:
        """The network kept under ``name`` (a copy of ``like`` made once), loaded with ``state``."""
        if name not in pool:
            pool[name] = copy.deepcopy(like)
        net = pool[name]
        net.load_state_dict(state)
        if frozen:
            net.eval()
            net.requires_grad_(False)
        return net
