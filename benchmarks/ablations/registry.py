"""What carries FVAC's and PathFL's results (``docs/results/ablations.md``): each part of a method switched off on
its own, on the method's own domain, each arm paired per test image with the arm that differs from it in that part
alone.

FVAC on real retina (its domain) and real nuclei: FVAC, FMUG only, FVDA only, neither (cross-entropy with uniform
averaging, FVAC's code path), FedAvg trained with FVAC's loss and weighting (cross-entropy, 1/K), and FedAvg as
shipped (Dice + CE, sample-weighted). FVAC against FedAvg changes the loss, the weighting and the method at once; the
pairs separate them. On retina also FedAvg with cross-entropy alone (the loss apart from the weighting) and FVDA with
each class's plain mean feature (``fvda_mean=class``), and the FVDA arms record FVDA's share of the loss and of the
gradient (``fvac:record_terms``), rendered from ``term_sizes.py``.

PathFL on real nuclei (its domain): PathFL and each of CSE, AFA and SSA off; AFA again with batch normalisation
(``norm=batch``), where the sites' bottleneck moments differ. SSA on the three-site retina federation, where its
weights can differ from 1/K: against sample-weighted and 1/K averaging, with the noise batch at the size the paper's
communication cost implies (512 px), and the weights it gave each site (``ssa_weights.py``).

Budget: the server-step benches' (``benchmarks/server_step/registry.py``): retina 20 rounds, nuclei 10 rounds with
whole-tile validation in the last only, 1 local epoch, seeds 0, 1, 2. Several runs at once (``--parallel``) on the
2-CPU machine: round-time ratios include each other's load.
"""

from __future__ import annotations

from typing import Any, Dict, List

from benchmarks.ablations.render import render_ssa_weights, render_term_sizes
from benchmarks.core.registry import REAL_DATA
from benchmarks.server_step.registry import SERVER_STEP_ROUNDS

PAGE = "docs/results/ablations.md"

#: FVAC's arms: each label, then what it is
FVAC_ARMS = ("fedavg fvac{terms} fvac-fmug-only=fvac:use_fvda=false fvac-fvda-only=fvac:use_fmug=false{terms_alone} "
             "fvac-neither=fvac:use_fmug=false,use_fvda=false fedavg-ce-uniform=fedavg:weighting=uniform,lambda_dice=0")
#: the budget options after the arms, per federation: the server-step benches' budget. Their runs are not reused: they
#: predate the engine's per-round data order (until then every round replayed the first round's batches), which moved
#: FVAC's retina Dice by more than its gain over FedAvg; every arm here runs on one code version
BUDGET = {
    "retina": f"--references --seeds 0 1 2 --rounds {SERVER_STEP_ROUNDS['retina']} --local-epochs 1 "
              "--task-request-interval 0.2 --task-timeout 3600",
    "nuclei": f"--references --seeds 0 1 2 --rounds {SERVER_STEP_ROUNDS['nuclei']} --local-epochs 1 "
              f"--task-request-interval 0.2 --task-timeout 3600 --set validate_every={SERVER_STEP_ROUNDS['nuclei']}",
}


def ablation_bench(federation: str, arms: str, parallel: int = 3, reuse: str = "") -> List[str]:
    """The import of a real federation, then ``fedseg bench`` of ``arms`` on the server-step budget, ``parallel`` runs
    at once (``reuse``: another ablation bench's output, whose runs of the same arms are taken over)."""
    import_data, datalists = REAL_DATA[federation]
    reuse = f" --reuse {{root}}/{reuse}" if reuse else ""
    return [import_data, f"fedseg bench --site-datalists {datalists} --methods {arms} {BUDGET[federation]} "
                         f"--parallel {parallel}{reuse} --out {{out}}"]


def upstream(commands: List[str], out: str) -> List[str]:
    """Another run's ``commands`` writing to its own output ``{root}/out``: what a run that reads or reuses that
    output runs first (resumed, they train nothing twice)."""
    return [c.replace("{out}", "{root}/" + out) for c in commands]


