"""Experiment tracking of fedseg jobs, added with NVFlare's recipe utility ``add_experiment_tracking``.

Every site sends, as NVFlare analytics events, its training metrics of every round and its final test metrics
(``fedseg.fl.tracking``); a receiver on the server writes them, one curve per site. Every recipe has the
TensorBoard receiver (the run directory's ``tb_events/<site>/``); :func:`add_mlflow` adds NVFlare's MLflow receiver
(one MLflow run per site in one experiment) where the ``mlflow`` package is installed — it is not a fedseg
dependency.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

#: the event the server-side receivers handle: the sites' analytics, forwarded to the server (NVFlare's
#: ``ConvertToFedEvent`` on every site turns ``analytix_log_stats`` into ``fed.analytix_log_stats``)
SITE_EVENTS = ["fed.analytix_log_stats"]


def add_tensorboard(recipe) -> None:
    """The server's TensorBoard receiver: every site's tracked metrics under ``<run dir>/tb_events/<site>/``."""
    from nvflare.recipe import add_experiment_tracking

    add_experiment_tracking(recipe, "tensorboard", {"events": list(SITE_EVENTS)})


def add_mlflow(recipe, tracking_uri: Optional[str] = None, experiment_name: Optional[str] = None) -> None:
    """The server's MLflow receiver besides TensorBoard: one run per site (its metric curves and final test metrics).

    Args:
        recipe: a fedseg recipe.
        tracking_uri: an MLflow tracking server or store, as the server reaches it; None = a SQLite store in the job's
            result folder on the server (``mlflow.db``, downloaded with the result).
        experiment_name: the MLflow experiment; None = ``fedseg-<job name>``.

    Raises:
        ValueError: ``mlflow`` is not installed here (the receiver is built here, and it runs on the server, which
            needs the package too).
    """
    from nvflare.recipe import add_experiment_tracking

    if importlib.util.find_spec("mlflow") is None:
        raise ValueError("MLflow tracking needs the mlflow package here and on the FL server: pip install mlflow "
                         "(or leave MLflow out: every job writes TensorBoard events)")
    config = {"events": list(SITE_EVENTS), "kw_args": {"experiment_name": experiment_name or f"fedseg-{recipe.name}",
                                                        "run_name": recipe.name}}
    if tracking_uri:
        config["tracking_uri"] = tracking_uri
    add_experiment_tracking(recipe, "mlflow", config)
