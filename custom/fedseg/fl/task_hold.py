"""A site's task request held on the server until its next task exists (a long poll).

NVFlare's server answers a site that asks for a task while none is standing for it with "try again", and the site
asks again after its fetch interval: the server's ``task_request_interval`` in POC and production, but a fixed 0.5 s
in the simulator's client worker (NVFlare 2.9, ``simulator_worker.ClientTaskWorker.do_one_task``). A site that
finishes its task asks before the server has aggregated and sent the next one, so between two tasks of a run that
retry sleep is most of a task's delivery: measured 0.25-0.5 s per task in the simulator where the site needs a
few milliseconds to fetch it. NVFlare's own server loop can wait for a task (``ServerRunner._try_to_get_task`` has
``timeout`` and ``retry_interval``) but is called without a timeout.

:func:`hold_task_requests` wraps the server runner's ``process_task_request`` for the length of a run: a request
answered "try again" is asked again every ``poll_s`` until a task is there or ``hold_s`` has passed, so the site
gets its task as soon as the controller schedules it. The answer is NVFlare's own (task, try again or end of run);
only its timing changes. At most ``max_held`` requests wait at once (each holds one of the server's message
threads), the others are answered at once as before. The runner's method and the "try again" task name are NVFlare
internals, used through ``fedseg.fl.nvflare_internals``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from nvflare.apis.fl_context import FLContext

from fedseg.fl.nvflare_internals import (TRY_AGAIN_TASK, replace_process_task_request, restore_process_task_request,
                                         task_request_runner)

#: the name NVFlare's server answers with when it has no task for the site yet
TRY_AGAIN = TRY_AGAIN_TASK


class TaskRequestHold:
    """The wrapper of one server runner's ``process_task_request``; :meth:`release` restores the original.

    Args:
        runner: NVFlare's ``ServerRunner`` (``FLContextKey.RUNNER`` of the server's context).
        hold_s: longest wait of one request, seconds (> 0).
        poll_s: interval between two looks for a task, seconds.
        max_held: most requests waiting at the same time.
        stop: returns True when no request should wait any more (the run is ending).
    """

    def __init__(self, runner: Any, hold_s: float, poll_s: float = 0.005, max_held: int = 32,
                 stop: Optional[Callable[[], bool]] = None):
        if not hold_s > 0:
            raise ValueError(f"hold_s must be > 0 seconds, got {hold_s!r}")
        self.runner = runner
        self.hold_s, self.poll_s, self.max_held = float(hold_s), float(poll_s), int(max_held)
        self.stop = stop or (lambda: False)
        self.held = 0
        self._lock = threading.Lock()
        self._original = replace_process_task_request(runner, self.process_task_request)

    def process_task_request(self, client: Any, fl_ctx: FLContext) -> tuple:
        answer = self._original(client, fl_ctx)
        if answer[0] != TRY_AGAIN or self.stop():
            return answer
        with self._lock:
            if self.held >= self.max_held:
                return answer
            self.held += 1
        try:
            deadline = time.monotonic() + self.hold_s
            while answer[0] == TRY_AGAIN and time.monotonic() < deadline and not self.stop():
                time.sleep(self.poll_s)
                answer = self._original(client, fl_ctx)
            return answer
        finally:
            with self._lock:
                self.held -= 1

    def release(self) -> None:
        """Put the runner's own ``process_task_request`` back (requests already waiting finish their wait)."""
        restore_process_task_request(self.runner, self.process_task_request, self._original)


def hold_task_requests(fl_ctx: FLContext, hold_s: float, stop: Optional[Callable[[], bool]] = None,
                       **kwargs: Any) -> Optional[TaskRequestHold]:
    """Hold the task requests of the server of ``fl_ctx`` for up to ``hold_s`` seconds (:class:`TaskRequestHold`).

    Returns:
        The hold, or None where ``hold_s`` is 0 or the context has no server runner with ``process_task_request``
        (then requests are answered as NVFlare answers them).
    """
    if not hold_s:
        return None
    runner = task_request_runner(fl_ctx)
    if runner is None:
        return None
    return TaskRequestHold(runner, hold_s, stop=stop, **kwargs)


__all__ = ["TRY_AGAIN", "TaskRequestHold", "hold_task_requests"]
