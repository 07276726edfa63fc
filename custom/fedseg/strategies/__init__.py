"""Server-side method plug-ins. ``build_strategy(name, **options)`` looks one up by name."""

from .base import ClientUpdate, Exchange, Params, ServerStrategy, SitePayload
from .registry import build_strategy

__all__ = ["ClientUpdate", "Exchange", "Params", "ServerStrategy", "SitePayload", "build_strategy"]
