"""What carries FedEvi's gain (``docs/results/fedevi-protocol.md``): FedAvg and FedEvi under the suite's local
protocol, one difference from the authors' protocol at a time, and all of them, on the built-in polyp family and the
real retina federation; and FedEvi's weights round by round, the suite's run against the authors' loop written out
(``fedevi_weights_trace.py`` beside this module).
"""

from __future__ import annotations

from typing import Any, Dict

from benchmarks.core.registry import real_bench
from benchmarks.fedevi_protocol.render import render_fedevi_weights_trace, render_protocol_ablation

PAGE = "docs/results/fedevi-protocol.md"

#: one bench per local-protocol setting (name, methods, train_config sets)
PROTOCOL_BENCHES = (
    ("base", "fedavg fedevi fedevi_ref_surrogate=fedevi:uncertainty_grid=network,clamp_epistemic=false "
             "fedevi_assign=fedevi:accumulate=false", ""),
    ("optimiser", "fedavg fedevi", " --set adam_betas=[0.9,0.99] weight_decay=1e-5 lr_decay_per_round=0.99"),
    ("batch", "fedavg fedevi", " --set batch_size=8 drop_last=true"),
    ("augment", "fedavg fedevi", " --set augment_level=flip"),
    ("intensity", "fedavg fedevi", " --set intensity=image_max"),
    ("network", "fedavg fedevi", " --set network_variant=three_conv_nearest"),
    # the network's two parts apart: the reference layout with PyTorch's initialisation, ours with Kaiming fan-out
    ("architecture", "fedavg fedevi", " --set network_variant=three_conv_nearest network_init=pytorch"),
    ("init", "fedavg fedevi", " --set network_init=kaiming_fan_out"),
    # every difference at once: the paper protocol (FedAvg with the authors' Dice-only loss) at the default budget
    ("authors", "fedavg fedavg_dicece=fedavg:lambda_ce=1.0 fedevi",
     " --profile paper --rounds 10 --local-epochs 1 --set image_size=64"),
)
#: the ablation's rows: (bench, FedAvg label, FedEvi label, what differs from the suite default, metric, model)
PROTOCOL_ROWS = [
    ("base", "fedavg", "fedevi", "suite default", "dice", "global"),
    ("optimiser", "fedavg", "fedevi", "+ optimiser: Adam betas (0.9, 0.99), weight decay 1e-5, lr x 0.99 per round", "dice", "global"),
    ("batch", "fedavg", "fedevi", "+ batch 8, last incomplete batch dropped", "dice", "global"),
    ("augment", "fedavg", "fedevi", "+ augmentation: one flip along a random axis (p 0.5)", "dice", "global"),
    ("intensity", "fedavg", "fedevi", "+ intensity: each image / its maximum", "dice", "global"),
    ("network", "fedavg", "fedevi", "+ network: three-conv U-Net, nearest upsampling, Kaiming fan-out", "dice", "global"),
    ("architecture", "fedavg", "fedevi", "... its layout alone (PyTorch's initialisation)", "dice", "global"),
    ("init", "fedavg", "fedevi", "... its initialisation alone (Kaiming fan-out on the suite's U-Net)", "dice", "global"),
    ("base", "fedavg", "fedevi_ref_surrogate", "+ surrogate uncertainties on the network grid, epistemic unclamped", "dice", "global"),
    ("base", "fedavg", "fedevi_assign", "+ weights from each round's G / A alone (the repository's other main loop)", "dice", "global"),
    ("authors", "fedavg_dicece", "fedevi", "all of the above (the `paper` protocol), FedAvg with Dice + CE", "dice", "global"),
    ("authors", "fedavg", "fedevi", "all of the above, FedAvg with the authors' Dice-only loss", "dice", "global"),
    ("authors", "fedavg", "fedevi", "... scored after largest-component post-processing", "dice_lcc", "global"),
    ("authors", "fedavg", "fedevi", "... the best validation round's model", "dice", "global_best_val"),
    ("authors-30", "fedavg_dicece", "fedevi", "the `paper` protocol at 30 rounds, FedAvg with Dice + CE", "dice", "global"),
    ("authors-30", "fedavg", "fedevi", "the `paper` protocol at 30 rounds, FedAvg with the Dice-only loss", "dice", "global"),
]

