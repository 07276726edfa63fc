"""What the tests of homomorphic aggregation look for in a server's files (tests/test_homomorphic.py, the deployment
scenario of tests/deploy_utils.py)."""

from __future__ import annotations

from pathlib import Path

import torch


def plaintext_copies(folder: Path, models) -> list:
    """Where under ``folder`` a floating-point entry (16 values or more) of one of ``models`` is held in the clear: its
    float32 bytes in any file, or a tensor close to it (1e-3) in a ``.pt`` file."""
    targets = [(k, v.detach().float().flatten()) for m in models for k, v in m.items()
               if torch.is_floating_point(v) and v.numel() >= 16]
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path.name}: {k} (bytes)" for k, v in targets if v[:16].numpy().tobytes() in data]
        if path.suffix != ".pt":
            continue
        tensors = []

        def walk(node):
            if isinstance(node, torch.Tensor):
                tensors.append(node.detach().float().flatten())
            elif isinstance(node, dict):
                for value in node.values():
                    walk(value)
            elif isinstance(node, (list, tuple)):
                for value in node:
                    walk(value)

        walk(torch.load(path, map_location="cpu", weights_only=False))  # the test's own workspace
        found += [f"{path.name}: {k}" for k, v in targets for t in tensors
                  if t.numel() == v.numel() and torch.allclose(t, v, atol=1e-3)]
    return found
