"""MONAI pre-processing of classification images (FedEFM phase 1, the ``vit_foundation`` bundle).

Items are ``{"image": path, "label": int}``; only the image is transformed, the class index passes
through (``DataLoader`` collates it to a ``(B,)`` long tensor). Output image: ``(in_channels, S, S)``
float32 in ``[0, 1]``, ``S = image_size`` (the ViT's input side).

Pipeline: decode (PNG/JPEG/TIFF/... through PIL, NIfTI through nibabel: ``SegImageReader``) ->
channel first -> exactly ``in_channels`` channels (grey repeated, RGB averaged to grey, RGBA's alpha
dropped) -> 8-bit range to ``[0, 1]`` -> area resize to ``S x S`` -> (training, ``augment``) random
horizontal and vertical flips -> float32 tensor without MONAI metadata.

A flip keeps the class of an X-ray image (device type, scanner style, anatomy side is not a label
here); rotations and intensity changes are left out on purpose: a scanner's contrast can be the class.
"""

from __future__ import annotations

from typing import List, Sequence, Union

import torch
from monai.transforms import (
    Compose,
    EnsureChannelFirstd,
    EnsureTyped,
    LoadImaged,
    RandFlipd,
    Resized,
    ScaleIntensityRanged,
)

from fedseg.data.transforms import EnsureChannelsd, SegImageReader

__all__ = ["classification_transforms", "load_transforms", "augment_transforms"]


def _size(image_size: Union[int, Sequence[int]]) -> List[int]:
    size = [int(image_size)] * 2 if isinstance(image_size, (int, float)) else [int(s) for s in image_size]
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (H, W), got {image_size!r}")
    return size


def load_transforms(image_size: Union[int, Sequence[int]], in_channels: int = 1) -> list:
    """Deterministic part (cacheable): decode, ``in_channels`` channels, ``[0, 1]``, resize to ``image_size``."""
    if int(in_channels) not in (1, 3):
        raise ValueError(f"in_channels must be 1 (grey) or 3 (RGB), got {in_channels}")
    return [
        LoadImaged(keys="image", reader=SegImageReader(), image_only=True),
        EnsureChannelFirstd(keys="image"),
        # via RGB first: RGBA loses its alpha before a grey average (grey -> RGB -> grey is exact)
        EnsureChannelsd(keys="image", channels=3),
        EnsureChannelsd(keys="image", channels=int(in_channels)),
        ScaleIntensityRanged(keys="image", a_min=0.0, a_max=255.0, b_min=0.0, b_max=1.0, clip=True),
        Resized(keys="image", spatial_size=_size(image_size), mode="area"),
    ]


def augment_transforms() -> list:
    """Random flips along each image axis (probability 0.5 each)."""
    return [
        RandFlipd(keys="image", prob=0.5, spatial_axis=0),
        RandFlipd(keys="image", prob=0.5, spatial_axis=1),
    ]


def classification_transforms(
    image_size: Union[int, Sequence[int]], in_channels: int = 1, train: bool = False, augment: bool = True
) -> Compose:
    """The whole pipeline: :func:`load_transforms`, then flips when ``train and augment``, then float32."""
    transforms = load_transforms(image_size, in_channels)
    if train and augment:
        transforms += augment_transforms()
    transforms.append(EnsureTyped(keys="image", dtype=torch.float32, track_meta=False))
    return Compose(transforms)
