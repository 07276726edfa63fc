"""FedEFM's maths as plain functions and modules: the earth mover's distance between dense token sets,
the EMD-weighted distillation loss, and the ViT foundation backbone with its hand-over to a UNETR.
The NVFlare wiring (overseas training, knowledge transfer, mixing) lives elsewhere."""

from .distillation import distillation_loss, soft_kl, teacher_weights
from .emd import batch_emd, cosine_cost, emd_distance, emd_marginals
from .networks import PROFILES, ViTClassifier, build_vit, unetr_from_foundation, unetr_key_map

__all__ = [
    "PROFILES",
    "ViTClassifier",
    "batch_emd",
    "build_vit",
    "cosine_cost",
    "distillation_loss",
    "emd_distance",
    "emd_marginals",
    "soft_kl",
    "teacher_weights",
    "unetr_from_foundation",
    "unetr_key_map",
]
