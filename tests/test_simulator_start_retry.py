"""A site process of NVFlare's simulator that dies at start on a taken port leaves the job waiting for its tasks
until the task timeout; ``fedseg.bench.simulator.run_simulator_command`` stops such a run at once and starts it again
in a fresh workspace. Checked with a stand-in command that behaves like the simulator's site logs."""

from __future__ import annotations

import sys
import textwrap

import pytest

from fedseg.bench.simulator import SITE_START_FAILURE, failed_site_start, run_simulator_command

#: writes site logs into the workspace (argv[1]); the first ``fail`` runs (counted in argv[2]) fail on a taken port:
#: argv[4] "site": site-2 logs it and the run hangs as the real simulator does; "server": the run exits with it.
#: Later runs finish with a report
STAND_IN = textwrap.dedent('''
    import pathlib, sys, time
    ws, counter, fail = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    for site in ("site-1", "site-2"):
        (ws / site).mkdir(parents=True, exist_ok=True)
        (ws / site / "log.txt").write_text("starting\\n")
    if n <= fail and sys.argv[4] == "site":
        (ws / "site-2" / "log.txt").write_text("OSError: [Errno 98] %s\\n")
        time.sleep(60)
    if n <= fail and sys.argv[4] == "server":
        sys.exit("OSError: [Errno 98] %s")
    (ws / "server").mkdir(exist_ok=True)
    (ws / "server" / "report.json").write_text("{}")
''' % (SITE_START_FAILURE, SITE_START_FAILURE))


def _cmd(tmp_path, fail, who="site"):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    return [sys.executable, str(script), str(tmp_path / "ws"), str(tmp_path / "tries"), str(fail), who]


def test_a_site_that_cannot_start_restarts_the_run(tmp_path):
    proc = run_simulator_command(_cmd(tmp_path, fail=1), tmp_path / "ws", {}, timeout=30, poll_s=0.2)
    assert proc.returncode == 0
    assert (tmp_path / "tries").read_text() == "2"  # stopped at once, not after the 60 s hang, and run again
    assert (tmp_path / "ws" / "server" / "report.json").is_file()
    assert (tmp_path / "ws" / "local" / "resources.json").is_file()  # the fresh workspace has its allow list
    assert failed_site_start(tmp_path / "ws") is None


def test_a_server_that_cannot_bind_restarts_the_run(tmp_path):
    proc = run_simulator_command(_cmd(tmp_path, fail=1, who="server"), tmp_path / "ws", {}, timeout=30, poll_s=0.2)
    assert proc.returncode == 0 and (tmp_path / "tries").read_text() == "2"
    assert (tmp_path / "ws" / "server" / "report.json").is_file()


def test_any_other_failure_is_returned_as_it_is(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys; sys.exit('something else broke')")
    proc = run_simulator_command([sys.executable, str(script)], tmp_path / "ws", {}, timeout=30, poll_s=0.2)
    assert proc.returncode == 1 and "something else broke" in proc.stderr


def test_a_site_that_never_starts_fails_after_the_retries(tmp_path):
    with pytest.raises(RuntimeError, match=SITE_START_FAILURE):
        run_simulator_command(_cmd(tmp_path, fail=9), tmp_path / "ws", {}, timeout=30, retries=1, poll_s=0.2)
    assert (tmp_path / "tries").read_text() == "2"
