from .engine import SegEngine, default_device

__all__ = ["SegEngine", "default_device"]
