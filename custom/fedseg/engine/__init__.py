from .base import LocalEngine, default_device
from .engine import SegEngine

__all__ = ["LocalEngine", "SegEngine", "default_device"]
