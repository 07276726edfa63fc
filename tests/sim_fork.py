"""NVFlare's simulator and the fedseg CLI started from a process that has imported torch, MONAI and fedseg once.

``nvflare simulator`` is a fresh interpreter that forks the simulated server, which then imports torch, MONAI and
the job's server components (fedseg's controller, the network the persistor builds, the strategy): ~5 s of CPU a
run on a 2-core machine, a quarter of a tiny 3-site run. Here the simulator's main process is instead a fork of a
*launcher* (multiprocessing's forkserver, started once per session with those modules imported, :data:`PRELOAD`),
so the server it forks starts with them in memory. What runs is NVFlare's own simulator entry
(``nvflare.private.fed.app.simulator.simulator``: the version check, the parser and ``run_simulator`` that the
``nvflare simulator`` command calls), on the same arguments; the sites are NVFlare's own fresh ``simulator_worker``
processes as before. ``python -m fedseg ARGV`` (``fedseg bench``, ``fedseg run``) is ``fedseg.cli.main(ARGV)`` in a
fork the same way. Output goes to a log file, never into the session.

``FEDSEG_TEST_SIMULATOR_CLI=1`` runs the command lines instead (fresh processes), e.g. to tell a difference apart.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from fedseg.bench.simulator import SITE_START_FAILURE, failed_site_start
from fedseg.fl.component_policy import prepare_simulator_workspace

#: what the launcher imports once: torch and MONAI, NVFlare's simulator, and every module the simulated server of a
#: fedseg job imports (the controller, the audit filter, the persistor's networks, the strategies, the widgets)
PRELOAD = (
    "torch", "monai",
    "nvflare.private.fed.app.simulator.simulator", "nvflare.private.fed.app.utils",
    "nvflare.app_opt.pt.file_model_persistor", "nvflare.app_opt.pt.file_model_locator",
    "nvflare.app_opt.tracking.tb.tb_receiver", "nvflare.app_common.widgets.validation_json_generator",
    "nvflare.app_common.widgets.metrics_artifact_writer", "nvflare.app_common.widgets.convert_to_fed_event",
    "fedseg.fl.controller", "fedseg.fl.audit", "fedseg.networks.unet", "fedseg.foundation.unetr",
    "fedseg.foundation.networks", "fedseg.strategies.fedavg", "fedseg.strategies.graphfedseg",
    "fedseg.strategies.fedevi", "fedseg.strategies.pathfl", "fedseg.strategies.fedefm", "fedseg.strategies.scaffold",
    "fedseg.cli", "fedseg.bench.bench", "sim_fork",
)

_LAUNCHER = None


def use_cli() -> bool:
    """``FEDSEG_TEST_SIMULATOR_CLI=1``: start ``nvflare simulator`` processes instead of forks of the launcher."""
    return os.environ.get("FEDSEG_TEST_SIMULATOR_CLI", "0") not in ("", "0")


def _launcher():
    """multiprocessing's forkserver context with :data:`PRELOAD` (started at its first use, once per session)."""
    global _LAUNCHER
    if _LAUNCHER is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        _LAUNCHER = ctx
    return _LAUNCHER


def _redirect(log: str, env: Dict[str, str]) -> None:
    """In a fork of the launcher: stdin from /dev/null, stdout and stderr to ``log``, exactly ``env`` as the
    environment (the processes it starts inherit it), torch's threads as ``OMP_NUM_THREADS`` says."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.environ.clear()
    os.environ.update(env)
    import torch

    # the launcher ran no parallel torch op: this process makes its own thread pool, of the size asked for
    torch.set_num_threads(max(1, int(env.get("OMP_NUM_THREADS") or 1)))
    multiprocessing.set_start_method("fork", force=True)  # what NVFlare's simulator forks (its server) is a fork of this


def _exit_with(main, argv: List[str], log: str, env: Dict[str, str]) -> None:
    """In a fork of the launcher: ``main(argv)`` with :func:`_redirect`; exits with its status (an exception's
    traceback goes to the log, status 1)."""
    status = 1
    try:
        _redirect(log, env)
        status = int(main(argv) or 0)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - written to the log, which the caller reads
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def simulator_main(argv: List[str]) -> int:
    """What ``nvflare simulator ARGV`` runs: NVFlare's version check, its parser, ``run_simulator``."""
    from nvflare.private.fed.app.simulator.simulator import define_simulator_parser, run_simulator
    from nvflare.private.fed.app.utils import version_check

    version_check()
    parser = argparse.ArgumentParser(prog="nvflare simulator")
    define_simulator_parser(parser)
    return run_simulator(parser.parse_args(argv))


def fedseg_main(argv: List[str]) -> int:
    """What ``python -m fedseg ARGV`` runs."""
    from fedseg.cli import main

    main(argv)
    return 0


