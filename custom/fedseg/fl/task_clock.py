"""Where a task's time goes: server send -> site start -> site answer -> server receipt.

A site stamps every answer with ``task_clock = [started_at, answered_at]`` (wall-clock seconds, ``time.time()``:
when ``SiteService.answer`` got the task and when it had the answer ready). The server notes when it sent each
site its task and when the result arrived, and splits each site's round trip into

    deliver   sent -> site started: server serialisation, the site's task fetch (polling), transfer,
              deserialisation at the site
    site      site started -> site answered: the site's own work (training, evaluation, statistics)
    return    site answered -> server received: site serialisation, transfer, the server's result handling

and the task's ``total`` (send -> last result accepted) keeps what is left: waiting for the slowest site and the
controller's own result check. ``deliver`` and ``return`` are the framework's fixed cost per task.

The split needs the server's and the sites' clocks to agree: true in the simulator and in POC (one machine);
across real machines it is as good as their clock synchronisation (NTP: milliseconds), and a negative part is
reported as measured rather than hidden. A site that sends no stamp (an older site) only counts in ``total``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Mapping, Optional

#: result meta key: ``[started_at, answered_at]`` in seconds since the epoch (site clock)
TASK_CLOCK_KEY = "task_clock"


def site_clock(meta: Mapping[str, Any]) -> Optional[List[float]]:
    """The ``[started_at, answered_at]`` stamp of a result's meta, or ``None`` when absent or malformed."""
    value = meta.get(TASK_CLOCK_KEY)
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    try:
        started, answered = float(value[0]), float(value[1])
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(started) and math.isfinite(answered)) or answered < started:
        return None
    return [started, answered]


class TaskClock:
    """Per task name, over one round: the send -> last-result seconds and each answering site's split."""

    def __init__(self) -> None:
        self._parts: Dict[str, Dict[str, List[float]]] = {}
        self._totals: Dict[str, float] = {}

    def add_total(self, task: str, seconds: float) -> None:
        """``task`` took ``seconds`` from sending to its last result (summed when a task runs twice in a round)."""
        self._totals[task] = self._totals.get(task, 0.0) + float(seconds)

    def totals(self) -> Dict[str, float]:
        """``{task: seconds}``: each task's send -> last-result time this round (report field ``task_times``)."""
        return dict(self._totals)

    def record(self, task: str, sent_at: float, received_at: float, meta: Mapping[str, Any]) -> None:
        """One result of ``task``: sent to its site at ``sent_at``, received at ``received_at`` (server clock)."""
        clock = site_clock(meta)
        if clock is None:
            return
        parts = self._parts.setdefault(task, {"deliver": [], "site": [], "return": []})
        parts["deliver"].append(clock[0] - sent_at)
        parts["site"].append(clock[1] - clock[0])
        parts["return"].append(received_at - clock[1])

    def breakdown(self) -> Dict[str, Dict[str, float]]:
        """``{task: {deliver, site, return (medians over answers), total, answers}}`` for every task with a total."""
        out: Dict[str, Dict[str, float]] = {}
        for task, total in self._totals.items():
            parts = self._parts.get(task, {})
            row = {name: statistics.median(values) for name, values in parts.items() if values}
            row["total"] = float(total)
            row["answers"] = len(parts.get("site", []))
            out[task] = row
        return out