#: on retina: FedAvg with FVAC's loss alone (cross-entropy, by samples), which splits the loss from the weighting; and,
#: FVDA alone being level with neither, FVDA with each class's plain mean feature (``fvda_mean=class``)
FVDA_CLASS_ARMS = ("fedavg-ce=fedavg:lambda_dice=0 fvac-class=fvac:fvda_mean=class,record_terms=2 "
                   "fvac-fvda-only-class=fvac:use_fmug=false,fvda_mean=class,record_terms=2")
RETINA_FVAC = ablation_bench("retina", FVAC_ARMS.format(terms="=fvac:record_terms=2", terms_alone=",record_terms=2")
                             + " " + FVDA_CLASS_ARMS, parallel=2)
NUCLEI_FVAC = ablation_bench("nuclei", FVAC_ARMS.format(terms="", terms_alone=""))

#: PathFL's arms on real nuclei (its domain): each module off alone; FedAvg's runs are the FVAC ablation's (one code
#: version), so its commands come first
PATHFL_ARMS = ("fedavg pathfl pathfl-no-cse=pathfl:use_cse=false pathfl-no-afa=pathfl:use_afa=false "
               "pathfl-no-ssa=pathfl:use_ssa=false")
NUCLEI_PATHFL = upstream(NUCLEI_FVAC, "nuclei_fvac_ablation") + ablation_bench("nuclei", PATHFL_ARMS, reuse="nuclei_fvac_ablation")[1:]
#: AFA where it has something to align: with batch normalisation (under the shipped instance normalisation every
#: site's raw bottleneck has nearly the same per-channel moments, docs/methods.md); PathFL's and FedAvg's runs are the
#: ablation's above
PATHFL_BN_ARMS = ("fedavg pathfl pathfl-bn=pathfl:norm=batch pathfl-bn-no-afa=pathfl:norm=batch,use_afa=false "
                  "pathfl-no-afa=pathfl:use_afa=false")
NUCLEI_PATHFL_BN = upstream(NUCLEI_PATHFL, "nuclei_pathfl_ablation") + ablation_bench("nuclei", PATHFL_BN_ARMS, reuse="nuclei_pathfl_ablation")[1:]
#: SSA where it can differ from 1/K: with two sites its per-stratum weights are exactly 1/2 each (the similarity
#: matrix of two sites is symmetric), so on nuclei "SSA off" only swaps 1/K for sample weighting. On the three-site
#: retina federation: SSA against sample-weighted and 1/K averaging, and the noise batch at 512 px (4 x 3 x 512 x 512
#: float32 = the paper's Table 10 +12.00 MB over FedAvg) against the shipped 64 px; and CSE off, which carries PathFL's
#: deficit on nuclei
SSA_ARMS = ("fedavg pathfl pathfl-no-ssa=pathfl:use_ssa=false pathfl-no-ssa-uniform=pathfl:use_ssa=false,weighting=uniform "
            "pathfl-noise512=pathfl:ssa_noise_size=512 pathfl-no-cse=pathfl:use_cse=false")
RETINA_SSA = upstream(RETINA_FVAC, "retina_fvac_ablation") + ablation_bench("retina", SSA_ARMS, reuse="retina_fvac_ablation")[1:]

RUNS: Dict[str, Dict[str, Any]] = {
    "retina-fvac-ablation": {"out": "retina_fvac_ablation", "commands": RETINA_FVAC},
    "retina-fvda-terms": {"out": "retina_fvda_terms", "result": "term_sizes.json", "commands": [
        *upstream(RETINA_FVAC, "retina_fvac_ablation"),
        "python benchmarks/ablations/term_sizes.py --bench {root}/retina_fvac_ablation --labels fvac fvac-fvda-only "
        "fvac-class fvac-fvda-only-class --out {out}"]},
    "nuclei-fvac-ablation": {"out": "nuclei_fvac_ablation", "commands": NUCLEI_FVAC},
    "nuclei-pathfl-ablation": {"out": "nuclei_pathfl_ablation", "commands": NUCLEI_PATHFL},
    "nuclei-pathfl-bn": {"out": "nuclei_pathfl_bn", "commands": NUCLEI_PATHFL_BN},
    "retina-pathfl-ssa": {"out": "retina_pathfl_ssa", "commands": RETINA_SSA},
    "retina-ssa-weights": {"out": "retina_ssa_weights", "result": "ssa_weights.json", "commands": [
        *upstream(RETINA_SSA, "retina_pathfl_ssa"),
        "python benchmarks/ablations/ssa_weights.py --bench {root}/retina_pathfl_ssa --labels pathfl pathfl-noise512 "
        "--out {out}"]},
}

