"""Site-local PathFL figure: what collaborative style enhancement feeds the network (the paper's Fig. 3).

Written into the site's own workspace; these pixels never leave the site.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from .fvac_figures import display_array, save_panel_grid  # noqa: E402


def save_style_figure(originals: torch.Tensor, restyled: torch.Tensor, hybrids: torch.Tensor, path: Path) -> Path:
    """Rows: original / restyled (AdaIN with a pooled style) / hybrid, one column per training patch.

    Args:
        originals, restyled, hybrids: ``(N, C_in, H, W)`` each, as from ``PathFLObjective.last_examples``.
        path: PNG file to write; parent folders are created.

    Each column shares one display range (that of its original, clipped) so colour shifts stay visible.
    """
    if not (originals.shape == restyled.shape == hybrids.shape) or originals.shape[0] == 0:
        raise ValueError(f"need equally shaped, non-empty batches, got {tuple(originals.shape)}, {tuple(restyled.shape)}, {tuple(hybrids.shape)}")
    n = originals.shape[0]
    fig, axes = plt.subplots(3, n, figsize=(2.4 * n + 0.6, 7.2), squeeze=False)
    for col in range(n):
        for row, batch in enumerate((originals, restyled, hybrids)):
            img = display_array(batch[col]).clip(0.0, 1.0)
            axes[row][col].imshow(img, cmap=None if img.ndim == 3 else "gray", vmin=0, vmax=1)
    return save_panel_grid(fig, axes, ("original", "restyled", "hybrid"), path, dpi=100)
