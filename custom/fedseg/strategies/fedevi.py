"""FedEvi (Chen et al., MICCAI 2024): evidential weight aggregation.

Round r, the train task returns the local models theta_k^r with A (aleatoric uncertainty of the site's own theta_k^r on
its validation split) and R_paper (mean over images of 1 / aleatoric uncertainty of theta_k^r):
    1. surrogate  theta_hat = sum_k beta_k^{r-1} theta_k^r
    2. task "evaluate_surrogate": every site returns G, the epistemic uncertainty of theta_hat on its validation
       split (the one statistic that needs every site's model of the round, hence a second task)
    3. beta^r = update_beta(beta^{r-1}, G, R)   (see ``evidential_weights``)
    4. theta^r = sum_k beta_k^r theta_k^r
beta^0 = n_k / sum(n) ("samples", paper default) or 1/K ("uniform", the paper's ablation).

Sites missing from a round. The weights live in ``self.beta`` ({site: w}, summing to 1 over every site
seen so far). A round uses the weights of the sites that trained, renormalised over them. A site that
trained but did not answer the surrogate task (dropped, or sent malformed statistics) has no G/R
evidence for its model, so it is left out of this round's average and its stored weight is kept as it
was; the answering sites share the weight mass they held before. When it comes back, it starts from
its previous weight. A site seen for the first time after round 0 enters with its beta^0 share among
this round's sites, and the stored weights are renormalised. If no site answers, theta^r is the
surrogate and the weights stay unchanged.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from fedseg.method_options import MethodOptions, option

from .aggregation import check_weighting, sample_weights, weighted_average
from .base import ClientUpdate, Exchange, ServerStrategy, SitePayload
from .evidential_weights import RELIABILITY_FORMS, reliability, update_beta

logger = logging.getLogger(__name__)

SURROGATE_TASK = "evaluate_surrogate"


@dataclass(frozen=True)
class FedEviOptions(MethodOptions):
    """FedEvi's server options. The switches are the paper's ablation (Table 4): without G the gap factor is 1,
    without R the reliability is 1; ``delta = 0`` keeps beta at beta^0 (evidential model training only, "EMT")."""

    delta: float = option(1.0, "weight-adjustment magnitude (paper: 1.0)")
    weight_form: str = option("code", "the reliability R of the update: code (R = 1 / A, as the reference code whose run "
                              "the paper's tables come from; robust to one near-certain image) or paper "
                              "(R = mean(1 / U_ale), Eq. 7)")
    beta0: str = option("samples", "the first weights: samples (n_k / sum n) or uniform (1/K)")
    clip: float = option(1e-3, "lower bound on a weight after normalising (reference code: 1e-3)")
    use_gap: bool = option(True, "the gap factor G of the update (off: 1)")
    use_reliability: bool = option(True, "the reliability R of the update (off: 1)")
    accumulate: bool = option(True, "add each round's delta * G * R to the previous weights (the reference run) or "
                              "replace them")

    def __post_init__(self):
        if self.weight_form not in RELIABILITY_FORMS:
            raise ValueError(f"weight_form must be one of {RELIABILITY_FORMS}, got {self.weight_form!r}")
        check_weighting(self.beta0, "beta0")
        if self.delta < 0 or not 0 <= self.clip < 1:
            raise ValueError(f"need delta >= 0 and 0 <= clip < 1, got delta={self.delta}, clip={self.clip}")
        self._set("delta", float(self.delta))
        self._set("clip", float(self.clip))
        for name in ("use_gap", "use_reliability", "accumulate"):
            self._set(name, bool(getattr(self, name)))


class FedEviStrategy(ServerStrategy):
    """Re-weights sites every round from the surrogate's epistemic and the local models' aleatoric uncertainty;
    options: :class:`FedEviOptions`."""

    name = "fedevi"
    objective = "fedevi"
    extra_tasks = (SURROGATE_TASK,)
    options_class = FedEviOptions
    # the surrogate and the new model are weighted sums; G, A and R are declared scalars, read in the clear
    he_refusal_reason = None

    def __init__(self, **options: Any):
        super().__init__(**options)
        #: current aggregation weights over every site seen so far (sum 1)
        self.beta: Dict[str, float] = {}

    def start(self, clients: List[str], initial_params) -> None:
        super().start(clients, initial_params)
        self.beta = {}

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "beta": dict(self.beta)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.beta = {str(s): float(w) for s, w in state["beta"].items()}

    def _previous_weights(self, sites: List[str], updates: Dict[str, ClientUpdate]) -> Dict[str, float]:
        """beta^{r-1} over ``sites``, renormalised; sites never seen before get their beta^0 share."""
        new = [s for s in sites if s not in self.beta]
        if new:
            if self.beta0 == "samples":
                share = dict(zip(sites, sample_weights({s: updates[s].n_samples for s in sites}, sites)))
            else:
                share = {s: 1.0 / len(sites) for s in sites}
            for s in new:
                self.beta[s] = share[s]
            total = sum(self.beta.values())
            self.beta = {s: w / total for s, w in self.beta.items()}
        total = sum(self.beta[s] for s in sites)
        return {s: self.beta[s] / total for s in sites}

    def _read_statistics(self, update: ClientUpdate, reply: ClientUpdate) -> Dict[str, float]:
        """G, A (and R_paper when present or needed) of a site: A and R_paper describe its local model and come with
        its train update, G with its surrogate-task reply (a reply that also carries A / R_paper is read first);
        ValueError if unusable."""
        meta = {**{k: v for k, v in (update.meta or {}).items() if k in ("A", "R_paper")}, **(reply.meta or {})}
        needed = ("G", "A", "R_paper") if self.weight_form == "paper" else ("G", "A")
        missing = [k for k in needed if k not in meta]
        if missing:
            raise ValueError(f"missing {missing}")
        stats = {k: float(meta[k]) for k in ("G", "A", "R_paper") if k in meta}
        if not all(math.isfinite(v) for v in stats.values()):
            raise ValueError(f"non-finite statistics {stats}")
        if stats["G"] < 0 or stats["A"] <= 0 or stats.get("R_paper", 0.0) < 0:
            raise ValueError(f"need G >= 0, A > 0, R_paper >= 0, got {stats}")
        return stats

    def _collect(
        self, sites: List[str], updates: Dict[str, ClientUpdate], replies: Dict[str, ClientUpdate]
    ) -> Tuple[Dict[str, Dict[str, float]], Dict[str, str]]:
        stats: Dict[str, Dict[str, float]] = {}
        dropped: Dict[str, str] = {}
        for s in sites:
            if s not in replies:
                dropped[s] = "no reply to the surrogate task"
                continue
            try:
                stats[s] = self._read_statistics(updates[s], replies[s])
            except ValueError as err:
                dropped[s] = f"unusable statistics: {err}"
        for s, why in dropped.items():
            logger.warning("fedevi: site %s left out of this round's average (%s)", s, why)
        return stats, dropped

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        prev = self._previous_weights(sites, updates)
        surrogate = weighted_average([updates[s].params for s in sites], [prev[s] for s in sites])

        # the second task carries only the surrogate weights and the round index
        payloads = {s: SitePayload(params=surrogate, meta={"fedevi": {"round": int(round_)}}) for s in sites}
        stats, dropped = self._collect(sites, updates, exchange(SURROGATE_TASK, payloads))
        answered = [s for s in sites if s in stats]
        if not answered:
            self._global = surrogate
            return {"beta": prev, "G": {}, "R": {}, "A": {}, "dropped": sorted(dropped)}

        held = sum(prev[s] for s in answered)
        gaps = {s: (stats[s]["G"] if self.use_gap else 1.0) for s in answered}
        rel = {
            s: (reliability(A=stats[s]["A"], form=self.weight_form, inv_mean=stats[s].get("R_paper")) if self.use_reliability else 1.0)
            for s in answered
        }
        beta = update_beta(
            {s: prev[s] / held for s in answered}, gaps, rel, delta=self.delta, clip=self.clip,
            renormalise_after_clip=True,  # weighted_average needs a convex combination
            accumulate=self.accumulate,
        )
        # answering sites share the stored mass they held; a dropped site keeps its stored weight
        stored_mass = sum(self.beta[s] for s in answered)
        for s in answered:
            self.beta[s] = stored_mass * beta[s]

        self._global = weighted_average([updates[s].params for s in answered], [beta[s] for s in answered])
        report: Dict[str, Any] = {
            "beta_prev": dict(prev),
            "beta": dict(beta),
            "G": gaps,
            "R": rel,
            "A": {s: stats[s]["A"] for s in answered},
            "dropped": sorted(dropped),
        }
        r_paper = {s: stats[s]["R_paper"] for s in answered if "R_paper" in stats[s]}
        if r_paper:
            report["R_paper"] = r_paper
        return report
