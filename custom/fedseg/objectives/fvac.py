"""FVAC client objective (Federated Vessel-Aware Calibration, IJCAI 2025).

Per batch, with a frozen copy of the global model received this round:
    L = L_FMUG + beta * L_FVDA
where L_FMUG is cross-entropy weighted per pixel by the label-aware uncertainty of the local and the
global model (Eqs. 6-9) and L_FVDA aligns the foreground and background mean features of the local
model with the global model's (Eqs. 10-11). The server side is plain uniform averaging
(``FedAvgStrategy(weighting="uniform")``); nothing extra leaves the site.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fedseg.method_options import MethodOptions, option
from fedseg.uncertainty.morphology import as_class_index, pixel_uncertainty, pixel_weight_map

from fedseg.networks.feature_taps import network_features

from .base import BatchOutput, ClientObjective, RoundContext
from .fvac_losses import FVDA_FOREGROUND, FVDA_MEAN, fmug_loss, fvda_loss

if TYPE_CHECKING:  # pragma: no cover
    from fedseg.engine.api import SiteEngine


@dataclass(frozen=True)
class FVACOptions(MethodOptions):
    """FVAC's site options."""

    beta: float = option(2.0, "weight of the alignment term (paper: 2, best of {0.5, 1, 2, 3, 4})")
    use_fmug: bool = option(True, "uncertainty-weighted CE (Eq. 9); off: plain mean pixel CE (ablation)")
    use_fvda: bool = option(True, "add beta * L_FVDA (Eq. 11); off: dropped (ablation)")
    feature_layer: str = option("decoder_last", "the FeatureUNet.forward_features map to align (the paper names none: "
                                "the last decoder map before the 1x1 head is at full input resolution, so the mask "
                                "needs no down-sampling, and the head classifies it linearly)")
    mix: float = option(0.5, "weight of the global uncertainty in alpha = mix * U_g + (1 - mix) * U_k (paper: 0.5)")
    keep_weight_maps: int = option(4, "(image, label, alpha) triples kept for the site-local Fig. 4 figure, one image "
                                   "from each of the most recent batches; 0 keeps none")
    fvda_foreground: str = option("union", "how FVDA splits a multi-class mask: union (every non-background class; "
                                  "docs/methods.md FVAC) or per_class (one aligned mean feature per class); identical "
                                  "for binary masks")
    fvda_mean: str = option("image", "what each class's feature vector is divided by: image (every pixel of the map, "
                            "Eq. 10 as printed: a class's mean scaled by its pixel share) or class (its own pixels)")
    record_terms: int = option(0, "how big each term is (0: not recorded): every batch the two terms' values, every "
                               "record_terms-th batch their gradient norms too (class notes)")

    def __post_init__(self):
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if not 0.0 <= self.mix <= 1.0:
            raise ValueError(f"mix must be in [0, 1], got {self.mix}")
        if self.keep_weight_maps < 0:
            raise ValueError(f"keep_weight_maps must be >= 0, got {self.keep_weight_maps}")
        if self.fvda_foreground not in FVDA_FOREGROUND:
            raise ValueError(f"fvda_foreground must be one of {FVDA_FOREGROUND}, got {self.fvda_foreground!r}")
        if self.fvda_mean not in FVDA_MEAN:
            raise ValueError(f"fvda_mean must be one of {FVDA_MEAN}, got {self.fvda_mean!r}")
        terms = self.record_terms
        if not (isinstance(terms, int) and not isinstance(terms, bool) and terms >= 0):
            raise ValueError(f"record_terms must be an integer >= 0 (0 = off), got {terms!r}")
        for name in ("beta", "mix"):
            self._set(name, float(getattr(self, name)))
        for name in ("use_fmug", "use_fvda"):
            self._set(name, bool(getattr(self, name)))
        self._set("feature_layer", str(self.feature_layer))
        self._set("keep_weight_maps", int(self.keep_weight_maps))


