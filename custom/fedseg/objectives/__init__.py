"""Client-side method plug-ins. ``build_objective(name, **options)`` looks one up by name."""

from .base import BatchOutput, ClientObjective, RoundContext
from .registry import build_objective

__all__ = ["BatchOutput", "ClientObjective", "RoundContext", "build_objective"]
