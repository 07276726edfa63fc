"""PathFL client objective (Medical Image Analysis 2025): image-level style mixing (CSE), the statistics
for feature alignment (AFA) and the noise batch for stratified similarity aggregation (SSA).

The loss is the bundle's segmentation loss (the PathFL recipe sets it to cross-entropy as in the paper).
What the site sends besides its weights, each only when its module is on:

* CSE: ``cse_mean``, ``cse_std`` — per-channel mean/std of its training batches this round (2 x C numbers);
* AFA: ``afa_mean``, ``afa_sq_mean`` — first and second moments of the raw bottleneck elements seen in
  this round's training forward passes (2 numbers; no extra pass);
* SSA: ``ssa_noise`` — a ``(ssa_noise_batch, C, ssa_noise_size, ssa_noise_size)`` batch of Gaussian noise
  drawn from the per-channel mean/std of its whole training set. Pure noise: no pixel of an image.

Under DP-SGD these statistics are, like every declared statistic, outside the epsilon (``engine.py``).
The AFA re-normalisation itself is a layer of the network (``fedseg.networks.FeatureAlignment``), whose
global moments the server writes into the weights it sends.
"""

from __future__ import annotations

import math

import zlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from fedseg.alignment.style import channel_statistics, hybrid_images
from fedseg.config import BASE_TRAIN_CONFIG
from fedseg.method_options import MethodOptions, option
from fedseg.networks.feature_taps import feature_module, has_native_features

from .base import ClientObjective, RoundContext

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SegmentationEngine

#: ``cse_statistics`` values: a patch is restyled with its own or its whole image's channel statistics
CSE_STATISTICS = ("patch", "image")
#: server meta key of the style pool: {"mean": [[C floats] per site], "std": [[C floats] per site]}
STYLE_POOL_KEY = "cse_style_pool"


def noise_dims(train_config: Dict[str, Any]) -> int:
    """Spatial dimensions of SSA's noise batch: those of the network. 3 for a user's 3-D network (noise volumes); 2
    otherwise, volumes in slice mode included (the suite's network there is 2-D; its 3-D network is refused)."""
    from fedseg.bundle import is_bundle_path

    three_d = is_bundle_path(train_config.get("bundle")) and int(train_config.get("spatial_dims") or 2) == 3
    return 3 if three_d else 2


@dataclass(frozen=True)
class PathFLSiteOptions(MethodOptions):
    """PathFL's site options."""

    use_cse: bool = option(True, "mix every training image with a restyled copy of itself once the server sends a "
                           "style pool")
    use_afa: bool = option(True, "report bottleneck moments (the alignment layer is in the network: feature_alignment)")
    use_ssa: bool = option(True, "send a Gaussian noise batch each round")
    ssa_noise_batch: int = option(4, "images in the noise batch (ssa_noise_batch, C, size, size)")
    ssa_noise_size: int = option(64, "side of the noise images; must suit the network (a multiple of 2 ** depth)")
    keep_examples: int = option(4, "(original, restyled, hybrid) triples kept for the site-local figure")
    cse_statistics: str = option("image", "whose mean/std CSE normalises a training patch by, and reports as the site's "
                                 "style: image (the whole image the patch was cut from: what the paper's whole 512 px "
                                 "inputs amount to) or patch (the patch's own; docs/methods.md, PathFL)")

    def __post_init__(self):
        if self.cse_statistics not in CSE_STATISTICS:
            raise ValueError(f"cse_statistics must be one of {CSE_STATISTICS}, got {self.cse_statistics!r}")
        if self.ssa_noise_batch < 1 or self.ssa_noise_size < 1:
            raise ValueError(f"ssa_noise_batch and ssa_noise_size must be >= 1, got {self.ssa_noise_batch}, "
                             f"{self.ssa_noise_size}")
        for name in ("use_cse", "use_afa", "use_ssa"):
            self._set(name, bool(getattr(self, name)))
        for name in ("ssa_noise_batch", "ssa_noise_size", "keep_examples"):
            self._set(name, int(getattr(self, name)))