#: FVAC's pairs: (A, B, what A has that B lacks); the paper's Table 2 (fundus average Dice, %) where it has both arms
FVAC_PAIRS = [
    ("fvac", "fvac-fmug-only", "FVDA, beside FMUG", "+0.66 (77.23 -> 77.89)"),
    ("fvac", "fvac-fvda-only", "FMUG, beside FVDA", "+0.66 (77.23 -> 77.89)"),
    ("fvac-fmug-only", "fvac-neither", "FMUG alone (against cross-entropy)", "+0.24 (76.99 -> 77.23)"),
    ("fvac-fvda-only", "fvac-neither", "FVDA alone", "+0.24 (76.99 -> 77.23)"),
    ("fvac", "fvac-neither", "FMUG and FVDA: FVAC's method", "+0.90 (76.99 -> 77.89)"),
    ("fvac-neither", "fedavg-ce-uniform", "nothing: FVAC's code path with both off against FedAvg's, same loss "
                                          "and weighting", ""),
    ("fedavg-ce-uniform", "fedavg", "FVAC's loss and weighting (cross-entropy, 1/K) against FedAvg's (Dice + CE, "
                                    "by samples)", ""),
    ("fvac", "fedavg", "everything: the method, its loss and its weighting", "+0.90 (FedAvg 76.99)"),
]
#: the loss and the weighting apart (retina only)
LOSS_WEIGHTING_PAIRS = [
    ("fedavg-ce", "fedavg", "FVAC's loss (cross-entropy) against Dice + CE, both by samples", ""),
    ("fedavg-ce-uniform", "fedavg-ce", "uniform (1/K) against sample-weighted averaging, both cross-entropy", ""),
]
#: FVDA with each class's plain mean feature (retina only)
FVDA_CLASS_PAIRS = [
    ("fvac-fvda-only-class", "fvac-neither", "FVDA alone, class means", ""),
    ("fvac-fvda-only-class", "fvac-fvda-only", "class means against Eq. 10 as printed (FVDA alone)", ""),
    ("fvac-class", "fvac-fmug-only", "FVDA with class means, beside FMUG", ""),
    ("fvac-class", "fvac", "class means against Eq. 10 as printed (with FMUG)", ""),
]
FVAC_PAPER_NOTE = ("FVAC's paper, Table 2: fundus average Dice (DRIVE / STARE / CHASEDB1 participants), 100 rounds x "
                   "5 epochs; its row with neither part has its FedAvg's number (76.99).")