class FVACObjective(ClientObjective):
    """``L = (L_FMUG or mean CE) + beta * L_FVDA`` against a frozen copy of the round's global model.

Options: :class:`FVACOptions`; ``seg_loss``: unused by the FVAC loss itself (FVAC replaces the bundle's Dice-CE
    with its own cross-entropy), accepted so the engine's hand-over works like for every objective. With
    ``record_terms`` N, every batch records the two terms' values; on the round's N-th, 2N-th, ... batch also the
    gradient norm of each over the trainable parameters (two extra backward passes; the round's first batch, where
    FVDA is zero because the local model is the global one, only when N is 1). The round's train metrics then carry
    ``fvda_loss_share`` (mean of ``beta L_FVDA / (L_main + beta L_FVDA)``), ``fvda_grad_ratio`` (mean of
    ``||grad beta L_FVDA|| / ||grad L_main||``), ``main_loss`` and ``fvda_loss`` (means of ``L_main`` and
    ``beta L_FVDA``): scalars of this site's training, like ``train_loss``.

    The frozen copy is taken in :meth:`begin_round` in eval mode with ``requires_grad=False``: eval mode
    so it never updates normalisation running statistics and its dropout (if any) is off, making ``U_g``
    and ``F^g`` deterministic functions of the received weights. With the bundle's instance norm
    (no running statistics) eval and train mode compute the same outputs; the choice only matters for
    batch norm or dropout. Cost: one extra no-grad forward pass per batch and one extra model in memory.
    """

    name = "fvac"
    needs_features = True
    needs_class_logits = True
    declared_statistics: Tuple[str, ...] = ()
    options_class = FVACOptions

    def __init__(self, seg_loss: Optional[nn.Module] = None, **options: Any):
        super().__init__(seg_loss=seg_loss, **options)
        self._params: List[nn.Parameter] = []
        self._terms: List[Tuple[float, float]] = []
        self._grad_ratios: List[float] = []
        #: FVDA reads this map of the local and the frozen global model (none when FVDA is off)
        self.feature_roles = (self.feature_layer,) if self.use_fvda and self.beta > 0 else ()
        self._global: Optional[nn.Module] = None
        self._weight_maps: Deque[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = deque(maxlen=self.keep_weight_maps)

    # ------------------------------------------------------------------------------------- round hooks
    @property
    def global_model(self) -> Optional[nn.Module]:
        """The frozen copy of this round's received global model (``None`` outside a round)."""
        return self._global

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        """Freeze a deep copy of ``model``, which holds the just-received global weights."""
        frozen = copy.deepcopy(model)
        frozen.eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
            p.grad = None
        self._global = frozen
        if self.record_terms and ctx.train_config.get("dp_target_epsilon") is not None:
            # the extra backward passes would run through DP-SGD's per-sample gradient hooks
            raise ValueError("FVAC's record_terms cannot be combined with differential privacy (dp_target_epsilon)")
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._terms, self._grad_ratios = [], []

    def local_training(self, engine: SiteEngine, model: nn.Module, ctx: RoundContext) -> Dict[str, float]:
        """The round's training; with ``record_terms``, its term sizes among the train metrics (class notes)."""
        metrics = super().local_training(engine, model, ctx)
        if self._terms:
            main, fvda = (torch.tensor(v, dtype=torch.float64) for v in zip(*self._terms))
            metrics.update(main_loss=float(main.mean()), fvda_loss=float(fvda.mean()),
                           fvda_loss_share=float((fvda / (main + fvda).clamp_min(1e-12)).mean()))
        if self._grad_ratios:
            metrics["fvda_grad_ratio"] = float(torch.tensor(self._grad_ratios, dtype=torch.float64).mean())
        return metrics

    def _record(self, main: torch.Tensor, fvda: torch.Tensor) -> None:
        """The two terms of one batch (and, every ``record_terms``-th batch, their gradient norms)."""
        self._terms.append((float(main.detach()), float(fvda.detach())))
        # the record_terms-th, 2 record_terms-th, ... batch of the round: with record_terms > 1 never the first, where
        # the local model still equals the global one, so FVDA and its gradient are zero by construction
        if len(self._terms) % self.record_terms or not self._params or not torch.is_grad_enabled():
            return
        norms = []
        for term in (main, fvda):
            grads = torch.autograd.grad(term, self._params, retain_graph=True, allow_unused=True)
            norms.append(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
        self._grad_ratios.append(float(norms[1] / norms[0].clamp_min(1e-12)))

    def save_site_figures(self, out_dir: str, ctx: RoundContext) -> None:
        """The paper's Fig. 4 for this site: image / truth / pixel weight map alpha (site-local)."""
        from pathlib import Path

        from fedseg.plots.fvac_figures import save_weight_map_figure

        try:
            images, labels, alpha = self.last_weight_maps()
        except LookupError:  # FMUG switched off: there is no weight map to show
            return
        save_weight_map_figure(images, labels, alpha, Path(out_dir) / "fvac_weight_maps.png")

    def end_round(self, ctx: RoundContext, model: nn.Module, engine: SiteEngine) -> Dict[str, Any]:
        """Drop the frozen copy (frees one model's memory between rounds); nothing is sent."""
        self._global = None
        self._params = []
        return {}

    # -------------------------------------------------------------------------------------------- loss
    def _needs_global(self) -> bool:
        return self.use_fmug or (self.use_fvda and self.beta > 0)

    def loss(self, out: BatchOutput) -> torch.Tensor:
        """Scalar FVAC loss of one batch; ``out.features`` must hold ``feature_layer`` when FVDA is on."""
        logits, labels = out.logits, out.labels
        logits_g: Optional[torch.Tensor] = None
        feats_g: Dict[str, torch.Tensor] = {}
        if self._needs_global():
            if self._global is None:
                raise RuntimeError("FVACObjective.loss called before begin_round: no frozen global model")
            with torch.no_grad():
                logits_g, feats_g = network_features(self._global, out.inputs, self.feature_roles)

        if self.use_fmug:
            alpha = self._weight_map(logits, logits_g, labels)
            total = fmug_loss(logits, labels, alpha)
            self._remember(out.inputs, labels, alpha)
        else:
            total = F.cross_entropy(logits.float(), as_class_index(labels)[:, 0])

        if self.use_fvda and self.beta > 0:
            feat_local, feat_global = self._layer(out.features, "local"), self._layer(feats_g, "global")
            alignment = self.beta * fvda_loss(feat_local, feat_global, labels, self.fvda_foreground, logits.shape[1],
                                               self.fvda_mean)
            if self.record_terms:
                self._record(total, alignment)
            total = total + alignment
        return total

    def _weight_map(self, logits: torch.Tensor, logits_g: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """alpha (B, 1, H, W) from the local and global softmax uncertainties, no gradient."""
        u_local = pixel_uncertainty(torch.softmax(logits.detach().float(), dim=1), labels)
        u_global = pixel_uncertainty(torch.softmax(logits_g.float(), dim=1), labels)
        return pixel_weight_map(u_local, u_global, mix=self.mix)

    def _layer(self, features: Dict[str, torch.Tensor], side: str) -> torch.Tensor:
        if self.feature_layer not in features:
            raise KeyError(
                f"FVAC feature_layer {self.feature_layer!r} missing from the {side} model's features "
                f"(available: {sorted(features)}); the engine must call forward_features (needs_features=True)"
            )
        return features[self.feature_layer]

    # ---------------------------------------------------------------------------- site-local figure data
    def _remember(self, inputs: torch.Tensor, labels: torch.Tensor, alpha: torch.Tensor) -> None:
        if self._weight_maps.maxlen == 0:
            return
        # one image per batch keeps the copy to the host small; these tensors never leave the site
        image, label, weights = inputs[0], labels[0], alpha[0]
        if image.ndim == 4:  # a 3-D patch: its slice (last axis) with the most labelled voxels, for the 2-D figure
            k = int(label[0].flatten(0, 1).gt(0).sum(0).argmax())
            image, label, weights = image[..., k], label[..., k], weights[..., k]
        self._weight_maps.append((image.detach().float().cpu(), label.detach().float().cpu(), weights.detach().float().cpu()))

    def last_weight_maps(self, n: int = 4) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``n`` most recent kept triples, oldest first, as CPU tensors.

        Returns:
            ``(images (n, C_in, H, W), labels (n, 1, H, W), alpha (n, 1, H, W))`` with ``n`` capped at
            what is kept. For a site-local figure only (:func:`fedseg.plots.fvac_figures.save_weight_map_figure`);
            never put these in a message to the server.

        Raises:
            LookupError: nothing kept yet (no FMUG batch has run, or ``keep_weight_maps=0``).
        """
        kept = list(self._weight_maps)[-n:] if n > 0 else []
        if not kept:
            raise LookupError(
                "no FVAC weight maps kept yet (needs use_fmug=True, keep_weight_maps > 0 and a training batch)"
            )
        images, labels, alpha = zip(*kept)
        return torch.stack(images), torch.stack(labels), torch.stack(alpha)