class PathFLObjective(ClientObjective):
    """Segmentation loss on CSE hybrids; AFA moments and the SSA noise batch as declared statistics; options:
    :class:`PathFLSiteOptions`; ``seg_loss``: the segmentation loss (default: the bundle's, handed over by the engine).
    Resize mode restyles the same with either ``cse_statistics``."""

    name = "pathfl"
    declared_statistics: Tuple[str, ...] = ("cse_mean", "cse_std", "afa_mean", "afa_sq_mean")
    # a standard deviation and a second moment are not negative (the means may be)
    statistic_ranges = {"cse_std": (0.0, math.inf), "afa_sq_mean": (0.0, math.inf)}
    options_class = PathFLSiteOptions

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self._pool: Optional[Tuple[list, list]] = None
        self._generator: Optional[torch.Generator] = None
        self._batch_sum: Optional[torch.Tensor] = None  # (2, C): sums of batch means and stds
        self._batches = 0
        self._moments = [0.0, 0.0, 0]  # sum Z, sum Z^2, count, of this round's raw bottleneck elements
        self._hooked: Optional[int] = None
        self._hook = None
        self._spatial_dims = 2
        self._training_stats: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self._examples: Deque[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = deque(maxlen=self.keep_examples)

    def declared_arrays(self, train_config: Dict[str, Any]) -> Dict[str, Tuple[int, ...]]:
        if not self.use_ssa:
            return {}
        channels = int(train_config.get("in_channels", BASE_TRAIN_CONFIG["in_channels"]))
        dims = noise_dims(train_config)
        return {"ssa_noise": (self.ssa_noise_batch, channels) + (self.ssa_noise_size,) * dims}

    # ------------------------------------------------------------------------------------- round
    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        if getattr(model, "spatial_dims", 2) != 2 and has_native_features(model):
            # a volume job of the suite's network reached a site with PathFL (the recipe refuses it; a hand-written job
            # may not); a user's 3-D network is read through hooks (fedseg.networks.feature_taps)
            raise ValueError("PathFL is 2-D only: run volumes with spatial_mode='slices'")
        self._spatial_dims = noise_dims(ctx.train_config)
        if self._generator is None:
            job_seed = int(ctx.train_config.get("seed", BASE_TRAIN_CONFIG["seed"]))
            seed = job_seed * 1_000_003 + zlib.crc32(ctx.site.encode())
            self._generator = torch.Generator().manual_seed(seed)
        pool = ctx.server_meta.get(STYLE_POOL_KEY) if self.use_cse else None
        self._pool = (pool["mean"], pool["std"]) if pool and pool.get("mean") else None
        self._batch_sum, self._batches = None, 0
        self._moments = [0.0, 0.0, 0]
        if self.use_afa:
            self._watch_bottleneck(model)

    # a site training as N ranks: every rank's batch styles and bottleneck moments add up on rank 0
    def begin_rank_epochs(self, model: nn.Module) -> None:
        self._batch_sum, self._batches = None, 0
        self._moments = [0.0, 0.0, 0]
        if self.use_afa:
            self._watch_bottleneck(model)

    def rank_records(self) -> Tuple[Optional[torch.Tensor], int, list]:
        return self._batch_sum, self._batches, list(self._moments)

    def merge_rank_records(self, records: List[Any]) -> None:
        for batch_sum, batches, moments in records:
            if batch_sum is not None:
                self._batch_sum = batch_sum if self._batch_sum is None else self._batch_sum + batch_sum
            self._batches += batches
            self._moments = [a + b for a, b in zip(self._moments, moments)]

    def __getstate__(self) -> Dict[str, Any]:
        # the bottleneck hook is a closure of this process (sent to another rank, a copy attaches its own)
        return {**self.__dict__, "_hook": None, "_hooked": None}

    def _watch_bottleneck(self, model: nn.Module) -> None:
        """Record the raw bottleneck (before alignment) of every training forward pass."""
        if self._hooked == id(model):
            return

        def record(module: nn.Module, args: Any, out: torch.Tensor) -> None:
            if module.training:
                z = out.detach().double()
                self._moments[0] += float(z.sum())
                self._moments[1] += float((z * z).sum())
                self._moments[2] += z.numel()

        if self._hook is not None:
            self._hook.remove()
        # before the alignment a user's network applies by a hook on the same module (feature_taps)
        self._hook = feature_module(model, "bottleneck").register_forward_hook(record, prepend=True)
        self._hooked = id(model)

    def prepare_inputs(
        self, inputs: torch.Tensor, labels: torch.Tensor, source_statistics: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> torch.Tensor:
        """Record this batch's style; return CSE hybrids when a style pool has arrived (else ``inputs``)."""
        if not self.use_cse:
            return inputs
        source = None
        if self.cse_statistics == "image" and source_statistics is not None:
            source = tuple(torch.as_tensor(t).to(inputs) for t in source_statistics)
            mean, std = source
        else:
            mean, std = channel_statistics(inputs.detach())
        batch = torch.stack([mean.mean(0), std.mean(0)]).double().cpu()
        self._batch_sum = batch if self._batch_sum is None else self._batch_sum + batch
        self._batches += 1
        if self._pool is None:
            return inputs
        hybrids, restyled = hybrid_images(inputs, self._pool[0], self._pool[1], generator=self._generator, source=source)
        example = (inputs[0], restyled[0], hybrids[0])
        if inputs.dim() == 5:  # a volume: its middle slice along the last axis, for the 2-D site-local figure
            example = tuple(t[..., t.shape[-1] // 2] for t in example)
        self._examples.append(tuple(t.detach().cpu() for t in example))
        return hybrids

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SegmentationEngine) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.use_cse and self._batches:
            mean, std = (self._batch_sum / self._batches).tolist()
            out["cse_mean"], out["cse_std"] = mean, std
        if self.use_afa and self._moments[2]:
            out["afa_mean"] = self._moments[0] / self._moments[2]
            out["afa_sq_mean"] = self._moments[1] / self._moments[2]
        if self.use_ssa:
            out["ssa_noise"] = self.noise_batch(engine, ctx.round)
        return out

    # -------------------------------------------------------------------------------------- SSA
    def noise_batch(self, engine: SegmentationEngine, round_: int) -> np.ndarray:
        """``g_m ~ N(mu_m, sigma_m)`` per channel, ``(ssa_noise_batch, C, S, S)`` float32, where ``mu_m``,
        ``sigma_m`` are the whole training set's intensity statistics (computed once)."""
        if self._training_stats is None:
            self._training_stats = engine.intensity_statistics("training")
        mean, std = self._training_stats
        generator = torch.Generator().manual_seed(int(self._generator.initial_seed()) + 7919 * (int(round_) + 1))
        dims = self._spatial_dims
        shape = (self.ssa_noise_batch, mean.numel()) + (self.ssa_noise_size,) * dims
        extra = (1,) * dims
        noise = torch.randn(shape, generator=generator) * std.view(1, -1, *extra) + mean.view(1, -1, *extra)
        return noise.numpy().astype(np.float32)

    # ------------------------------------------------------------------------------------ figure
    def last_examples(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(originals, restyled, hybrids)``, each ``(N, C, H, W)``, from the most recent batches."""
        if not self._examples:
            raise LookupError("no CSE examples recorded (CSE off, or no style pool arrived yet)")
        return tuple(torch.stack(t) for t in zip(*self._examples))  # type: ignore[return-value]

    def save_site_figures(self, out_dir: str, ctx: RoundContext) -> None:
        """Original / restyled / hybrid training patches of this site (site-local, never sent)."""
        from pathlib import Path

        from fedseg.plots.pathfl_figures import save_style_figure

        try:
            originals, restyled, hybrids = self.last_examples()
        except LookupError:
            return
        save_style_figure(originals, restyled, hybrids, Path(out_dir) / "pathfl_cse_examples.png")
