"""Site side of the methods that keep some layers at each site: FedBN (normalisation layers) and FedRep (head).

The site never sends the local entries (``local_state_keys``) and the server never sends them either: the
site loads the shared entries it receives and puts back its own local entries, kept after every round in
``ctx.state_dir`` (``<method>_local_layers.pt``; a restarted site reads them back, a re-sent round starts
from the entries before it). In round 0 the local entries are the network's initial values, the same at
every site (the network is built from the job's ``init_seed``). After training, the task ``submit_model``
returns the site's whole model (shared + local), which the server evaluates as the site's personalised model
and in the cross-site evaluation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from torch import nn

from fedseg.fl.protocol import SUBMIT_MODEL_TASK

from .base import ClientObjective, RoundContext, UnknownTaskError
from .site_records import KeepsRoundRecords, cpu_copy

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine


class LocalLayersObjective(KeepsRoundRecords, ClientObjective):
    """Base: the bundle's segmentation loss; ``local_keys(model)`` name the entries that stay at the site."""

    weight_tasks = (SUBMIT_MODEL_TASK,)

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self._keys: Dict[int, Tuple[str, ...]] = {}

    def local_keys(self, model: nn.Module) -> List[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def local_state_keys(self, model: nn.Module) -> Tuple[str, ...]:
        if id(model) not in self._keys:
            keys = tuple(self.local_keys(model))
            if not keys:
                raise ValueError(f"{self.name}: the network has no entries to keep local ({self._empty_hint})")
            self._keys[id(model)] = keys
        return self._keys[id(model)]

    _empty_hint = ""

    def restore_local(self, ctx: RoundContext, model: nn.Module, before_round: int) -> Optional[int]:
        """Put this site's local entries of the newest round ``< before_round`` into ``model``; returns that
        round, or None when there is none yet (round 0: the network's initial values stay)."""
        kept = self.site_records(ctx).before(before_round)
        if kept is None:
            return None
        local = kept[1]["local"]
        expected = set(self.local_state_keys(model))
        if set(local) != expected:
            raise RuntimeError(f"{ctx.site}: kept local entries {sorted(local)[:3]}... do not match the model's {sorted(expected)[:3]}...")
        model.load_state_dict(local, strict=False)
        return kept[0]

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        self.restore_local(ctx, model, ctx.round)

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SiteEngine) -> Dict[str, Any]:
        state = model.state_dict()
        self.site_records(ctx).save(ctx.round, {"local": cpu_copy({k: state[k] for k in self.local_state_keys(model)})})
        return {}

    def handle_weight_task(self, task_name: str, ctx: RoundContext, model: nn.Module, engine: SiteEngine):
        """``submit_model``: the site's whole model after its last training (shared entries as received)."""
        if task_name != SUBMIT_MODEL_TASK:
            raise UnknownTaskError(f"objective {self.name!r} does not handle weight task {task_name!r}")
        if self.restore_local(ctx, model, ctx.round) is None:
            raise RuntimeError(f"{ctx.site}: no local layers kept: this site never trained in this job")
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, {}, {}


class FedBNObjective(LocalLayersObjective):
    """FedBN (Li et al., ICLR 2021): every normalisation layer stays local (``fedseg.networks.partition``)."""

    name = "fedbn"
    records_name = "fedbn_local_layers"
    _empty_hint = "norm='instance' has no affine parameters or running statistics; use norm='batch' or 'instance_affine'"

    def local_keys(self, model: nn.Module) -> List[str]:
        from fedseg.networks.partition import normalisation_state_keys

        return normalisation_state_keys(model)
