from .unet import FeatureUNet

__all__ = ["FeatureUNet"]
