"""Which of a site's answers go to the job's experiment tracking, and under which names.

A site sends them as NVFlare analytics events (``fedseg.fl.site_executor``; the Client API site script through
NVFlare's ``SummaryWriter``); the server's receivers (TensorBoard, MLflow: ``fedseg.recipes.tracking``) write one
curve per site. They are the same scalar metrics the site's results carry (``fedseg.fl.client``), nothing more.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Mapping

from fedseg.fl.model_selection import SPLIT_META_KEY, VALIDATION_SPLIT
from fedseg.fl.protocol import EVALUATE_TASK, TRAIN_TASK

#: characters MLflow refuses in a metric name (it allows letters, digits, ``_ - . /`` and space)
_NOT_A_METRIC_NAME = re.compile(r"[^\w\-. /]")


def metric_tag(name: str) -> str:
    """A metric name every receiver accepts: a class or region suffix (``dice:cup``) becomes a sub-name (``dice/cup``)."""
    return _NOT_A_METRIC_NAME.sub("_", name.replace(":", "/"))


def tracked_metrics(task: str, metrics: Mapping[str, Any], meta: Mapping[str, Any]) -> Dict[str, float]:
    """``{tag: value}`` to track for a task's answer: a training round's metrics under their own names, a test
    evaluation's as ``test_<model>/<metric>`` (``test_global/dice``, ``test_personalized/hd95``); nothing for other tasks
    and for the validation-only evaluations of model selection.

    Args:
        task: the task's name.
        metrics: the metrics the site answers with.
        meta: the task's meta from the server (``model_name``, and the split for an evaluation).
    """
    if task == TRAIN_TASK:
        prefix = ""
    elif task == EVALUATE_TASK and meta.get(SPLIT_META_KEY) != VALIDATION_SPLIT:
        prefix = f"test_{meta.get('model_name') or 'global'}/"
    else:
        return {}
    return {metric_tag(prefix + name): float(value) for name, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