#: PathFL's pairs on nuclei: each module against PathFL without it alone (the paper's Table 7 leave-one-out rows)
PATHFL_PAIRS = [
    ("pathfl", "pathfl-no-cse", "CSE, beside AFA and SSA", "+0.79 (83.48 -> 84.27)"),
    ("pathfl", "pathfl-no-afa", "AFA, beside CSE and SSA (instance normalisation)", "+0.46 (83.81 -> 84.27)"),
    ("pathfl", "pathfl-no-ssa", "SSA, beside CSE and AFA: with two sites, 1/K against sample-weighted averaging",
     "+0.33 (83.94 -> 84.27)"),
    ("pathfl-no-cse", "fedavg", "AFA and SSA (PathFL without CSE) against FedAvg", "+0.86 (82.62 -> 83.48)"),
    ("pathfl", "fedavg", "everything: PathFL against FedAvg", "+1.65 (82.62 -> 84.27)"),
]
#: AFA with batch normalisation, where the sites' bottleneck moments differ
PATHFL_BN_PAIRS = [
    ("pathfl-bn", "pathfl-bn-no-afa", "AFA, beside CSE and SSA, with batch normalisation", "+0.46 (83.81 -> 84.27)"),
    ("pathfl-bn", "pathfl", "batch against instance normalisation (PathFL, all three modules)", ""),
    ("pathfl-bn-no-afa", "pathfl-no-afa", "batch against instance normalisation (PathFL without AFA)", ""),
]
#: SSA on three sites, against both weightings it replaces, and its noise batch's size
SSA_PAIRS = [
    ("pathfl", "pathfl-no-ssa", "SSA, beside CSE and AFA, against sample-weighted averaging", "+0.33 (83.94 -> 84.27)"),
    ("pathfl", "pathfl-no-ssa-uniform", "SSA, beside CSE and AFA, against 1/K averaging", ""),
    ("pathfl-no-ssa-uniform", "pathfl-no-ssa", "1/K against sample-weighted averaging (SSA off)", ""),
    ("pathfl-noise512", "pathfl", "SSA's noise batch: 4 x 3 x 512 x 512 against the shipped 4 x 3 x 64 x 64", ""),
    ("pathfl", "pathfl-no-cse", "CSE, beside AFA and SSA", "+0.79 (83.48 -> 84.27)"),
    ("pathfl-no-cse", "fedavg", "AFA and SSA (PathFL without CSE) against FedAvg", "+0.86 (82.62 -> 83.48)"),
    ("pathfl", "fedavg", "everything: PathFL against FedAvg", "+1.65 (82.62 -> 84.27)"),
]
PATHFL_PAPER_NOTE = ("PathFL's paper, Table 7: cross-source H&E nuclei (7 sites, U-Net, 60 rounds x 5 epochs), average "
                     "Dice %; the leave-one-out rows: without CSE 83.48, without AFA 83.81, without SSA 83.94; FedAvg "
                     "82.62, PathFL 84.27.")
PATHFL_PAPER = {"title": "paper: Dice % (cross-source)",
                "values": {"fedavg": "82.62", "pathfl": "84.27", "pathfl-no-cse": "83.48", "pathfl-no-afa": "83.81",
                           "pathfl-no-ssa": "83.94"},
                "note": PATHFL_PAPER_NOTE}



def pairs_table(run: str, title: str, pairs, paper_note: str = "", with_paper: bool = True,
                metrics: List[str] = ("dice",)) -> Dict[str, Any]:
    """A ``pairs`` table with the parts each pair tests and the rule's verdict."""
    return {"run": run, "render": "pairs", "rule": True, "metrics": list(metrics), "title": title,
            "pairs": [[a, b, paper] if with_paper else [a, b] for a, b, _, paper in pairs],
            "parts": [part for _, _, part, _ in pairs], **({"paper_note": paper_note} if with_paper else {})}


_RETINA = f"real retina (DRIVE / STARE / CHASE_DB1), native resolution ({SERVER_STEP_ROUNDS['retina']} rounds)"
_NUCLEI = f"real nuclei (MoNuSeg / TNBC), native resolution ({SERVER_STEP_ROUNDS['nuclei']} rounds)"

