"""FedBN recipe (Li et al., ICLR 2021): normalisation layers stay at each site.

The bundle's network normalises with MONAI's instance norm, which has nothing to keep (no affine parameters, no
running statistics). The recipe therefore builds it with ``norm="instance_affine"`` (instance norm with a learnable
per-channel scale and shift, which FedBN keeps local) unless the job sets ``norm``: the same normalisation as every
other row, so the row differs from FedAvg by FedBN alone. ``fedbn:norm=batch`` is the paper's batch norm; in the
suite's pipeline (patches for training, sliding-window evaluation with running statistics, a few steps per round)
batch norm did not learn within the default budget, with FedAvg as well (docs/methods.md, FedBN). ``paper``
profile: FedAvg's.
"""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES
from fedseg.strategies.local_layers import LocalLayersOptions

#: FedBN's normalisation when the job does not set one
DEFAULT_NORM = "instance_affine"


class FedBNRecipe(FedSegRecipe):
    """No keywords besides the shared job/train options: FedAvg's sample-weighted average of the shared entries."""

    strategy_options = JobOptions(LocalLayersOptions, names=(), fixed={"weighting": "samples"})

    def __init__(self, *, name: str = "fedbn", profile: str = "default", num_rounds: Optional[int] = None, **options: Any):
        options.setdefault("norm", DEFAULT_NORM)
        args = self.method_args(options)
        super().__init__(name=name, method="fedbn", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
