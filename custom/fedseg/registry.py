"""Name -> class registries whose classes are named by ``"package.module:Class"`` strings and imported on first use.

A site imports only the code of the method it runs, and ``fedseg export`` lists every method without importing any
(the method table, :mod:`fedseg.methods`; the objectives, :mod:`fedseg.objectives.registry`; the strategies,
:mod:`fedseg.strategies.registry`).
"""

from __future__ import annotations

import importlib
from typing import Any, Iterable, List, Mapping


def import_target(target: str) -> Any:
    """The object that ``target`` (``"package.module:Name"``) names, its module imported now.

    Raises:
        ValueError: ``target`` is not of the form ``"package.module:Name"``.
    """
    check_target(target)
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def check_target(target: str) -> None:
    """Refuse a ``target`` that is not ``"package.module:Name"`` (checked when a name is registered; imported on use)."""
    module, sep, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not (sep and module and attr and ":" not in attr):
        raise ValueError(f"a registry target is 'package.module:Name', got {target!r}")


def unknown_name(kind: str, name: str, known: Iterable[str]) -> ValueError:
    """The error for a name no registry entry has: it names the known ones."""
    return ValueError(f"unknown {kind} {name!r}; known: {sorted(known)}")


class LazyRegistry:
    """Name -> class, each class named by a ``"package.module:Class"`` string and imported when first asked for.

    Args:
        kind: what the names name, in error messages ("client objective", "server strategy", "method").
        targets: name -> ``"package.module:Class"``, read at every look-up (so a live view of the method table
            stays the registry's content).
    """

    def __init__(self, kind: str, targets: Mapping[str, str]):
        self.kind = kind
        self._targets = targets

    def names(self) -> List[str]:
        return sorted(self._targets)

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def target(self, name: str) -> str:
        """``name``'s ``"package.module:Class"`` (nothing imported).

        Raises:
            ValueError: no entry is named ``name``; the message lists the known names.
        """
        if name not in self._targets:
            raise unknown_name(self.kind, name, self._targets)
        return self._targets[name]

    def get(self, name: str) -> Any:
        """The class registered under ``name``, its module imported now (ValueError naming the known names if none)."""
        return import_target(self.target(name))