TABLES: Dict[str, Dict[str, Any]] = {
    "retina-fvac-ablation": {
        "run": "retina-fvac-ablation", "render": "accuracy", "metrics": ["dice_fov@DRIVE"],
        "title": f"FVAC's parts against FedAvg, {_RETINA}",
        "paper": {"title": "paper: Dice % (fundus avg)",
                  "values": {"fedavg": "76.99", "fvac": "77.89", "fvac-fmug-only": "77.23", "fvac-fvda-only": "77.23"},
                  "note": FVAC_PAPER_NOTE}},
    "retina-fvac-ablation-pairs": pairs_table(
        "retina-fvac-ablation", f"FVAC ablated: each part against the arm without it alone, {_RETINA}", FVAC_PAIRS,
        FVAC_PAPER_NOTE, metrics=["dice", "dice_fov"]),
    "retina-fvac-ablation-loss-weighting": pairs_table(
        "retina-fvac-ablation", f"FVAC's loss and its weighting apart, {_RETINA}", LOSS_WEIGHTING_PAIRS,
        with_paper=False, metrics=["dice", "dice_fov"]),
    "retina-fvac-ablation-class-means": pairs_table(
        "retina-fvac-ablation", f"FVDA with each class's plain mean feature (`fvda_mean=class`), {_RETINA}",
        FVDA_CLASS_PAIRS, with_paper=False, metrics=["dice", "dice_fov"]),
    "retina-fvda-terms": {
        "run": "retina-fvda-terms", "render": "term-sizes",
        "labels": ["fvac", "fvac-fvda-only", "fvac-class", "fvac-fvda-only-class"],
        "titles": {"fvac": "FVAC", "fvac-fvda-only": "FVDA only", "fvac-class": "FVAC, class means",
                   "fvac-fvda-only-class": "FVDA only, class means"},
        "columns": [["fvda_loss_share", "β L_FVDA / L", True], ["fvda_grad_ratio", "‖∇ β L_FVDA‖ / ‖∇ main‖", True]],
        "note": "β = 2; Eq. 10 as printed (divided by H'W') unless class means; main = FMUG (FVAC) or cross-entropy "
                "(FVDA only). The "
                "gradient norms over every trainable parameter, on every site's 2nd and 4th batch of a round.",
        "title": f"How big FVDA is beside the main term, round by round, {_RETINA}"},
    "nuclei-fvac-ablation": {
        "run": "nuclei-fvac-ablation", "render": "accuracy", "title": f"FVAC's parts against FedAvg, {_NUCLEI}"},
    "nuclei-fvac-ablation-pairs": pairs_table(
        "nuclei-fvac-ablation", f"FVAC ablated on nuclei: each part against the arm without it alone, {_NUCLEI}",
        FVAC_PAIRS, with_paper=False),
    "nuclei-pathfl-ablation": {
        "run": "nuclei-pathfl-ablation", "render": "accuracy", "title": f"PathFL's modules against FedAvg, {_NUCLEI}",
        "paper": PATHFL_PAPER},
    "nuclei-pathfl-ablation-pairs": pairs_table(
        "nuclei-pathfl-ablation", f"PathFL ablated: each module against PathFL without it alone, {_NUCLEI}",
        PATHFL_PAIRS, PATHFL_PAPER_NOTE),
    "nuclei-pathfl-bn": {
        "run": "nuclei-pathfl-bn", "render": "accuracy",
        "title": f"PathFL with batch normalisation (`norm=batch`), with and without AFA, {_NUCLEI}"},
    "nuclei-pathfl-bn-pairs": pairs_table(
        "nuclei-pathfl-bn", f"AFA with batch normalisation, where the sites' bottleneck moments differ, {_NUCLEI}",
        PATHFL_BN_PAIRS, PATHFL_PAPER_NOTE),
    "retina-pathfl-ssa": {
        "run": "retina-pathfl-ssa", "render": "accuracy", "metrics": ["dice_fov@DRIVE"],
        "title": f"PathFL on three sites: SSA, its weighting, its noise batch and CSE, {_RETINA}"},
    "retina-pathfl-ssa-pairs": pairs_table(
        "retina-pathfl-ssa",
        f"PathFL ablated on three sites: SSA against both weightings it replaces, its noise batch, CSE, {_RETINA}",
        SSA_PAIRS,
        PATHFL_PAPER_NOTE, metrics=["dice", "dice_fov"]),
    "retina-ssa-weights": {
        "run": "retina-ssa-weights", "render": "ssa-weights", "labels": ["pathfl", "pathfl-noise512"],
        "titles": {"pathfl": "PathFL (64 px noise)", "pathfl-noise512": "PathFL, 512 px noise"},
        "note": "SSA's weights are per stratum of the network (its encoder and decoder levels); each stratum's "
                "weights over the sites sum to 1.",
        "title": f"The weights SSA gave each site, beside the sample-count and 1/K weights it replaces, {_RETINA}"},
}

RENDERERS = {"term-sizes": render_term_sizes, "ssa-weights": render_ssa_weights}
