"""What moves GraphFedSeg against FedAvg (``docs/results/graphfedseg-protocol.md``): the suite's GraphFedSeg and local
protocol, one difference from the authors' code at a time, and all of them (the ``paper`` profile = their code), on the
built-in polyp family and the real retina federation.
"""

from __future__ import annotations

from typing import Any, Dict

from benchmarks.core.registry import real_bench

PAGE = "docs/results/graphfedseg-protocol.md"

#: the authors' method differences, one at a time under the suite's local protocol (variants of GraphFedSeg in the
#: base bench; alpha 1 / 0.7 written out); ``gfs_authors`` is all of them
GFS_AUTHORS_METHOD = {
    "gfs_term": "regulariser=top_k",
    "gfs_uncertainty": "uncertainty_pass=training_batches,prior=samples_over_uncertainty,gamma=0,uncertainty_loss_weight=0.4",
    "gfs_previous": "graph_in_aggregation=previous,initial_graph=uniform_others",
    "gfs_graph": "graph_in_aggregation=previous,initial_graph=uniform_others,similarity=update_global,"
                 "alpha=1.4285714285714286,similarity_snap=0.9",
}
GFS_AUTHORS_METHOD["gfs_authors"] = ",".join(GFS_AUTHORS_METHOD[k] for k in ("gfs_term", "gfs_uncertainty", "gfs_graph"))
#: the suite's GraphFedSeg spelt out (a bench under the `paper` profile gives GraphFedSeg the authors' options;
#: alpha 0.08 K for the 3 built-in sites, a snap above every cosine)
GFS_SUITE_METHOD = ("alpha=0.24,gamma=0.4,similarity=update,similarity_snap=1.0,prior=samples,graph_in_aggregation=current,"
                    "initial_graph=uniform,regulariser=paper,uncertainty_pass=after_training,uncertainty_loss_weight=0")
#: the local-protocol differences, one bench each (FedAvg and GraphFedSeg trained alike), then all of them. Not benched
#: alone: the flip, the per-image maximum (FedEvi's ablation: no effect on FedAvg at this budget) and dropping the last
#: incomplete batch of 4 (at most 3 of a site's ~20 images an epoch); they are in the `authors` bench
GFS_PROTOCOL_BENCHES = (
    ("base", "fedavg graphfedseg " + " ".join(f"{k}=graphfedseg:{v}" for k, v in GFS_AUTHORS_METHOD.items()), ""),
    ("network", "fedavg graphfedseg", " --set network_variant=three_conv_nearest"),
    ("optimiser", "fedavg graphfedseg", " --set learning_rate=5e-4 adam_betas=[0.9,0.99] weight_decay=1e-5"),
    ("loss", "fedavg graphfedseg", " --set seg_loss=logit_dice lambda_ce=0.0"),
    ("authors", f"fedavg fedavg_dicece=fedavg:seg_loss=dice_ce,lambda_ce=1.0 graphfedseg gfs_suite=graphfedseg:{GFS_SUITE_METHOD}",
     " --profile paper --protocol graphfedseg --rounds 10 --local-epochs 1 --set image_size=64"),
)
#: the ablation's rows: (bench, baseline label, method label, what differs from the suite default, metric, model[,
#: the baseline's model where it differs])
GFS_ROWS = [(f"graphfedseg-protocol-{row[0]}", *row[1:]) for row in (
    ("base", "fedavg", "graphfedseg", "suite default", "dice", "global"),
    ("base", "fedavg", "gfs_term", "+ similarity term: 0.01 (1 - weighted cosine to the top-3 graph entries, itself included)", "dice", "global"),
    ("base", "fedavg", "gfs_uncertainty", "+ uncertainty: U = mean vacuity over the training batches, p ∝ n / U, no U penalty", "dice", "global"),
    ("base", "fedavg", "gfs_previous", "+ aggregation with last round's graph (initial 1/(K-1) off the diagonal)", "dice", "global"),
    ("base", "fedavg", "gfs_graph", "... and cosines against the new global model, alpha 1/0.7, cosines > 0.9 as 1", "dice", "global"),
    ("base", "fedavg", "gfs_authors", "the authors' method (all four), the suite's protocol", "dice", "global"),
    ("base", "fedavg", "graphfedseg", "the suite's GraphFedSeg, personalised models", "dice", "personalized", "global"),
    ("base", "fedavg", "gfs_graph", "... with the authors' graph (W ≈ I: each site's own last model)", "dice", "personalized",
     "global"),
    ("base", "fedavg", "gfs_authors", "the authors' method, personalised models", "dice", "personalized", "global"),
    ("network", "fedavg", "graphfedseg", "+ network: three-conv U-Net, nearest upsampling, Kaiming fan-out", "dice", "global"),
    ("optimiser", "fedavg", "graphfedseg", "+ optimiser: Adam lr 5e-4, betas (0.9, 0.99), weight decay 1e-5", "dice", "global"),
    ("loss", "fedavg", "graphfedseg", "+ loss: Dice on the raw logits, both classes", "dice", "global"),
    ("authors", "fedavg", "graphfedseg", "the authors' code (`paper` profile: their protocol and method)", "dice", "global"),
    ("authors", "fedavg_dicece", "graphfedseg", "... against FedAvg with the suite's Dice + CE loss", "dice", "global"),
    ("authors", "fedavg", "gfs_suite", "the suite's GraphFedSeg under the authors' protocol", "dice", "global"),
    ("authors", "fedavg", "graphfedseg", "the authors' code, each site's local model", "dice", "local"),
    ("authors", "fedavg", "graphfedseg", "the authors' code, local models after largest-component post-processing", "dice_lcc", "local"),
    ("authors", "fedavg", "graphfedseg", "the authors' code's local models against FedAvg's global model", "dice", "local", "global"),
    ("authors", "fedavg", "fedavg", "(FedAvg's own local models against its global model, in the GraphFedSeg column)", "dice",
     "local", "global"),
)]
#: published numbers beside the rows they match (row index in GFS_ROWS): the paper's, and the independent side-by-side
#: on Kvasir-SEG + CVC-ClinicDB (128 px, seed 0, one local epoch, the same lists for both codes)
GFS_PUBLISHED = ("published / real polyp", {
    0: "paper: FedAvg 82.99 → GraphFedSeg 87.10 Dice (4 polyp sites, 250 rounds, 384 px)",
    12: "Kvasir-SEG + CVC-ClinicDB, 128 px: this suite's FedAvg under this profile 0.779 (30 rounds)",
    16: "the authors' code there: their local models 0.695 / 0.483 (Kvasir / ClinicDB test, round 17 of 30)",
})

