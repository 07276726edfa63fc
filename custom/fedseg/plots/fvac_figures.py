"""Site-local FVAC figure: where FMUG puts its pixel weights (the paper's Fig. 4).

Written into the site's own workspace; these pixels never leave the site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def display_array(arr: torch.Tensor) -> np.ndarray:
    """(C, W, H) channel-first tensor -> (H, W, C) or (H, W) for imshow.

    Same orientation convention as :mod:`fedseg.plots.overlays`: MONAI's PIL reader yields (C, W, H),
    so the two spatial axes are swapped back for display.
    """
    a = arr.detach().cpu().float().numpy()
    a = np.moveaxis(a, 0, -1).swapaxes(0, 1)
    return a if a.shape[-1] == 3 else a[..., 0]


def save_panel_grid(fig: plt.Figure, axes, row_titles: Sequence[str], path: Path, dpi: int) -> Path:
    """Write a grid of image panels (``axes[row][col]``) to the PNG ``path`` (parent folders created): every panel's
    axes hidden, each row's title over its first panel; the figure is closed."""
    for row, title in enumerate(row_titles):
        for ax in axes[row]:
            ax.set_axis_off()
        axes[row][0].set_title(title, fontsize=8, loc="left")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def save_weight_map_figure(images: torch.Tensor, labels: torch.Tensor, alpha: torch.Tensor, path: Path) -> Path:
    """Rows: image / ground truth / FMUG weight heat map, one column per training image.

    Args:
        images: ``(N, C_in, H, W)`` with ``C_in`` 1 or 3 (as from ``FVACObjective.last_weight_maps``).
        labels: ``(N, 1, H, W)`` 0/1 masks.
        alpha: ``(N, 1, H, W)`` normalised weights (each image sums to 1).
        path: PNG file to write; parent folders are created.

    The heat map shows ``alpha * H * W``, the weight relative to uniform (1 = plain cross-entropy
    weight), because raw alpha values are ~1/(H W) and unreadable on a colour bar.
    """
    if not (images.shape[0] == labels.shape[0] == alpha.shape[0]) or images.shape[0] == 0:
        counts = (images.shape[0], labels.shape[0], alpha.shape[0])
        raise ValueError(f"need the same non-zero number of images, labels and weight maps, got {counts}")
    n = images.shape[0]
    n_pixels = alpha[0, 0].numel()
    fig, axes = plt.subplots(3, n, figsize=(2.4 * n + 0.6, 6.9), squeeze=False)
    for col in range(n):
        img = display_array(images[col])
        img = (img - img.min()) / max(float(img.max() - img.min()), 1e-8)  # normalised images are not in [0, 1]
        axes[0][col].imshow(img, cmap=None if img.ndim == 3 else "gray")
        axes[1][col].imshow(display_array(labels[col]), cmap="gray", vmin=0, vmax=1)
        heat = axes[2][col].imshow(display_array(alpha[col]) * n_pixels, cmap="magma")
        fig.colorbar(heat, ax=axes[2][col], fraction=0.046, pad=0.02)
    return save_panel_grid(fig, axes, ("image", "truth", "alpha x HW"), path, dpi=90)
