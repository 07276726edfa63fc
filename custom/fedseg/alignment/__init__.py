"""PathFL's three alignments as plain functions: image style (CSE), feature moments (AFA) and stratified
similarity aggregation (SSA). The objective, strategy and recipe in ``objectives/``, ``strategies/`` and
``recipes/`` wire them into a federated job."""

from .moments import global_feature_moments
from .strata import stratum_of, stratum_names, stratum_outputs
from .stratified import similarity_matrix, ssa_mixing_matrix, stratified_average
from .style import adain_restyle, channel_statistics, half_plane_mask, hybrid_images

__all__ = [
    "adain_restyle",
    "channel_statistics",
    "global_feature_moments",
    "half_plane_mask",
    "hybrid_images",
    "similarity_matrix",
    "ssa_mixing_matrix",
    "stratified_average",
    "stratum_names",
    "stratum_of",
    "stratum_outputs",
]
