"""Evaluation of a segmentation site: test metrics, the validation Dice sent with the weights, and the site's figures.

:class:`SegmentationEvaluation` scores a ``SegEngine``'s model. Each image is scored at its own size against its mask
on disk (scores resized back, or for volumes inverted to the scan's geometry, before the argmax), with MONAI's metrics
(``fedseg.metrics.segmentation``). The validation Dice a site sends every round is computed in batches on the device
where the split allows it (:meth:`SegmentationEvaluation.batched_dice`: resize mode, 2-D, a wholly cached split), and
image by image otherwise; both give the same number.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from fedseg.config import TrainConfig
from fedseg.data.transforms import resize_scores
from fedseg.engine.api import WindowSampledEngine
from fedseg.engine.spatial import pixel_spacing, tensor_spacing
from fedseg.engine.volume import plain, scan_spacing
from fedseg.metrics import SegmentationMetrics
from fedseg.metrics.segmentation import LARGEST_COMPONENT_SUFFIX, keep_largest_component, largest_component_key

__all__ = ["DEFAULT_EVAL_METRICS", "SegmentationEvaluation", "eval_metric_names"]

#: test metrics of a segmentation evaluation unless the job names others (train_config["eval_metrics"])
DEFAULT_EVAL_METRICS = ("dice", "hd95", "assd")

#: a split held on the device: images ``(N, C, h, w)`` on the network's grid, masks grouped by size
#: ``{(H, W): (image indices (n,), masks (n, 1, H, W))}``
HeldSplit = Tuple[torch.Tensor, Dict[Tuple[int, ...], Tuple[torch.Tensor, torch.Tensor]]]


def eval_metric_names(config: TrainConfig, metrics: Optional[Sequence[str]] = None) -> Sequence[str]:
    """The metrics an evaluation computes: ``metrics`` when given, else the job's ``eval_metrics``, else
    :data:`DEFAULT_EVAL_METRICS`."""
    return metrics or config.evaluation.eval_metrics or DEFAULT_EVAL_METRICS


class SegmentationEvaluation:
    """The evaluation part of a ``SegEngine`` (the engine's ``evaluate``, ``validation_metrics`` and
    ``save_evaluation_figures`` delegate here).

    Args:
        engine: the site's ``SegEngine`` (which creates this; typed by its protocol, as the engine module imports
            this one): its ``scored_batches`` gives each image's scores at the image's own size and its ``_dataset``
            the cached evaluation datasets.
    """

    def __init__(self, engine: WindowSampledEngine):
        self.engine = engine
        #: evaluation splits held on the device for batched validation (:meth:`batched_dice`); None: not wholly cached
        self._held: Dict[str, Optional[HeldSplit]] = {}

    def evaluate(
        self,
        model: nn.Module,
        split: str,
        metrics: Optional[Sequence[str]] = None,
        per_image: bool = False,
        largest_component: Optional[bool] = None,
    ):
        """Mean foreground metrics of ``model`` over the images of ``split``, each scored at its own size against its
        mask on disk (inside the FOV and in mm too where the datalist provides them; see
        ``fedseg.metrics.segmentation``). ``metrics``: :func:`eval_metric_names`. With ``per_image`` returns ``(means,
        rows)``, one row per image in datalist order: ``{"id": image file name, <metric>: value, ...}``.
        ``largest_component`` (None = ``train_config["eval_largest_component"]``): also every metric of the prediction
        reduced to each class's largest connected component, under ``<metric>_lcc`` (``keep_largest_component``),
        beside the raw one."""
        engine = self.engine
        if largest_component is None:
            largest_component = engine.config.evaluation.eval_largest_component
        metrics = eval_metric_names(engine.config, metrics)
        meters = {"": SegmentationMetrics(engine.num_classes, metrics, label_space=engine.label_space)}
        if largest_component:
            meters[LARGEST_COMPONENT_SUFFIX] = SegmentationMetrics(engine.num_classes, metrics, label_space=engine.label_space)
        entries = engine.data[split]
        for i, (batch, logits, _) in enumerate(engine.scored_batches(model, split, False)):
            fov = batch.get("fov")
            if engine.volumes:  # distances in mm from the scan's own header (the label is in its own geometry)
                spacing = scan_spacing(batch["label"])
            else:
                spacing = tensor_spacing(pixel_spacing(entries[i], engine.datalist_info), entries[i]["image"])
            pred = logits.argmax(dim=1, keepdim=True).cpu()
            for suffix, meter in meters.items():
                meter.update(
                    keep_largest_component(pred, engine.num_classes) if suffix else pred,
                    plain(batch["label"]).cpu(),
                    fov=None if fov is None else fov.cpu(),
                    spacing=spacing,
                )
        # the post-processed scores beside the raw ones, under their own keys (dice_lcc, ...)
        means, rows = {}, [{"id": os.path.basename(e["image"])} for e in entries]
        for suffix, meter in meters.items():
            rename = largest_component_key if suffix else (lambda key: key)
            means.update({rename(k): v for k, v in meter.aggregate().items()})
            for row, values in zip(rows, meter.per_image()):
                row.update({rename(k): v for k, v in values.items()})
        return (means, rows) if per_image else means

    def validation_metrics(self, model: nn.Module) -> Dict[str, float]:
        """``{"val_dice": mean Dice on the validation split}`` (sent with the trained weights): what
        ``evaluate(model, "validation", ("dice",))`` gives, computed in batches on the device where the split allows it
        (:meth:`batched_dice`)."""
        dice = self.batched_dice(model, "validation")
        if dice is None:
            dice = self.evaluate(model, "validation", metrics=("dice",), largest_component=False)["dice"]
        return {"val_dice": dice}

    @torch.no_grad()
    def batched_dice(self, model: nn.Module, split: str) -> Optional[float]:
        """Mean foreground Dice of ``model`` over ``split``, as :meth:`evaluate` scores it (scores resized back to each
        image's own size before the argmax, empty-mask policy of ``fedseg.metrics``), with the images held on the
        device and predicted ``eval_batch_size`` at a time. Resize mode, 2-D, a wholly cached split and
        ``resident_data`` on; else None (the caller evaluates image by image)."""
        engine = self.engine
        if engine.volumes or engine.spatial_mode != "resize" or not engine.config.runtime.resident_data:
            return None
        if split not in self._held:
            self._held[split] = self.hold_split(split)
        held = self._held[split]
        if held is None:
            return None
        images, labels = held
        step = max(engine.config.runtime.eval_batch_size, 1)
        meter = SegmentationMetrics(engine.num_classes, ("dice",), label_space=engine.label_space)
        was_training = model.training
        model.eval()
        try:
            scores = torch.cat([engine.predict(model, images[i:i + step]) for i in range(0, len(images), step)])
        finally:
            model.train(was_training)
        # images whose masks share a size are scored together; the mean over images does not depend on the order
        for size, (index, truth) in labels.items():
            pred = resize_scores(scores.index_select(0, index), size).argmax(dim=1, keepdim=True)
            meter.update(pred, truth)
        return meter.aggregate()["dice"]

    def hold_split(self, split: str) -> Optional[HeldSplit]:
        """A wholly cached evaluation split on the device (:data:`HeldSplit`); None when it is not wholly cached."""
        engine = self.engine
        dataset = engine._dataset(split, False)
        if len(dataset) == 0 or dataset.cache_num < len(dataset.data):
            return None
        items = [dataset[i] for i in range(len(dataset))]
        images = torch.stack([plain(it["image"]).float() for it in items]).to(engine.device)
        groups: Dict[Tuple[int, ...], List[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault(tuple(int(x) for x in it["label"].shape[1:]), []).append(i)
        labels = {size: (torch.tensor(index, device=engine.device),
                         torch.stack([plain(items[i]["label"]).float() for i in index]).to(engine.device))
                  for size, index in groups.items()}
        return images, labels

    def save_figures(self, model: nn.Module, output_dir: os.PathLike, model_name: str) -> None:
        """Overlay strip (image / truth / prediction) of the test split, for the global model only."""
        if model_name == "global":
            from fedseg.plots.overlays import save_overlay_strip

            save_overlay_strip(self.engine, model, os.path.join(output_dir, f"overlays_{model_name}.png"))
