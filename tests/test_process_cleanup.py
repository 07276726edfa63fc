"""A command stopped by SIGTERM or SIGINT ends every process it started (``fedseg.processes.StopOnSignal``): a tiny
command with a tree of children in several sessions, then ``fedseg bench`` with a running NVFlare simulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, Tuple

import pytest

from fedseg.processes import (TREE_ENV, StopOnSignal, command_name, is_running, process_tree, read_process,
                              tree_tag)

REPO = Path(__file__).resolve().parents[1]

#: a command whose tree has every kind of member: a child in its own session (named), a child with a grandchild
#: in its group, a child that ignores SIGTERM, an orphan re-parented away from it (found by the environment tag
#: only) and a fork of the command (multiprocessing, as NVFlare's in-process simulator) with a worker in its own
#: session; it writes their pids, then sleeps until stopped, and marks that its ``finally`` ran
TREE_COMMAND = textwrap.dedent('''
    import json, multiprocessing, subprocess, sys, time
    from pathlib import Path
    from fedseg.processes import StopOnSignal, name_process

    def fork_with_worker(queue):
        worker = subprocess.Popen(["sleep", "600"], start_new_session=True)
        queue.put(worker.pid)
        time.sleep(600)

    @StopOnSignal("tree-test", grace_s=2.0)
    def main(out):
        own_session = subprocess.Popen(["sleep", "600"], start_new_session=True)
        name_process(own_session.pid, "the sleeper")
        with_grandchild = subprocess.Popen(
            [sys.executable, "-c", "import subprocess, time; p = subprocess.Popen(['sleep', '600']); "
             "print(p.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        grandchild = int(with_grandchild.stdout.readline())
        stubborn = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        stubborn.stdout.readline()
        orphan = int(subprocess.run(
            [sys.executable, "-c", "import subprocess; print(subprocess.Popen(['sleep', '600'], start_new_session=True, "
             "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"], capture_output=True, text=True,
            check=True).stdout)
        queue = multiprocessing.get_context("fork").Queue()
        fork = multiprocessing.get_context("fork").Process(target=fork_with_worker, args=(queue,))
        fork.start()
        pids = {"own_session": own_session.pid, "with_grandchild": with_grandchild.pid, "grandchild": grandchild,
                "stubborn": stubborn.pid, "orphan": orphan, "fork": fork.pid, "fork_worker": queue.get(timeout=60)}
        Path(out + ".part").write_text(json.dumps(pids))
        Path(out + ".part").rename(out)
        try:
            time.sleep(600)
        finally:
            Path(out + ".unwound").write_text("yes")

    main(sys.argv[1])
''')


def _identities(pids) -> Dict[int, int]:
    """pid -> start time of each running process of ``pids`` (tells them apart from later ones with the same pid)."""
    return {pid: info.start for pid in pids if (info := read_process(pid)) is not None and info.state != "Z"}


def _running(identities: Dict[int, int]) -> Dict[int, int]:
    return {pid: start for pid, start in identities.items() if is_running(pid, start)}


def _wait_exit(proc: subprocess.Popen, err: Path, timeout: float) -> Tuple[int, str]:
    """The exit status of ``proc`` within ``timeout`` seconds, and what it wrote to its stderr file ``err`` (a file,
    not a pipe: a process left running would hold a pipe open)."""
    return proc.wait(timeout=timeout), err.read_text()


def _stop(proc: subprocess.Popen, identities: Dict[int, int]) -> None:
    """SIGKILL this test's command and what is left of its processes (a failed test must not leave them behind)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid, start in _running(identities).items():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_the_whole_tree(tmp_path, sig):
    """Every member of the tree ends (the one ignoring SIGTERM by SIGKILL), the command unwinds, exits with 128 + the
    signal and writes one line naming the members at the top of the tree."""
    script, out, err = tmp_path / "tree_command.py", tmp_path / "pids.json", tmp_path / "stderr.txt"
    script.write_text(TREE_COMMAND)
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    identities: Dict[int, int] = {}
    try:
        deadline = time.monotonic() + 60
        while not out.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert out.is_file(), f"the command never started its tree (exit {proc.poll()})"
        pids = json.loads(out.read_text())
        identities = _identities(pids.values())
        assert len(identities) == len(pids), f"not all started: {pids}"
        before = process_tree(proc.pid, tree_tag(proc.pid))
        assert pids["orphan"] in before and read_process(pids["orphan"]).ppid != proc.pid  # by its tag only
        identities.update(_identities(before))

        os.kill(proc.pid, sig)
        rc, text = _wait_exit(proc, err, 30)

        assert rc == 128 + sig
        assert not _running(identities), f"left running: {_running(identities)}"
        assert (tmp_path / "pids.json.unwound").is_file()  # the command unwound: its finally block ran
        lines = text.strip().splitlines()
        assert len(lines) == 1, text
        line = lines[0]
        assert line.startswith(f"tree-test: stopped by {signal.Signals(sig).name}; ended "), line
        assert f"the sleeper (pid {pids['own_session']})" in line
        assert f"(pid {pids['with_grandchild']} and 1 process under it)" in line
        assert f"(pid {pids['fork']} and 1 process under it)" in line  # the fork did not write a line of its own
        for key in ("stubborn", "orphan"):
            assert f"(pid {pids[key]})" in line
    finally:
        _stop(proc, identities)


