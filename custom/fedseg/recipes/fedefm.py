"""FedEFM recipe (phase 1: the federated foundation encoder): a ViT classifier trained across silos whose
label sets differ, with overseas experts and EMD-weighted distillation, averaged by the server (CFL) or
gossiped over a ring / full topology (DFL). Design fixed in ``shared/methods/fedefm.md``; docs/methods.md.

The baselines of the issue's benchmark are switches of the same job, so they share schedule and data:

====================  ==========================================
FedAvg (CFL)          ``mode="cfl", overseas=False``
ring gossip (DFL)     ``mode="dfl", overseas=False``
FedEFM w/o EMD        ``use_emd=False``
FedEFM                defaults (``mode`` cfl or dfl)
====================  ==========================================

Built-in data: the synthetic endovascular X-ray silos (``data_family="xray_foundation"``, label space
``xray/<scanner>/<device>``; ``unseen`` sets how many of a silo's classes no other silo has).
"""

from __future__ import annotations

from typing import Any, Optional

from fedseg.bundle import refuse_user_bundle
from fedseg.config import BASE_TRAIN_CONFIG
from fedseg.data.synthetic.xray import DEVICES
from fedseg.fl.site_data import FOUNDATION_FAMILY
from fedseg.method_options import JobOptions
from fedseg.objectives.fedefm import FedEFMSiteOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.strategies.fedefm import FedEFMOptions

#: every FedEFM run is an image classification over the global label space
CLASSIFICATION_DEFAULTS = {
    "task": "classification",
    "data_family": "xray_foundation",  # fedseg.fl.site_data.FOUNDATION_FAMILY
    "in_channels": 3,
    "vit_profile": "tiny",
    "lambda_dice": 0.0,
    "augment": True,
}

PAPER_PROFILES = {
    # CPU minutes on the built-in silos (96 images per class). With the ViT's input standardisation one silo
    # alone learns in 20-30 epochs at Adam 3e-4, faster than at 1e-4 (benchmarks/fedefm/vit_from_scratch.py,
    # docs/methods.md, FedEFM): 2 local epochs x 20 rounds
    "default": {"num_rounds": 20, "train_config": {"learning_rate": 3e-4, "local_epochs": 2}},
    # ViT-B/16 at 224 px (the paper's backbone). The paper states no optimiser or schedule: Adam 1e-4,
    # batch 16, one local epoch per round (and one overseas epoch), 50 rounds is our choice (docs/methods.md).
    "paper": {
        "num_rounds": 50,
        "train_config": {
            "data_profile": "paper",
            "vit_profile": "paper",
            "optimizer_name": "Adam",
            "learning_rate": 1e-4,
            "batch_size": 16,
            "local_epochs": 1,
        },
    }
}


class FedEFMRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the strategy's (:class:`FedEFMOptions`: ``mode``, ``topology``,
    ``overseas``, ``gossip_self_weight``, ``weighting``) and the objective's (:class:`FedEFMSiteOptions`: ``alpha``,
    ``temperature``, ``tau``, ``mu``, ``use_emd``, ``overseas_epochs``; ``gossip_self_weight`` goes to both), and

        unseen: built-in silos only: share of each silo's classes no other silo holds (0, 0.5, 1).
    """

    strategy_options = JobOptions(FedEFMOptions, names=("mode", "topology", "overseas", "gossip_self_weight",
                                                        "weighting"))
    objective_options = JobOptions(FedEFMSiteOptions)

    def __init__(self, *, name: str = "fedefm", profile: str = "default", num_rounds: Optional[int] = None,
                 unseen: Optional[float] = None, **options: Any):
        for key, value in CLASSIFICATION_DEFAULTS.items():
            options.setdefault(key, value)
        if unseen is not None:
            options["data_unseen"] = float(unseen)
        if options["data_family"] == FOUNDATION_FAMILY and "num_classes" not in options:
            # the built-in label space: 4 device classes per scanner style
            options["num_classes"] = len(DEVICES) * int(options.get("data_scanners") or BASE_TRAIN_CONFIG["data_scanners"])
        refuse_user_bundle(options, "FedEFM's pre-training trains its own classification ViT over silos' class labels; a segmentation bundle cannot stand in for it")
        args = self.method_args(options)
        super().__init__(name=name, method="fedefm", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
