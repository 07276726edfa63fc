"""Ditto (Li et al., ICML 2021), server side: FedAvg of the global models; the personal models stay at the
sites during training and are collected after it (``submit_model``) for the personalised and cross-site
evaluations. The site side (two models per site) is ``fedseg.objectives.ditto``."""

from __future__ import annotations

from fedseg.fl.protocol import SUBMIT_MODEL_TASK

from .fedavg import FedAvgStrategy


class DittoStrategy(FedAvgStrategy):
    name = "ditto"
    objective = "ditto"
    personalized_at_sites = True
    extra_tasks = (SUBMIT_MODEL_TASK,)
