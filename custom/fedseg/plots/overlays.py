"""Site-local overlay strips: image / truth / prediction for a few test images.

Written into the site's own workspace; these pixels never leave the site.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def _to_display(image: torch.Tensor) -> np.ndarray:
    """(C, W, H) channel-first tensor from MONAI's PIL reader -> (H, W, C) for imshow."""
    arr = image.detach().cpu().float().numpy()
    arr = np.moveaxis(arr, 0, -1).swapaxes(0, 1)
    if arr.min() < 0 or arr.max() > 1:  # z-scored MR / windowed CT slices: stretched for display
        arr = (arr - arr.min()) / max(float(arr.max() - arr.min()), 1e-6)
    return np.clip(arr if arr.shape[-1] == 3 else arr[..., 0], 0, 1)


def save_overlay_strip(engine, model: torch.nn.Module, path: Path, split: str = "test", n: int = 4) -> Path:
    """Rows: image, truth (green over image), prediction (red over image), for up to ``n`` images (of a volume, the
    slice along its last axis with the most labelled voxels)."""
    shown = []
    for inputs, labels, logits, _ in engine.iterate_logits(model, split):
        pred = logits.argmax(dim=1, keepdim=True)
        if inputs.ndim == 5:  # a volume: its slice (last axis) with the most labelled voxels
            k = int(labels[0, 0].flatten(0, 1).gt(0).sum(0).argmax())
            inputs, labels, pred = inputs[..., k], labels[..., k], pred[..., k]
        for i in range(inputs.shape[0]):
            shown.append((inputs[i], labels[i, 0], pred[i, 0]))
            if len(shown) >= n:
                break
        if len(shown) >= n:
            break
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(3, len(shown), figsize=(2.2 * len(shown), 6.6), squeeze=False)
    for col, (img, truth, pred) in enumerate(shown):
        base = _to_display(img)
        for row, (mask, colour, title) in enumerate(((None, None, "image"), (truth, (0, 1, 0), "truth"), (pred, (1, 0, 0), "prediction"))):
            ax = axes[row][col]
            ax.imshow(base, cmap=None if base.ndim == 3 else "gray")
            if mask is not None:
                m = mask.detach().cpu().numpy().T > 0
                overlay = np.zeros(m.shape + (4,))
                overlay[m] = (*colour, 0.55)
                ax.imshow(overlay)
            ax.set_axis_off()
            if col == 0:
                ax.set_title(title, fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
