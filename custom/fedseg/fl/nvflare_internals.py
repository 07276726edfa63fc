"""Every use of NVFlare's private API in fedseg, in one place, and :func:`check_internals`, which says which of
them an installed NVFlare no longer has.

Checked against NVFlare 2.9.0 (:data:`CHECKED_NVFLARE_VERSION`). What is used, and why no public way exists:

* ``nvflare.private.defs.SpecialTaskName.TRY_AGAIN``: the task name NVFlare's server answers a task request with
  while no task is standing for the site. The server's long poll (``fedseg.fl.task_hold``) must recognise that
  answer; the name is defined only in ``nvflare.private`` (no ``nvflare.apis`` constant carries it).
* ``nvflare.private.fed.server.server_runner.ServerRunner.process_task_request(client, fl_ctx)``: the server's
  answer to a site's task request. The long poll replaces it on the running runner (the ``FLContextKey.RUNNER``
  property of the server's context) for the length of a run. That works because NVFlare's callers
  (``GetTaskCommand.process`` in POC and production, ``SimulatorServer._process_task_request`` in the simulator)
  look the method up on that runner object at every request. NVFlare offers no hook that can delay the answer:
  ``EventType.BEFORE_PROCESS_TASK_REQUEST`` fires while the runner holds its workflow lock, so a handler that waited
  would keep the controller from scheduling the very task waited for, and the runner's own wait
  (``ServerRunner._try_to_get_task``'s ``timeout``) is called without a timeout and cannot be configured.
* ``nvflare.app_opt.pt.fedce.FedCEModelAggregator._contribution_weights``, ``._cosine_means`` and
  ``._cosine_counts``: FedCE's running state (the contribution weights sent to the sites, the running mean cosine
  between a site's update and the others' and its count). The server checkpoint saves and restores it and the
  round report records the cosine means. The aggregator has no public read or write of that state. The one public
  view, the contribution weights in the meta of ``aggregate_model``'s result, exists only once a round has been
  aggregated (the round report's ``aggregation_weight`` is taken from it), so the weights sent before the first
  round and after a restart, and the cosine state, are read here.

:func:`check_internals` imports NVFlare's server modules and runs FedCE's aggregator on a two-site round (seconds),
so the tests call it, not a run. At run time the FedCE accessors refuse to write an attribute the installed
aggregator does not have, rather than create one it never reads.

Ditto (``fedseg.objectives.ditto``) uses only public attributes of NVFlare's ``PTDittoHelper`` (``model``,
``optimizer``, ``criterion``, ``prox_criterion``, ``model_epochs``, ``epoch_of_start_time``) and needs nothing here.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional

import nvflare
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.private.defs import SpecialTaskName

#: the NVFlare release whose internals this module was written and checked against
CHECKED_NVFLARE_VERSION = "2.9.0"

#: the task name NVFlare's server answers a task request with while it has no task for the site yet
TRY_AGAIN_TASK = SpecialTaskName.TRY_AGAIN

#: the parameters of ``ServerRunner.process_task_request`` after ``self``, in order
PROCESS_TASK_REQUEST_PARAMETERS = ("client", "fl_ctx")

#: the server's task-request handlers, ``(module, qualified name)``, that call ``process_task_request`` on the
#: runner object: replacing the method on that object reaches every request only while they do
TASK_REQUEST_CALLERS = (
    ("nvflare.private.fed.server.server_commands", "GetTaskCommand.process"),
    ("nvflare.private.fed.simulator.simulator_server", "SimulatorServer._process_task_request"),
)

#: FedCE's running state: the key in fedseg's server checkpoint -> the aggregator's private attribute
FEDCE_STATE_ATTRIBUTES = {
    "contribution_weights": "_contribution_weights",
    "cosine_means": "_cosine_means",
    "cosine_counts": "_cosine_counts",
}

TaskRequestHandler = Callable[[Any, FLContext], tuple]


# ------------------------------------------------------------------------------------------ server runner
def task_request_runner(fl_ctx: Optional[FLContext]) -> Optional[Any]:
    """The server runner of ``fl_ctx`` whose ``process_task_request`` answers the sites' task requests, or None
    where the context has none (a client's context, a test's bare context)."""
    runner = fl_ctx.get_prop(FLContextKey.RUNNER) if fl_ctx is not None else None
    if runner is None or not callable(getattr(runner, "process_task_request", None)):
        return None
    return runner


def replace_process_task_request(runner: Any, handler: TaskRequestHandler) -> TaskRequestHandler:
    """Answer ``runner``'s task requests with ``handler(client, fl_ctx) -> (task name, task id, task data)``.

    Returns:
        The runner's previous ``process_task_request`` (bound), for ``handler`` to delegate to and for
        :func:`restore_process_task_request`.
    """
    original = runner.process_task_request
    runner.process_task_request = handler
    return original


def restore_process_task_request(runner: Any, handler: TaskRequestHandler, original: TaskRequestHandler) -> None:
    """Put ``original`` back on ``runner`` where ``handler`` (from :func:`replace_process_task_request`) still
    answers its requests; a handler installed since is left in place."""
    if runner.process_task_request == handler:
        runner.process_task_request = original


# ------------------------------------------------------------------------------------------ FedCE aggregator
def _fedce_attribute(aggregator: Any, key: str) -> str:
    """The private attribute holding FedCE state ``key``; a one-line error where this NVFlare has none (writing it
    would silently create an attribute the aggregator never reads)."""
    attribute = FEDCE_STATE_ATTRIBUTES[key]
    if not hasattr(aggregator, attribute):
        raise AttributeError(f"{type(aggregator).__name__} has no {attribute} in NVFlare {nvflare.__version__} "
                             f"(fedseg was checked against {CHECKED_NVFLARE_VERSION}; see check_internals())")
    return attribute


def fedce_contribution_weights(aggregator: Any) -> Dict[str, float]:
    """A copy of the contribution weights of NVFlare's ``FedCEModelAggregator``: site name -> weight (empty before
    the first round)."""
    return dict(getattr(aggregator, _fedce_attribute(aggregator, "contribution_weights")))


def fedce_cosine_means(aggregator: Any) -> Dict[str, float]:
    """A copy of the running mean cosine between each site's update and the others' weighted sum."""
    return dict(getattr(aggregator, _fedce_attribute(aggregator, "cosine_means")))


def fedce_state(aggregator: Any) -> Dict[str, Dict[str, Any]]:
    """A copy of FedCE's running state, keyed as :data:`FEDCE_STATE_ATTRIBUTES`: ``contribution_weights`` and
    ``cosine_means`` (site -> float), ``cosine_counts`` (site -> rounds seen)."""
    return {key: dict(getattr(aggregator, _fedce_attribute(aggregator, key))) for key in FEDCE_STATE_ATTRIBUTES}


def restore_fedce_state(aggregator: Any, state: Dict[str, Dict[str, Any]]) -> None:
    """Set FedCE's running state from ``state`` (as :func:`fedce_state` returns it); the aggregator then continues
    as the one the state was read from."""
    attributes = {key: _fedce_attribute(aggregator, key) for key in FEDCE_STATE_ATTRIBUTES}
    for key, attribute in attributes.items():
        setattr(aggregator, attribute, dict(state[key]))


# ------------------------------------------------------------------------------------------ guard
def _problem(internal: str, what: str) -> str:
    return f"{internal}: {what} (NVFlare {nvflare.__version__}; fedseg checked against {CHECKED_NVFLARE_VERSION})"


def _check_try_again() -> List[str]:
    internal = "nvflare.private.defs.SpecialTaskName.TRY_AGAIN"
    try:
        from nvflare.private.defs import SpecialTaskName as names
    except ImportError as e:
        return [_problem(internal, f"cannot import ({e})")]
    value = getattr(names, "TRY_AGAIN", None)
    if not isinstance(value, str) or not value:
        return [_problem(internal, f"missing or not a task name (got {value!r})")]
    if value != TRY_AGAIN_TASK:
        return [_problem(internal, f"is {value!r} now, {TRY_AGAIN_TASK!r} when this module was imported")]
    return []


def _check_process_task_request() -> List[str]:
    internal = "nvflare.private.fed.server.server_runner.ServerRunner.process_task_request"
    try:
        from nvflare.private.fed.server.server_runner import ServerRunner
    except ImportError as e:
        return [_problem(internal, f"cannot import ServerRunner ({e})")]
    method = getattr(ServerRunner, "process_task_request", None)
    if not callable(method):
        return [_problem(internal, "missing")]
    parameters = tuple(inspect.signature(method).parameters)[1:]
    if parameters != PROCESS_TASK_REQUEST_PARAMETERS:
        return [_problem(internal, f"parameters are {parameters}, expected {PROCESS_TASK_REQUEST_PARAMETERS}")]
    return []


def _check_task_request_callers() -> List[str]:
    problems = []
    for module_name, qualified_name in TASK_REQUEST_CALLERS:
        internal = f"{module_name}.{qualified_name}"
        try:
            target = __import__(module_name, fromlist=["_"])
            for part in qualified_name.split("."):
                target = getattr(target, part)
            source = inspect.getsource(target)
        except (ImportError, AttributeError, OSError, TypeError) as e:
            problems.append(_problem(internal, f"cannot be read ({type(e).__name__}: {e})"))
            continue
        if ".process_task_request(" not in source:
            problems.append(_problem(internal, "no longer calls process_task_request on the server runner"))
    return problems


def _check_fedce_state() -> List[str]:
    internal = "nvflare.app_opt.pt.fedce.FedCEModelAggregator"
    try:
        import numpy as np
        from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
        from nvflare.app_opt.pt.fedce import FedCEConstants, FedCEModelAggregator

        aggregator = FedCEModelAggregator()
    except Exception as e:  # an import or constructor NVFlare changed: reported, not raised
        return [_problem(internal, f"cannot be built ({type(e).__name__}: {e})")]
    missing = [a for a in FEDCE_STATE_ATTRIBUTES.values() if not isinstance(getattr(aggregator, a, None), dict)]
    if missing:
        return [_problem(f"{internal}.{a}", "missing or not a dict") for a in missing]
    # one round of two sites: the state must be kept per site in these attributes
    try:
        for site, update in (("a", [1.0, 0.0]), ("b", [0.0, 1.0])):
            aggregator.accept_model(FLModel(params={"w": np.asarray(update, dtype=np.float32)},
                                            params_type=ParamsType.DIFF,
                                            meta={"client_name": site, FedCEConstants.MINUS_MODEL_SCORE: 0.5}))
        aggregator.aggregate_model()
    except Exception as e:
        return [_problem(f"{internal}.aggregate_model", f"failed on a two-site round ({type(e).__name__}: {e})")]
    return [_problem(f"{internal}.{a}", "no longer holds one entry per site after a round")
            for a in FEDCE_STATE_ATTRIBUTES.values() if set(getattr(aggregator, a)) != {"a", "b"}]


#: the guard's checks, one per group of internals
INTERNAL_CHECKS: List[Callable[[], List[str]]] = [
    _check_try_again, _check_process_task_request, _check_task_request_callers, _check_fedce_state,
]


def check_internals() -> List[str]:
    """Whether the installed NVFlare still has every internal this module relies on, with the expected shape.

    Returns:
        One line per broken internal, naming it and the installed NVFlare version; empty where all are there.
    """
    return [line for check in INTERNAL_CHECKS for line in check()]


__all__ = [
    "CHECKED_NVFLARE_VERSION", "FEDCE_STATE_ATTRIBUTES", "PROCESS_TASK_REQUEST_PARAMETERS", "TASK_REQUEST_CALLERS",
    "TRY_AGAIN_TASK", "check_internals", "fedce_contribution_weights", "fedce_cosine_means", "fedce_state",
    "replace_process_task_request", "restore_process_task_request", "restore_fedce_state", "task_request_runner",
]
