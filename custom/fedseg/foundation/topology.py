"""Who talks to whom in FedEFM: the silo graph and the gossip step of decentralised training (DFL).

Silos are ordered by name (the controller's ``clients`` order). ``ring``: the directed ring
``i -> i+1 (mod M)``, so each silo has one out-neighbour (its overseas host) and one in-neighbour.
``full``: every silo is an out- and in-neighbour of every other. Out-neighbours of ``i`` train
overseas copies of ``i``'s model; in-neighbours of ``i`` are the silos whose models ``i`` mixes with.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import torch

TOPOLOGIES = ("ring", "full")


def _check(sites: Sequence[str], kind: str) -> List[str]:
    if kind not in TOPOLOGIES:
        raise ValueError(f"unknown topology {kind!r}; choose from {TOPOLOGIES}")
    if len(sites) < 2 or len(set(sites)) != len(sites):
        raise ValueError(f"a topology needs at least two distinct silos, got {list(sites)}")
    return list(sites)


def out_neighbours(sites: Sequence[str], kind: str = "ring") -> Dict[str, List[str]]:
    """``{silo: [silos it sends its model to for overseas training]}``."""
    sites = _check(sites, kind)
    m = len(sites)
    if kind == "ring":
        return {s: [sites[(i + 1) % m]] for i, s in enumerate(sites)}
    return {s: [t for t in sites if t != s] for s in sites}


def in_neighbours(sites: Sequence[str], kind: str = "ring") -> Dict[str, List[str]]:
    """``{silo: [silos whose models it receives]}`` (the transpose of :func:`out_neighbours`)."""
    out = out_neighbours(sites, kind)
    return {s: [t for t in sites if s in out[t]] for s in sites}


def mixing_matrix(sites: Sequence[str], kind: str = "ring", self_weight: float = 0.5) -> torch.Tensor:
    """Row-stochastic gossip matrix ``W`` ``(M, M)``: row ``i`` puts ``self_weight`` on silo ``i`` and
    splits the rest evenly over its in-neighbours, so one gossip step is ``theta' = W theta``."""
    if not 0.0 <= self_weight <= 1.0:
        raise ValueError(f"self_weight must lie in [0, 1], got {self_weight}")
    sites = list(sites)
    incoming = in_neighbours(sites, kind)
    w = torch.zeros(len(sites), len(sites), dtype=torch.float64)
    for i, s in enumerate(sites):
        w[i, i] = self_weight
        for t in incoming[s]:
            w[i, sites.index(t)] = (1.0 - self_weight) / len(incoming[s])
    return w


def gossip_mix(
    own: Mapping[str, torch.Tensor], neighbours: Sequence[Mapping[str, torch.Tensor]], self_weight: float = 0.5
) -> Dict[str, torch.Tensor]:
    """One silo's gossip step: ``self_weight * own + (1 - self_weight) * mean(neighbours)``.

    Floating tensors are mixed in float64 and cast back; integer buffers (counters) keep the silo's own.
    """
    if not neighbours:
        raise ValueError("gossip needs at least one neighbour model")
    if not 0.0 <= self_weight <= 1.0:
        raise ValueError(f"self_weight must lie in [0, 1], got {self_weight}")
    share = (1.0 - self_weight) / len(neighbours)
    mixed: Dict[str, torch.Tensor] = {}
    for key, value in own.items():
        if not torch.is_floating_point(value):
            mixed[key] = value.clone()
            continue
        acc = self_weight * value.double()
        for other in neighbours:
            acc = acc + share * other[key].double()
        mixed[key] = acc.to(value.dtype)
    return mixed
