"""One site's local training as N ranks (one process per GPU), launched by ``torchrun --nproc_per_node=N``.

A site that is a multi-GPU server runs its Client API site script under torchrun (``fedseg.fl.site_ranks``;
recipe option ``site_executor="client_api_torchrun"`` with ``site_ranks=N``). Rank 0 *is* the site: it alone talks
to NVFlare (one model update per site per round), holds the site's engine, model and objective, and answers every
task. Ranks 1..N-1 hold an engine over the same datalist and join only the training epochs:

* :meth:`fedseg.engine.base.LocalEngine.run_epochs` on rank 0 sends the other ranks what the epochs need — the model,
  its optimiser, the objective and the state of the data-order generator, serialised together so that the
  objective's references to the model's parameters survive — over a CPU (gloo) control group, then every rank runs
  the same epochs with the model in ``DistributedDataParallel``;
* the training split is sharded by ``DistributedSampler`` (seed drawn from the engine's data-order generator once per
  ``run_epochs``, ``set_epoch`` every epoch), in per-rank batches of ``batch_size / N``: the sampler deals one
  permutation round-robin, so the union of the ranks' batch ``b`` is the one-rank global batch ``b``, and DDP's
  gradient average over equal shares is the one-rank gradient of the global batch's mean loss. Equal shares need
  ``batch_size`` divisible by N (required) and the number of training images divisible by N (otherwise
  ``DistributedSampler`` repeats up to N-1 images per epoch, as in any DDP training);
* what the objective recorded during the epochs (``ClientObjective.rank_records``: GraphFedSeg's last-epoch
  vacuities, PathFL's style and feature moments, FedEFM's teacher weights) is gathered and merged on rank 0;
* everything else — validation, test evaluation, the methods' extra passes after training (uncertainty, surrogate
  evaluation, feature statistics, style pools, experts) — runs once, on rank 0, over the whole site data, so it
  gives the statistics of one process.

Backend ``nccl`` on CUDA (device ``cuda:LOCAL_RANK``), ``gloo`` on CPU. BatchNorm layers become ``SyncBatchNorm``
during the epochs on CUDA with N > 1 (global-batch statistics, sharing the layers' parameters and buffers); torch's
``SyncBatchNorm`` refuses CPU tensors, so CPU ranks normalise with their own batch's statistics. The default network
norm (``instance``) has no batch statistics: N ranks match one on either device.
"""

from __future__ import annotations

import datetime
import io
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

logger = logging.getLogger(__name__)

#: how long ranks 1..N-1 wait on the control group for rank 0's next message: rank 0 waits for NVFlare between
#: tasks (other sites training, server aggregation), which can take as long as the job's task timeout
CONTROL_TIMEOUT = datetime.timedelta(days=7)

#: control messages from rank 0
ENGINE, EPOCHS, STOP = "engine", "epochs", "stop"


class RanksOutOfStep(RuntimeError):
    """Training epochs failed while other ranks were inside them: the group cannot serve another task (the site
    script ends, torchrun stops every rank, and NVFlare reports the site's task missing)."""


