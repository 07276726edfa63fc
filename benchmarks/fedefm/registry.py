"""FedEFM (``docs/results/fedefm.md``): the foundation model's downstream segmentation against the same network from
scratch and against the suite's U-Net, and its pre-training with server averaging (CFL) against gossip (DFL).

A table joins the page as everywhere else: its run in ``RUNS`` (the exact commands), its entry in ``TABLES`` (an
``accuracy`` table of the downstream bench, with ``"data"``, joins the glance through ``overview/registry.py``),
its block on the page (``<a id="TABLE"></a>`` + ``python benchmarks/reproduce.py TABLE``). The scripts beside this
module check the foundation classifier on the built-in X-ray silos.

Budget (what two shared CPU cores allow; the paper's ViT-B/16 at 224 px needs a GPU): pre-training with the
``default`` profile, a tiny ViT (4 blocks, width 96) from scratch, 20 rounds x 2 local epochs (+1
overseas epoch), 3 silos, 11 classes; downstream with the ``default`` profile, the UNETR (the
foundation's 4 blocks in the first 4 of its 12) on 64 px patches, 10 rounds x 1 local epoch, FedAvg.
"""

from __future__ import annotations

from typing import Any, Dict

PAGE = "docs/results/fedefm.md"

#: pre-training (phase 1) on the built-in X-ray silos at the paper's default, 100 % unseen classes: plain cross-entropy
#: and FedEFM, with server averaging (CFL) and with gossip (DFL) over a ring and over every silo (full); the pooled
#: model
PRETRAIN = ("fedseg bench --family xray_foundation --sites site-1 site-2 site-3 --set data_unseen=1.0 --methods "
            "fedavg_cfl=fedefm:overseas=false fedefm dfl_ring=fedefm:mode=dfl,overseas=false fedefm_dfl=fedefm:mode=dfl "
            "fedefm_dfl_full=fedefm:mode=dfl,topology=full --references pooled --seeds 0 1 2 --out {out}")
#: the downstream task on real DCA1 (2 sites): the suite's U-Net (FedAvg), the UNETR from scratch and from FedEFM's
#: foundation; ``{seed}`` (``{{seed}}`` here, past ``str.format``): downstream seed s starts from pre-training seed s
DOWNSTREAM = (
    "fedseg bench --site-datalists {root}/fedefm/dca1_data/site_datalists.json --methods fedavg "
    "unetr_scratch=fedefm_downstream unetr_fedefm_init=fedefm_downstream:foundation_ckpt={root}/fedefm/pretrain/"
    "workspaces/method-fedefm-seed{{seed}}/server/simulate_job/app_server/FL_global_model.pt "
    "--references --seeds 0 1 2 --task-timeout 3600 --out {out}")

RUNS: Dict[str, Dict[str, Any]] = {
    "fedefm-pretrain": {"out": "fedefm/pretrain", "commands": [PRETRAIN]},
    # the foundations are the pre-training's FedEFM (CFL) checkpoints, in its workspaces and not in the records:
    # re-making the downstream bench makes (or resumes) the pre-training first, with its own command and folder
    "fedefm-downstream": {"out": "fedefm/downstream", "commands": [
        PRETRAIN.replace("{out}", "{root}/fedefm/pretrain"),
        "fedseg data dca1 --src {data}/xray_angio --out {root}/fedefm/dca1_data --sites dca1-a dca1-b",
        DOWNSTREAM]},
}

_BUDGET = "(tiny ViT, 20 rounds)"

TABLES: Dict[str, Dict[str, Any]] = {
    "fedefm-downstream": {
        "run": "fedefm-downstream", "render": "accuracy", "metrics": ["iou"],
        "data": "real DCA1 coronary X-rays, 2 sites (UNETR from a foundation of built-in X-ray silos)",
        "glance_labels": {"unetr_fedefm_init": "FedEFM (UNETR from its foundation)",
                          "unetr_scratch": "UNETR from scratch"},
        "title": "FedEFM downstream on real DCA1 coronary angiograms, 2 sites: the UNETR from FedEFM's foundation and "
                 "from scratch, and the suite's U-Net (FedAvg) (10 rounds)",
        "paper": {"title": "paper: Dice % (EIPhantom)",
                  "values": {"fedavg": "U-Net from scratch 48.1 (from FedEFM 52.1)",
                             "unetr_scratch": "ViT from scratch 50.9", "unetr_fedefm_init": "ViT from FedEFM 63.1"},
                  "note": "FedEFM's paper, Table IV: catheter and guidewire segmentation on its phantom X-rays, each "
                          "backbone from scratch and fine-tuned from the FedEFM foundation."}},
    "fedefm-downstream-pairs": {
        "run": "fedefm-downstream", "render": "pairs", "metrics": ["dice", "iou"],
        "pairs": [["unetr_fedefm_init", "unetr_scratch", "+12.2 (50.9 -> 63.1)"],
                  ["unetr_fedefm_init", "fedavg", "+15.0 (U-Net from scratch 48.1)"],
                  ["unetr_scratch", "fedavg", "+2.8 (U-Net 48.1, ViT 50.9)"]],
        "paper_note": "Dice points on EIPhantom (FedEFM's paper, Table IV; its U-Net and ViT rows are separate networks).",
        "title": "FedEFM downstream, paired per test image: what the foundation does to the UNETR, and the UNETR "
                 "against the suite's U-Net (real DCA1, 10 rounds)"},
    "fedefm-pretrain": {
        "run": "fedefm-pretrain", "render": "accuracy",
        "title": "FedEFM's pre-training, CFL against DFL (ring and full gossip): the foundation's accuracy on the "
                 f"built-in X-ray silos at 100 % unseen classes {_BUDGET}",
        "paper": {"title": "paper: accuracy % (Table II; Fig. 4, 100 % unseen)",
                  "values": {"fedavg_cfl": "FedAvg 80.9; 32.1", "fedefm": "98.2; 84.9", "dfl_ring": "RING 52.2; 23.8",
                             "fedefm_dfl": "97.5", "pooled": "LVM-Med (centralised) 98.8"},
                  "note": "FedEFM's paper, a ViT on its own endovascular X-ray silos: Table II (which it states is at its "
                          "default, 100 % unseen) and Fig. 4 (the CFL and DFL baselines and FedEFM at 100 % unseen); it "
                          "does not state FedEFM's DFL topology."}},
    # seed 2 only: its five federated runs ran back to back on a quiet machine; seeds 0 and 1 ran beside other work
    # (rounds up to 4x slower), so their round times would not compare the approaches
    "fedefm-pretrain-cost": {"run": "fedefm-pretrain", "render": "cost", "seeds": [2],
                             "title": f"Cost of FedEFM's pre-training, CFL and DFL, built-in X-ray silos {_BUDGET}, seed 2"},
}
