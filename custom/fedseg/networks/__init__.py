from .feature_alignment import FeatureAlignment
from .unet import FeatureUNet

__all__ = ["FeatureAlignment", "FeatureUNet"]