@dataclass
class RankGroup:
    """This process's place among a site's ranks (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).

    Attributes:
        rank: global rank; 0 talks to NVFlare.
        world_size: N, the site's ranks.
        local_rank: the rank on this machine (picks the GPU).
        device: ``cuda:LOCAL_RANK`` where CUDA is available, else CPU.
        control: a gloo group for rank 0's messages (CPU tensors, long timeout; the training collectives use the
            default group: nccl or gloo).
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    control: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "RankGroup":
        """Join the process group torchrun set up (``nccl`` on CUDA, ``gloo`` on CPU).

        Raises:
            RuntimeError: torchrun's variables are missing, or more local ranks than GPUs.
        """
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(f"not started by torchrun (no {', '.join(missing)} in the environment): "
                               "run the site script as torchrun --nproc_per_node=N -m fedseg.fl.site_ranks ...")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if torch.cuda.is_available():
            if local >= torch.cuda.device_count():
                raise RuntimeError(f"local rank {local} but {torch.cuda.device_count()} visible GPU(s): "
                                   "start at most one rank per GPU (--nproc_per_node)")
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
            backend = "nccl"
        else:
            device, backend = torch.device("cpu"), "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend, rank=rank, world_size=world)
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        logger.info("rank %d of %d on %s (%s)", rank, world, device, backend)
        return cls(rank, world, local, device, control)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------------------------------ messages
    def send(self, kind: str, payload: Any = None) -> None:
        """Rank 0: broadcast ``(kind, payload)`` to the other ranks (``torch.save``: tensors, modules, optimisers)."""
        buffer = io.BytesIO()
        torch.save((kind, payload), buffer)
        dist.broadcast_object_list([buffer.getvalue()], src=0, group=self.control)

    def receive(self) -> Tuple[str, Any]:
        """Ranks 1..N-1: rank 0's next ``(kind, payload)``, its tensors on this rank's device."""
        box: List[Optional[bytes]] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return torch.load(io.BytesIO(box[0]), map_location=self.device, weights_only=False)

    def gather(self, value: Any) -> List[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.control)
        return out

    # ------------------------------------------------------------------------------------------ training
    def sampler(self, dataset, seed: int) -> "torch.utils.data.DistributedSampler":
        """This rank's share of ``dataset``: one permutation (``seed``) dealt round-robin to the ranks."""
        from torch.utils.data import DistributedSampler

        return DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=seed)

    def per_rank_batch(self, batch_size: int) -> int:
        """``batch_size / N``.

        Raises:
            ValueError: ``batch_size`` not divisible by N (the ranks' batches would not make the global batch).
        """
        if batch_size % self.world_size:
            raise ValueError(f"batch_size {batch_size} is not divisible by the site's {self.world_size} ranks: "
                             "each rank trains on batch_size / N images per step")
        return batch_size // self.world_size

    def wrap(self, network: nn.Module) -> nn.Module:
        """``network`` in ``DistributedDataParallel`` (unused parameters allowed: an objective may read features
        that only some parameters produce)."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(network, device_ids=ids, find_unused_parameters=True)

    def mean(self, value: float) -> float:
        """The mean of ``value`` over the ranks."""
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item()) / self.world_size

    @contextmanager
    def sync_batchnorm(self, model: nn.Module) -> Iterator[nn.Module]:
        """``model`` with its BatchNorm layers as ``SyncBatchNorm`` (same parameter and buffer tensors) for the
        epochs, restored afterwards; a no-op on CPU (torch's ``SyncBatchNorm`` needs an accelerator) or with N=1."""
        swaps = []
        if self.device.type == "cuda" and self.world_size > 1:
            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, nn.SyncBatchNorm):
                        swaps.append((parent, name, child))
                        parent._modules[name] = nn.SyncBatchNorm.convert_sync_batchnorm(child)
        try:
            yield model
        finally:
            for parent, name, child in swaps:
                parent._modules[name] = child


class EngineForward(nn.Module):
    """``network`` behind one ``forward(inputs, with_features)`` so that DDP sees every forward an engine makes
    (``LocalEngine.forward``: logits, or logits and named features)."""

    def __init__(self, engine, network: nn.Module):
        super().__init__()
        self.network = network
        self._engine_forward = engine.forward

    def forward(self, inputs: torch.Tensor, with_features: bool):
        return self._engine_forward(self.network, inputs, with_features)


@contextmanager
def without_hooks(model: nn.Module) -> Iterator[None]:
    """``model`` with no module hooks while it is serialised: hooks are process-local closures (an objective
    registers its own on the receiving rank, ``ClientObjective.begin_rank_epochs``)."""
    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
             "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
    saved = []
    for module in model.modules():
        for name in names:
            if getattr(module, name, None):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, type(getattr(module, name))())
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def follow(ranks: RankGroup, build_engine) -> None:
    """Ranks 1..N-1: build an engine when rank 0 builds one (``build_engine``: ``fedseg.engine.factory.build_engine``,
    passed in: the factory imports the engines, which import this module), join every ``run_epochs``, return on
    ``STOP``."""
    engine = None
    while True:
        kind, payload = ranks.receive()
        if kind == STOP:
            return
        if kind == ENGINE:
            site, datalist, train_config, bundle_dir = payload
            engine = build_engine(site, datalist, train_config, bundle_dir=bundle_dir, device=ranks.device)
            engine.ranks = ranks
        elif kind == EPOCHS:
            if engine is None:
                raise RuntimeError(f"rank {ranks.rank}: training epochs before any engine was built")
            engine.join_epochs(payload)
        else:
            raise RuntimeError(f"rank {ranks.rank}: unknown message {kind!r} from rank 0")