def call_main(argv: List[str]) -> int:
    """``argv[0]`` is ``"module:function"`` (a test module's): ``function(argv[1:])``, its return the exit status."""
    import importlib

    module, function = argv[0].split(":")
    return getattr(importlib.import_module(module), function)(argv[1:])


_CALL_LINE = [sys.executable, "-c", "import importlib, sys; sys.path.insert(0, {tests!r}); m, f = sys.argv[1].split(':'); "
              "sys.exit(getattr(importlib.import_module(m), f)(sys.argv[2:]))".format(tests=str(Path(__file__).parent))]

#: the commands a fork of the launcher can run, and the command line each stands for
COMMANDS = {"simulator": (simulator_main, ["nvflare", "simulator"]),
            "fedseg": (fedseg_main, [sys.executable, "-m", "fedseg"]),
            "call": (call_main, _CALL_LINE)}


class Launched:
    """A command of :data:`COMMANDS` on ``argv``, its output in ``log``: a fork of the launcher, or with :func:`use_cli`
    the command line it stands for (a fresh process)."""

    def __init__(self, command: str, argv: Sequence[str], log: Path, env: Mapping[str, str]):
        main, line = COMMANDS[command]
        self.command = [*line, *map(str, argv)]
        self.log = Path(log)
        if use_cli():
            with open(self.log, "w") as out:
                self._proc = subprocess.Popen(self.command, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
        else:
            self._proc = _launcher().Process(target=_exit_with, name=command,
                                             args=(main, list(map(str, argv)), str(self.log), dict(env)))
            self._proc.start()
        self.pid = self._proc.pid

    def poll(self) -> Optional[int]:
        """The exit status, or None while it runs."""
        if isinstance(self._proc, subprocess.Popen):
            return self._proc.poll()
        return self._proc.exitcode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        if isinstance(self._proc, subprocess.Popen):
            try:
                return self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        self._proc.join(timeout)
        return self._proc.exitcode

    def kill(self) -> None:
        """SIGKILL the process and every process below it (a simulator's server, its site processes in their own
        sessions)."""
        kill_tree(self.pid)
        self.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""


def Simulator(argv: Sequence[str], log: Path, env: Mapping[str, str]) -> Launched:
    """``nvflare simulator ARGV`` (started, not waited for)."""
    return Launched("simulator", argv, log, env)


def run_simulator(argv: Sequence[str], workspace: Path, log: Path, env: Mapping[str, str], timeout: float,
                  retries: int = 2, poll_s: float = 1.0) -> subprocess.CompletedProcess:
    """``nvflare simulator ARGV`` in a fresh ``workspace`` (its component allow list written first), as
    ``fedseg.bench.simulator.run_simulator_command`` runs the command: a run whose site process died at start on a
    taken port is stopped at once and started again, at most ``retries`` times. Returns the exit status and the
    output (``stdout``).

    Raises:
        subprocess.TimeoutExpired: the run took longer than ``timeout`` seconds (it is killed).
        RuntimeError: a site failed to start on every try.
    """
    import shutil

    workspace = Path(workspace)
    for _ in range(retries + 1):
        if workspace.exists():
            shutil.rmtree(workspace)
        prepare_simulator_workspace(workspace)
        deadline = time.monotonic() + timeout
        sim = Simulator(argv, log, env)
        failed = None
        while sim.wait(poll_s) is None:
            failed = failed_site_start(workspace)
            if failed or time.monotonic() > deadline:
                sim.kill()
                if not failed:
                    raise subprocess.TimeoutExpired(sim.command, timeout, sim.output())
                break
        text = sim.output()
        if not failed and sim.poll() != 0 and SITE_START_FAILURE in text:
            failed = "server"  # the server's port was taken between its pick and its bind: the run never started
        if not failed:
            return subprocess.CompletedProcess(sim.command, sim.poll(), text, "")
    raise RuntimeError(f"a site could not start on {retries + 1} tries ({SITE_START_FAILURE}): {' '.join(sim.command)}")


def run(command: str, argv: Sequence[str], log: Path, env: Mapping[str, str], timeout: float) -> int:
    """A command of :data:`COMMANDS` (``"fedseg"``: ``python -m fedseg ARGV``; ``"call"``: a test module's
    function), its output in ``log``; returns its exit status.

    Raises:
        subprocess.TimeoutExpired: it took longer than ``timeout`` seconds (it is killed, with what it started).
    """
    proc = Launched(command, argv, log, env)
    if proc.wait(timeout) is None:
        proc.kill()
        raise subprocess.TimeoutExpired(proc.command, timeout, proc.output())
    return proc.poll()


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid`` and every process below it, whatever session they started (NVFlare starts its
    simulator and its sites in sessions of their own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