RUNS: Dict[str, Dict[str, Any]] = {
    # FedEvi's local protocol: FedAvg and FedEvi under the suite's default, then one difference from the authors'
    # protocol switched at a time, then all of them (the `paper` profile at the default budget), built-in polyp
    **{f"fedevi-protocol-{name}": {"out": f"fedevi_protocol/{name}", "commands": [
        f"fedseg bench --family polyp --references --seeds 0 1 2 --methods {methods}{sets} --out {{out}}"]}
       for name, methods, sets in PROTOCOL_BENCHES},
    # the suite default, the reference U-Net's layout and the authors' protocol on the real retina federation
    **{f"fedevi-protocol-retina-{name}": real_bench("retina", f"fedevi_protocol/retina_{name}",
                                                    f"--methods {methods} --references --seeds 0 1 2 --rounds 20{extra}")
       for name, methods, extra in (("base", "fedavg fedevi", ""),
                                    ("authors", "fedavg fedavg_dicece=fedavg:lambda_ce=1.0 fedevi", " --profile paper"),
                                    ("architecture", "fedavg fedevi",
                                     " --set network_variant=three_conv_nearest network_init=pytorch"))},
    # the check at three times the budget: does the authors' protocol train, and FedEvi gain, when sites take more steps?
    "fedevi-protocol-authors-30": {"out": "fedevi_protocol/authors_30", "commands": [
        "fedseg bench --family polyp --references --seeds 0 1 2 --methods fedavg fedavg_dicece=fedavg:lambda_ce=1.0 fedevi "
        "--profile paper --rounds 30 --local-epochs 1 --set image_size=64 --out {out}"]},
    # FedEvi's G, A and weights round by round: the suite's federated run against the authors' loop, same data
    "fedevi-weights-trace": {"out": "fedevi_weights_trace", "result": "fedevi_weights_trace.json", "commands": [
        "python benchmarks/fedevi_protocol/fedevi_weights_trace.py --out {out} --seeds 0 1 2 --rounds 30 --loop-seeds 0"]},
}

TABLES: Dict[str, Dict[str, Any]] = {
    "fedevi-protocol": {"run": [f"fedevi-protocol-{b[0]}" for b in PROTOCOL_BENCHES] + ["fedevi-protocol-authors-30"],
                        "render": "protocol-ablation",
                        "rows": PROTOCOL_ROWS, "reference": ("base", "fedavg", "fedevi"),
                        "paper": "the authors' code on Kvasir-SEG + CVC-ClinicDB (128 px, 6 rounds x 1 epoch, one seed): "
                                 "FedEvi - FedAvg +0.040 (their FedAvg: Dice-only loss); FedEvi paper Table 1 "
                                 "(4 polyp sites, 200 rounds): +0.098",
                        "title": "What carries FedEvi's gain: FedAvg and FedEvi under the suite's local protocol, one "
                                 "difference from the authors' protocol at a time, and all of them (built-in polyp)"},
    # the check the suite keeps: FedEvi's paper protocol for every method, FedEvi against FedAvg (built-in polyp)
    "fedevi-paper-polyp-accuracy": {"run": "fedevi-protocol-authors", "render": "accuracy", "metrics": ["dice_lcc"],
                                    "title": "FedEvi against FedAvg, both with the authors' local protocol "
                                             "(`--profile paper`), built-in polyp at the default budget"},
    "fedevi-paper-polyp-30-accuracy": {"run": "fedevi-protocol-authors-30", "render": "accuracy", "metrics": ["dice_lcc"],
                                       "title": "The same at 30 rounds: FedEvi against FedAvg with the authors' local "
                                                "protocol, built-in polyp"},
    "fedevi-protocol-retina": {
        "run": ["fedevi-protocol-retina-base", "fedevi-protocol-retina-authors", "fedevi-protocol-retina-architecture"],
        "render": "protocol-ablation", "reference": ("retina-base", "fedavg", "fedevi"),
        "rows": [("retina-base", "fedavg", "fedevi", "suite default", "dice", "global"),
                 ("retina-architecture", "fedavg", "fedevi", "+ the reference U-Net's layout (PyTorch's initialisation)",
                  "dice", "global"),
                 ("retina-authors", "fedavg_dicece", "fedevi", "the authors' protocol, FedAvg with Dice + CE", "dice", "global"),
                 ("retina-authors", "fedavg", "fedevi", "the authors' protocol, FedAvg with the authors' Dice-only loss",
                  "dice", "global"),
                 ("retina-authors", "fedavg", "fedevi", "... scored after largest-component post-processing", "dice_lcc",
                  "global"),
                 ("retina-authors", "fedavg", "fedevi", "... the best validation round's model", "dice", "global_best_val")],
        "title": "FedEvi against FedAvg under the suite's and the authors' local protocol, real retina federation "
                 "(native resolution, 20 rounds)"},
    "retina-layout-cost": {"run": "fedevi-protocol-retina-architecture", "render": "cost",
                           "title": "Cost with the reference U-Net's layout on the real retina federation (20 rounds)"},
}

TABLES["fedevi-weights-trace"] = {
    "run": "fedevi-weights-trace", "render": "fedevi-weights-trace",
    # the independent side-by-side on Kvasir-SEG / CVC-ClinicDB (128 px, seed 0, 1 local epoch)
    "published": (("Kvasir / ClinicDB, authors' code: u_dis", "u_data", "weights", "this suite (`paper`): G", "A", "beta"),
                  {1: ("0.058 / 0.057", "0.246 / 0.239", "", "0.033 / 0.033", "0.215 / 0.203", ""),
                   10: ("0.024 / 0.017", "0.193 / 0.112", "0.48 / 0.52", "0.016 / 0.014", "0.166 / 0.092", ""),
                   30: ("0.011 / 0.007", "0.095 / 0.068", "0.48 / 0.52", "0.011 / 0.010", "0.170 / 0.061", "0.37 / 0.63")}),
    "title": "FedEvi's G, A and weights round by round: the suite's federated run and the authors' round loop on the "
             "same data"}

RENDERERS = {"protocol-ablation": render_protocol_ablation, "fedevi-weights-trace": render_fedevi_weights_trace}