RUNS: Dict[str, Dict[str, Any]] = {
    **{f"graphfedseg-protocol-{name}": {"out": f"graphfedseg_protocol/{name}", "commands": [
        f"fedseg bench --family polyp --references --seeds 0 1 2 --methods {methods}{sets} --out {{out}}"]}
       for name, methods, sets in GFS_PROTOCOL_BENCHES},
    # the authors' code on the real retina federation; its suite default is the server-step bench's FedAvg and GraphFedSeg
    "graphfedseg-protocol-retina-authors": real_bench(
        "retina", "graphfedseg_protocol/retina_authors",
        "--methods fedavg graphfedseg --references --seeds 0 1 2 --rounds 20 --profile paper --protocol graphfedseg "
        "--simulator-timeout 14400"),
}

TABLES: Dict[str, Dict[str, Any]] = {
    "graphfedseg-protocol": {
        "run": [f"graphfedseg-protocol-{b[0]}" for b in GFS_PROTOCOL_BENCHES], "render": "protocol-ablation",
        "rows": GFS_ROWS, "reference": ("graphfedseg-protocol-base", "fedavg", "graphfedseg"), "method_name": "GraphFedSeg",
        "published": GFS_PUBLISHED, "missing_ok": True,
        "title": "What moves GraphFedSeg against FedAvg: the suite's GraphFedSeg and local protocol, one difference from the "
                 "authors' code at a time, and all of them (built-in polyp)"},
    "graphfedseg-protocol-retina": {
        "run": ["retina-server-step", "graphfedseg-protocol-retina-authors"], "render": "protocol-ablation",
        "reference": ("retina-server-step", "fedavg", "graphfedseg"), "method_name": "GraphFedSeg", "missing_ok": True,
        "rows": [("retina-server-step", "fedavg", "graphfedseg", "suite default", "dice", "global"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "graphfedseg",
                  "the authors' code (`paper` profile: their protocol and method)", "dice", "global"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "graphfedseg", "... each site's local model", "dice", "local"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "graphfedseg",
                  "... local models after largest-component post-processing", "dice_lcc", "local"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "graphfedseg",
                  "... GraphFedSeg's local models against FedAvg's global model", "dice", "local", "global"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "fedavg",
                  "(FedAvg's own local models against its global model, in the GraphFedSeg column)", "dice", "local",
                  "global")],
        "title": "GraphFedSeg against FedAvg under the suite's default and the authors' code, real retina federation "
                 "(native resolution, 20 rounds)"},
}