def test_nothing_running(tmp_path):
    """A command with no process of its own still stops with the status and says so."""
    script = tmp_path / "idle.py"
    script.write_text("import sys, time\nfrom fedseg.processes import StopOnSignal\n"
                      "with StopOnSignal('idle'):\n    print('ready', flush=True)\n    time.sleep(600)\n")
    with open(tmp_path / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        rc, err = _wait_exit(proc, tmp_path / "stderr.txt", 30)
        assert rc == 143
        assert err.strip() == "idle: stopped by SIGTERM; no process it started was running"
    finally:
        _stop(proc, {})


def test_inactive_inside_another_and_restores():
    """Nested in the same process the inner one does nothing; leaving, the handlers and the environment are restored."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    env_before = os.environ.get(TREE_ENV)
    with StopOnSignal("outer") as outer:
        assert signal.getsignal(signal.SIGTERM) == outer._handle
        assert os.environ[TREE_ENV].split()[-1] == tree_tag()
        with StopOnSignal("inner") as inner:
            assert not inner._active and signal.getsignal(signal.SIGTERM) == outer._handle
            assert os.environ[TREE_ENV].split().count(tree_tag()) == 1
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert os.environ.get(TREE_ENV) == env_before


def test_command_names(tmp_path):
    """Unnamed processes are named by their program and sub-command, not by the interpreter."""
    (tmp_path / "tool.py").write_text("import time\ntime.sleep(600)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "worker.py").write_text("import time\ntime.sleep(600)\n")
    commands = {"`sleep 600`": ["sleep", "600"],
                "`tool.py simulator`": [sys.executable, "tool.py", "simulator", "-w", "x"],
                "`worker`": [sys.executable, "-u", "-m", "pkg.worker", "--site", "a"]}
    procs = {name: subprocess.Popen(cmd, cwd=tmp_path) for name, cmd in commands.items()}
    try:
        deadline = time.monotonic() + 10  # a command line reads empty for a moment after the exec
        while time.monotonic() < deadline and not all(Path(f"/proc/{p.pid}/cmdline").read_bytes()
                                                      for p in procs.values()):
            time.sleep(0.05)
        assert {name: command_name(p.pid) for name, p in procs.items()} == {name: name for name in procs}
        # ended but not yet reaped: its command line is gone, the kernel's name of its program is left
        procs["`sleep 600`"].kill()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and read_process(procs["`sleep 600`"].pid).state != "Z":
            time.sleep(0.05)
        assert command_name(procs["`sleep 600`"].pid) == "`sleep`"
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


#: an outer command running an inner one (``reproduce.py --run`` running ``fedseg bench``), the inner one with a
#: process in its own session
NESTED_COMMAND = textwrap.dedent('''
    import subprocess, sys, time
    from pathlib import Path
    from fedseg.processes import StopOnSignal

    @StopOnSignal(sys.argv[1])
    def main(out):
        if sys.argv[1] == "outer":
            subprocess.run([sys.executable, __file__, "inner", out])
        else:
            sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
            Path(out).write_text(str(sleeper.pid))
            time.sleep(600)

    main(sys.argv[2])
''')


def test_nested_commands_each_end_their_own(tmp_path):
    """The outer command's signal reaches the inner command, which ends its process and writes its own line."""
    script, out, err = tmp_path / "nested.py", tmp_path / "sleeper.pid", tmp_path / "stderr.txt"
    script.write_text(NESTED_COMMAND)
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script), "outer", str(out)], stdout=subprocess.DEVNULL,
                                stderr=stderr, start_new_session=True)
    identities: Dict[int, int] = {}
    try:
        deadline = time.monotonic() + 60
        while not (out.is_file() and out.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        sleeper = int(out.read_text())
        inner = read_process(sleeper).ppid
        identities = _identities([sleeper, inner])

        proc.send_signal(signal.SIGTERM)
        rc, text = _wait_exit(proc, err, 30)

        assert rc == 143 and not _running(identities)
        inner_line, outer_line = sorted(text.strip().splitlines())
        # the sleeper may be gone by the outer command's SIGTERM before the inner one looks for it, or be exiting
        # (its command line gone, its program's name left)
        assert inner_line in (f"inner: stopped by SIGTERM; ended `sleep 600` (pid {sleeper})",
                              f"inner: stopped by SIGTERM; ended `sleep` (pid {sleeper})",
                              "inner: stopped by SIGTERM; no process it started was running"), text
        assert outer_line == f"outer: stopped by SIGTERM; ended `nested.py inner` (pid {inner} and 1 process under it)"
    finally:
        _stop(proc, identities)


#: a thread of a command (``fedseg bench --parallel``) that comes to start a simulator while the main thread
#: handles the stop signal: it is refused, and the command ends at once
LATE_START_COMMAND = textwrap.dedent('''
    import os, signal, sys, threading, time
    from pathlib import Path
    from fedseg.bench.simulator import run_simulator_command
    from fedseg.processes import StopOnSignal, Stopped

    def late_run(outcome):
        time.sleep(1)
        try:
            run_simulator_command(["sleep", "600"], Path(sys.argv[1]), dict(os.environ), timeout=600)
            outcome.append("started")
        except Stopped:
            outcome.append("refused")

    @StopOnSignal("late-start")
    def main():
        outcome = []
        thread = threading.Thread(target=late_run, args=(outcome,))
        thread.start()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
        finally:
            thread.join()
            print(outcome[0], flush=True)

    main()
''')


def test_no_simulator_starts_once_stopping(tmp_path):
    script, err = tmp_path / "late_start.py", tmp_path / "stderr.txt"
    script.write_text(LATE_START_COMMAND)
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ws")], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, start_new_session=True)
    try:
        rc, text = _wait_exit(proc, err, 25)  # less than the 30 s after which a command still unwinding is ended
        assert rc == 143, text
        assert proc.stdout.read().strip() == "refused"
        assert text.strip() == "late-start: stopped by SIGTERM; no process it started was running"
    finally:
        _stop(proc, {})


#: jobs/job.py in NVFlare's SimEnv, stopped while the simulator runs. NVFlare's ``simulator_run`` catches the
#: interrupt, ends its processes and returns -9, which ``SimEnv.deploy`` raises as a failed run; the SimEnv here
#: does just that (the simulator's processes are ended in the bench test below)
JOB_PY_COMMAND = textwrap.dedent('''
    import importlib.util, os, signal, sys, time
    sys.argv[1:] = []  # NVFlare's recipe module reads the command line when it is imported
    from nvflare.recipe import SimEnv
    from fedseg.recipes import environments

    class StoppedSimEnv(SimEnv):
        def deploy(self, job):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(60)
            except KeyboardInterrupt:
                raise RuntimeError("Simulation failed with return code -9.")

    environments.sim_env = lambda sites, root, threads=None, gpu=None: StoppedSimEnv(
        clients=list(sites), workspace_root=str(root))
    spec = importlib.util.spec_from_file_location("job_py", JOB_PY)
    job_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job_py)
    sys.exit(job_py.main(["fedavg", "--env", "sim", "-n", "2", "--profile", "tiny", "-w", WORKSPACE]))
''')


def test_job_py_stopped_while_nvflare_s_simulator_runs(tmp_path):
    """The failed run NVFlare makes of the stop is not reported as the job's failure: one line, status 143."""
    script, err = tmp_path / "job_py_command.py", tmp_path / "stderr.txt"
    script.write_text(JOB_PY_COMMAND.replace("JOB_PY", repr(str(REPO / "jobs" / "job.py")))
                      .replace("WORKSPACE", repr(str(tmp_path / "ws"))))
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=stderr,
                                cwd=tmp_path, start_new_session=True)
    try:
        rc, text = _wait_exit(proc, err, 180)
        assert rc == 143, text
        assert [line for line in text.splitlines() if line.startswith("job.py")] == [
            "job.py: stopped by SIGTERM; no process it started was running"], text
        assert "Traceback" not in text, text
    finally:
        _stop(proc, {})


