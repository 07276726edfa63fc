"""Bring every raster image a site hands us to one of two pixel layouts the pipeline expects: 8-bit-range
grey ``(H, W)`` or RGB ``(H, W, 3)``, before MONAI sees it.

The bundle scales intensities with a fixed 0..255 window, so a 16-bit scan read as is saturates (every pixel
above 255 becomes white). Rules, by PIL mode:

================  ==========================================================================
``I;16*``, ``I``  16-bit grey: ``x / 65535 * 255`` as float32 (scaled **by dtype**, not by percentile:
                  the same raw value means the same intensity in every image of a site); 32-bit integer
                  values outside ``[0, 65535]`` are refused (not a 16-bit image)
``F``             float grey: kept as stored (it is already in the caller's units)
``RGBA``          alpha dropped -> ``RGB`` (the colour under a transparent pixel is kept as stored)
``P``             palette -> ``RGB`` through its palette (the indices are not intensities)
``LA``            alpha dropped -> ``L``
``1``             bilevel -> ``L`` (0 / 255)
``CMYK``, ``YCbCr`` -> ``RGB``
``L``, ``RGB``    unchanged
================  ==========================================================================

Grey images then become as many channels as the network has (``fedseg.data.transforms.EnsureChannelsd``:
repeated to 3, or kept at 1). Masks are **not** passed through this (a palette mask's indices are its
labels); ``fedseg.data.transforms.SegImageReader(image_modes=True)`` applies it to images only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: PIL modes this module accepts (anything else is an error naming the mode)
SUPPORTED_MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "I", "I;16", "I;16B", "I;16L", "I;16N", "F")
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")
#: 16-bit full scale mapped onto the bundle's 0..255 window
SIXTEEN_BIT_SCALE = 255.0 / 65535.0


class ImageModeError(ValueError):
    """An image whose pixel mode the pipeline cannot interpret."""


def to_pipeline_mode(img: Any) -> Any:
    """A PIL image in one of the layouts above (``L``, ``RGB`` or float ``F`` grey in 0..255 for 16-bit).

    Raises:
        ImageModeError: an unsupported mode, or 32-bit integer values outside the 16-bit range.
    """
    from PIL import Image

    mode = img.mode
    if mode in ("L", "RGB"):
        return img
    if mode in SIXTEEN_BIT_MODES or mode == "I":
        arr = np.asarray(img).astype(np.float64)
        if mode == "I" and arr.size and (arr.min() < 0 or arr.max() > 65535):
            raise ImageModeError(
                f"32-bit integer image with values in [{arr.min():.0f}, {arr.max():.0f}]: not a 16-bit image; "
                "convert it to 8- or 16-bit first"
            )
        return Image.fromarray((arr * SIXTEEN_BIT_SCALE).astype(np.float32), mode="F")
    if mode == "F":
        return img
    if mode in ("RGBA", "RGBX", "CMYK", "YCbCr"):
        return img.convert("RGB")
    if mode in ("P", "PA"):
        return img.convert("RGBA").convert("RGB")
    if mode in ("LA", "1"):
        return img.convert("L")
    raise ImageModeError(f"unsupported image mode {mode!r}; supported: {SUPPORTED_MODES}")
