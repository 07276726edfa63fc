from .feature_alignment import FeatureAlignment
from .unet import UNET_VARIANTS, FeatureUNet

__all__ = ["FeatureAlignment", "FeatureUNet", "UNET_VARIANTS"]
