from .segmentation import SegmentationMetrics

__all__ = ["SegmentationMetrics"]
