"""End every process a command started when the command itself is stopped by a signal.

The suite's long commands (``fedseg bench`` and ``fedseg run``, ``jobs/job.py``, ``benchmarks/reproduce.py --run``,
the GPU check, the POC scripts) start NVFlare simulators and other child processes, most of them in sessions of their
own (``start_new_session=True``; NVFlare's ``simulator_worker`` processes call ``setsid``). A SIGTERM to the command
alone (``timeout``, a scheduler's time limit) or a Ctrl-C, which reaches only the terminal's process group, would
leave them running, re-parented to init. :class:`StopOnSignal` wraps a command's ``main``: on SIGTERM or SIGINT it
ends the command's process tree (:func:`end_process_tree`: SIGTERM, then SIGKILL after a grace period), writes one
line to stderr naming what it ended, lets the command unwind (its ``finally`` blocks run) and exits with 128 + the
signal's number (143 for SIGTERM, 130 for SIGINT).

A command's process tree (:func:`process_tree`, read from Linux's ``/proc``; elsewhere it is empty):

* its descendants (parent links);
* every process whose environment carries the command's tag (:data:`TREE_ENV`, set while the command runs and
  inherited by whatever it starts): a process re-parented to init because its parent ended (NVFlare POC's daemons,
  a grandchild started in its own session) is found too;
* every member of a process group or session led by one of those (a simulator's whole session).

Nested commands (``reproduce.py --run`` starting ``fedseg bench``, which starts simulators) each end their own tree:
the outer command's signal reaches the inner command, which ends its own processes and writes its own line.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

#: environment variable holding the tags of the running commands that guard their process trees (space-separated,
#: outermost first); every process a command starts inherits it
TREE_ENV = "FEDSEG_PROCESS_TREES"
#: the signals :class:`StopOnSignal` handles
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_PYTHON = re.compile(r"python[0-9.]*")
#: names given to processes by the code that started them, keyed by (pid, start time)
_NAMES: Dict[Tuple[int, int], str] = {}
#: the StopOnSignal active in this process (nested ones in the same process do nothing)
_ACTIVE: Optional["StopOnSignal"] = None
#: (pid, signal) once a StopOnSignal of process pid handles a stop signal; kept until the process ends
_STOPPING: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class ProcessInfo:
    """One process as ``/proc/<pid>/stat`` describes it.

    Attributes:
        pid, ppid, pgid, sid: its id, its parent's, its process group's and its session's.
        state: one letter (``Z``: ended, not yet reaped by its parent).
        start: its start time in clock ticks after boot; with ``pid``, it tells the process apart from a later one
            given the same pid.
    """

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start: int


def read_process(pid: int) -> Optional[ProcessInfo]:
    """``/proc/<pid>/stat`` of ``pid``, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        fields = stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        return ProcessInfo(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0], int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def process_table() -> Dict[int, ProcessInfo]:
    """Every process of the machine (``/proc``), by pid; empty where there is no ``/proc``."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    table = {}
    for entry in entries:
        if entry.isdigit():
            info = read_process(int(entry))
            if info is not None:
                table[info.pid] = info
    return table


def is_running(pid: int, start: Optional[int] = None) -> bool:
    """Whether process ``pid`` (the one started at ``start``, when given) still runs (a zombie does not)."""
    info = read_process(pid)
    return info is not None and info.state != "Z" and (start is None or info.start == start)


def tree_tag(pid: Optional[int] = None) -> str:
    """The tag :class:`StopOnSignal` gives the processes command ``pid`` (default: this process) starts."""
    pid = os.getpid() if pid is None else pid
    info = read_process(pid)
    return f"{pid}.{info.start if info else 0}"


def carries_tag(pid: int, tag: str) -> bool:
    """Whether process ``pid`` was started with ``tag`` among the tags of :data:`TREE_ENV` (False for a process
    whose environment cannot be read: another user's)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False
    prefix = f"{TREE_ENV}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return tag.encode() in entry[len(prefix):].split()
    return False


def ancestors(pid: int, table: Dict[int, ProcessInfo]) -> Set[int]:
    """``pid``'s parent, its parent's parent, ... up to init."""
    found: Set[int] = set()
    while pid in table and table[pid].ppid > 0 and table[pid].ppid not in found:
        pid = table[pid].ppid
        found.add(pid)
    return found


def process_tree(root: int, tag: Optional[str] = None,
                 table: Optional[Dict[int, ProcessInfo]] = None) -> Dict[int, ProcessInfo]:
    """The running processes of command ``root``'s tree (module docstring), ``root`` and its ancestors left out.

    Args:
        root: the command's pid.
        tag: its :func:`tree_tag`, to find the processes it started that are no longer its descendants; None to
            follow parent links and groups only.
        table: a :func:`process_table` read already (default: read now).
    """
    table = process_table() if table is None else table
    protected = ancestors(root, table) | {root}
    alive = {pid: info for pid, info in table.items() if info.state != "Z" and pid not in protected and pid > 1}
    members: Set[int] = {pid for pid, info in alive.items() if info.ppid == root}
    if tag is not None:
        members |= {pid for pid in alive if pid not in members and carries_tag(pid, tag)}
    while True:  # close over children, and over groups and sessions led by a member
        leaders = {pid for pid in members if alive[pid].pgid == pid or alive[pid].sid == pid}
        grown = {pid for pid, info in alive.items() if pid not in members
                 and (info.ppid in members or info.pgid in leaders or info.sid in leaders)}
        if not grown:
            return {pid: alive[pid] for pid in members}
        members |= grown


def name_process(pid: int, name: str) -> None:
    """Name process ``pid`` (just started) in the line :class:`StopOnSignal` writes when it ends it, e.g.
    ``"the simulator of method-fedavg-seed0"``; unnamed processes are named by their command lines."""
    info = read_process(pid)
    if info is not None:
        _NAMES[(pid, info.start)] = name


def command_name(pid: int) -> str:
    """A short name of process ``pid`` from its command line, in backquotes: the program (a Python script's or
    module's name, not the interpreter's) and its sub-command, e.g. `nvflare simulator`, `simulator_worker`; the
    kernel's name of the program where the command line is gone (a process already exiting has none); ``process
    PID`` if neither can be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        words = []
    if not words:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                comm = f.read().decode(errors="replace").split("(", 1)[1].rsplit(")", 1)[0]
        except (OSError, IndexError):
            return f"process {pid}"
        return f"`{comm}`" if comm else f"process {pid}"
    program, rest = os.path.basename(words[0]), words[1:]
    if _PYTHON.fullmatch(program):
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            rest = rest[1:]  # interpreter options
        if rest[:1] == ["-m"] and len(rest) > 1:
            program, rest = rest[1].rsplit(".", 1)[-1], rest[2:]
        elif rest[:1] == ["-c"]:
            program, rest = "python -c", []
        elif rest:
            program, rest = os.path.basename(rest[0]), rest[1:]
    if rest and not rest[0].startswith("-") and "/" not in rest[0]:
        program += f" {rest[0]}"
    return f"`{program}`"


def _signal(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to process ``pid`` if it is still the one started at ``start``; whether it was sent."""
    if not is_running(pid, start):
        return False
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def end_process_tree(root: Optional[int] = None, tag: Optional[str] = None, grace_s: float = 5.0,
                     kill_wait_s: float = 5.0, poll_s: float = 0.1) -> Tuple[Dict[int, ProcessInfo], List[int]]:
    """End command ``root``'s process tree (:func:`process_tree`): SIGTERM to every member at once, SIGKILL to what
    still runs after ``grace_s`` seconds (at once when ``grace_s`` is 0). The tree is read again at every poll, so a
    process started meanwhile (a thread of the command starting the next simulator) is ended too.

    Args:
        root: the command's pid (default: this process).
        tag: its :func:`tree_tag` (see :func:`process_tree`).
        grace_s: seconds the processes get to end on SIGTERM.
        kill_wait_s: seconds to wait for them to go after SIGKILL.
        poll_s: seconds between readings of the tree.

    Returns:
        ``(ended, left)``: every process signalled (pid -> its :class:`ProcessInfo` when first seen), and the pids
        still running at the end (a process in uninterruptible sleep can outlast SIGKILL for a while).
    """
    root = os.getpid() if root is None else root
    ended: Dict[int, ProcessInfo] = {}
    sent: Dict[int, int] = {}  # pid -> the last signal sent to it
    sig = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
    deadline = time.monotonic() + grace_s
    while True:
        tree = process_tree(root, tag)
        if not tree:
            return ended, []
        for pid, info in tree.items():
            if pid not in ended:
                ended[pid] = info
                if (pid, info.start) not in _NAMES:
                    _NAMES[(pid, info.start)] = command_name(pid)  # read now: the command line goes with the process
            if sent.get(pid) != sig and _signal(pid, info.start, sig):
                sent[pid] = sig
        if time.monotonic() >= deadline:
            if sig == signal.SIGKILL:
                return ended, sorted(tree)
            sig, deadline = signal.SIGKILL, time.monotonic() + kill_wait_s
            continue
        time.sleep(poll_s)


def describe_ended(ended: Dict[int, ProcessInfo], limit: int = 6) -> str:
    """``ended`` (from :func:`end_process_tree`) in words: each process at the top of what was ended (its parent
    not among them) with how many ended under it (its descendants, its group's and session's members), e.g.
    ``the simulator of method-fedavg-seed0 (pid 1234 and 5 processes under it)``; at most ``limit`` of them named."""
    def above(pid: int) -> Optional[int]:
        info = ended[pid]
        if info.ppid in ended:
            return info.ppid
        for leader in (info.pgid, info.sid):
            if leader != pid and leader in ended:
                return leader
        return None

    counts: Dict[int, int] = {}
    for pid in ended:
        top, seen = pid, {pid}
        while above(top) is not None and above(top) not in seen:
            top = above(top)
            seen.add(top)
        counts[top] = counts.get(top, 0) + (top != pid)
    parts = []
    for pid in sorted(counts)[:limit]:
        under = counts[pid]
        name = _NAMES.get((pid, ended[pid].start)) or f"process {pid}"
        below = f" and {under} process{'es' if under > 1 else ''} under it" if under else ""
        parts.append(f"{name} (pid {pid}{below})")
    if len(counts) > limit:
        parts.append(f"{len(counts) - limit} more")
    return ", ".join(parts)


def stopping() -> Optional[int]:
    """The signal a :class:`StopOnSignal` of this process is stopping the command for, else None: code that turns
    a failure into a message (a simulator that ended with an error because its processes were ended) raises
    :class:`Stopped` instead while the command stops."""
    return _STOPPING[1] if _STOPPING is not None and _STOPPING[0] == os.getpid() else None


def raise_if_stopping() -> None:
    """Raise :class:`Stopped` while a :class:`StopOnSignal` of this process stops the command: called before a
    command starts a process or a run, in any thread (a thread of ``fedseg bench --parallel`` taking its next run while
    the main thread handles the signal)."""
    signum = stopping()
    if signum is not None:
        raise Stopped(signum)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread of a command that :class:`StopOnSignal` stops, once its processes have ended, so
    that the command unwinds (its ``finally`` blocks run). A KeyboardInterrupt: code that lets a Ctrl-C through lets
    this through too.

    Attributes:
        signum: the signal that stopped the command.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _write_stderr(line: str) -> None:
    """``line`` to file descriptor 2 directly: a signal handler may run while the main thread is inside
    ``sys.stderr``'s own buffer code, which is not reentrant."""
    try:
        os.write(2, (line.rstrip("\n") + "\n").encode(errors="replace"))
    except OSError:
        pass


class StopOnSignal(contextlib.ContextDecorator):
    """While active (a ``with`` block, or a decorated ``main``), SIGTERM or SIGINT end every process the command
    started, then stop the command.

    On the first of those signals, in the command's main thread: the command's process tree is ended
    (:func:`end_process_tree`), one line goes to stderr (``COMMAND: stopped by SIGTERM; ended the simulator of
    method-fedavg-seed0 (pid 1234 and 5 processes under it)``), and :class:`Stopped` is raised where the main thread
    was, so the command unwinds. Leaving the block, the tree is ended again (what was started while unwinding) and
    ``SystemExit(128 + signal number)`` is raised, also when the command swallowed :class:`Stopped`. Should unwinding
    take over ``unwind_s`` seconds (threads still waiting for something), the process ends the tree once more and
    exits with that status at once. Later signals are ignored while the first one is handled.

    A signal ignored when the block is entered stays ignored. Inactive (a plain context) outside the main thread, and
    inside another StopOnSignal of the same process (that one guards the whole tree). A process forked from the
    command (multiprocessing) that receives one of the signals ends as if it had no handler.

    Args:
        command: the command's name at the start of its line, e.g. ``"fedseg bench"``.
        grace_s: seconds the processes get to end on SIGTERM before SIGKILL.
        unwind_s: seconds the command gets to unwind after its processes ended.
    """

    def __init__(self, command: str, grace_s: float = 5.0, unwind_s: float = 30.0):
        self.command = command
        self.grace_s = grace_s
        self.unwind_s = unwind_s
        self.signum: Optional[int] = None
        self._active = False

    def _recreate_cm(self) -> "StopOnSignal":
        """A fresh instance for each call of a decorated function (ContextDecorator's hook)."""
        return type(self)(self.command, self.grace_s, self.unwind_s)

    def __enter__(self) -> "StopOnSignal":
        global _ACTIVE
        if _ACTIVE is not None or threading.current_thread() is not threading.main_thread():
            return self
        self._pid = os.getpid()
        self._tag = tree_tag(self._pid)
        self._previous_env = os.environ.get(TREE_ENV)
        # a signal the command was started ignoring stays ignored (SIGINT of a job a script runs in the background)
        self._previous_handlers = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS
                                   if signal.getsignal(sig) is not signal.SIG_IGN}
        os.environ[TREE_ENV] = " ".join(filter(None, [self._previous_env, self._tag]))
        self._active, _ACTIVE = True, self
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        global _ACTIVE
        if not self._active:
            return False
        try:
            if self.signum is not None:
                end_process_tree(self._pid, self._tag, self.grace_s)  # what started while the command unwound
                raise SystemExit(128 + self.signum)
        finally:
            for sig, handler in self._previous_handlers.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
            if self._previous_env is None:
                os.environ.pop(TREE_ENV, None)
            else:
                os.environ[TREE_ENV] = self._previous_env
            self._active, _ACTIVE = False, None
        return False

    def _handle(self, signum: int, frame) -> None:
        if os.getpid() != self._pid:  # a fork of the command that inherited the handler: end as without it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.signum is not None:
            return
        global _STOPPING
        self.signum, _STOPPING = signum, (self._pid, signum)
        ended, left = end_process_tree(self._pid, self._tag, self.grace_s)
        _write_stderr(self.summary(signum, ended, left))
        threading.Thread(target=self._exit_if_still_unwinding, name="StopOnSignal", daemon=True).start()
        raise Stopped(signum)

    def summary(self, signum: int, ended: Dict[int, ProcessInfo], left: Iterable[int] = ()) -> str:
        """The one line written when signal ``signum`` stopped the command and ``ended`` were ended."""
        line = f"{self.command}: stopped by {signal.Signals(signum).name}; "
        line += f"ended {describe_ended(ended)}" if ended else "no process it started was running"
        left = list(left)
        return line + (f"; still running after SIGKILL: pid {', '.join(map(str, left))}" if left else "")

    def _exit_if_still_unwinding(self) -> None:
        time.sleep(self.unwind_s)
        end_process_tree(self._pid, self._tag, grace_s=0)
        _write_stderr(f"{self.command}: still unwinding {self.unwind_s:g} s after {signal.Signals(self.signum).name}; "
                      "exiting now")
        os._exit(128 + self.signum)