# ----------------------------------------------------------------------------------------- fedseg bench
@pytest.mark.slow
def test_fedseg_bench_sigterm_ends_its_simulator(tmp_path):
    """``fedseg bench --parallel 2`` (3 runs) stopped by SIGTERM while a simulator's sites run: nothing of its tree is
    left, the queued run never starts, the exit status is 143 and stderr has the one line naming the simulators."""
    argv = [sys.executable, "-m", "fedseg", "bench", "--out", str(tmp_path / "bench"), "--family", "polyp",
            "--sites", "site-1", "site-2", "--data-profile", "tiny", "--profile", "tiny", "--methods", "fedavg",
            "--rounds", "50", "--references", "--seeds", "0", "1", "2", "--parallel", "2"]
    err = tmp_path / "stderr.txt"
    with open(tmp_path / "bench.log", "w") as log, open(err, "w") as stderr:
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=stderr, start_new_session=True)
    identities: Dict[int, int] = {}
    try:
        deadline, workers = time.monotonic() + 120, []
        while not workers and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            tree = process_tree(proc.pid)
            identities.update(_identities(tree))
            workers = [pid for pid in tree if command_name(pid) == "`simulator_worker`"]
        assert workers, f"no simulator site started within 120 s (exit {proc.poll()}; {tmp_path / 'bench.log'})"
        identities.update(_identities(process_tree(proc.pid)))

        proc.send_signal(signal.SIGTERM)
        rc, err = _wait_exit(proc, err, 30)

        assert rc == 143, err
        assert not _running(identities), f"left running: {_running(identities)}"
        lines = [line for line in err.splitlines() if line.startswith("fedseg bench: stopped by")]
        assert len(lines) == 1, err
        assert lines[0].startswith("fedseg bench: stopped by SIGTERM; ended the simulator of method-fedavg-seed"), lines
        assert "processes under it" in lines[0]
        assert "seed 2 ..." not in (tmp_path / "bench.log").read_text()  # the queued third run never started
    finally:
        _stop(proc, identities)


#: what in a benchmark script's source says it starts other processes (simulators, benches, POC, subprocesses)
_STARTS_PROCESSES = ("subprocess", "run_simulator", "run_bench", "Popen", "poc_")


def _main_is_wrapped(source: str) -> bool:
    """Whether a script's ``main`` is decorated with :class:`StopOnSignal` (read from its syntax tree)."""
    import ast

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            return any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "StopOnSignal"
                       for d in node.decorator_list)
    return True  # no main: a module, not a command


def test_every_benchmark_command_that_starts_processes_cleans_up():
    """A benchmark script whose ``main`` starts processes ends them on SIGTERM / SIGINT: its ``main`` is wrapped in
    ``StopOnSignal`` (the behaviour itself is tested above on real process trees)."""
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    unwrapped = []
    for script in sorted(root.rglob("*.py")):
        source = script.read_text()
        if "__main__" in source and any(s in source for s in _STARTS_PROCESSES) and not _main_is_wrapped(source):
            unwrapped.append(str(script.relative_to(root)))
    assert not unwrapped, f"benchmark commands that start processes without StopOnSignal on main: {unwrapped}"
