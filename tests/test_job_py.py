"""``jobs/job.py``: a method's recipe run in NVFlare's SimEnv from the README's line, its export, its errors.

The README's line runs for real as the shared run ``graphfedseg_patch3d`` (tests/sim_utils.py): the line as the README
writes it, with the options of that configuration added after it (argparse keeps the last value: two sites, the tiny
profile, one round, built-in prostate volumes on 3-D patches), in a fresh folder with a fresh workspace. Its readers
here check what job.py did (the allow list it wrote, the report it printed, the tracking); test_volume_runs.py checks
the volume run itself.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest

from sim_utils import GRAPHFEDSEG_PATCH3D, SimRun, run_fresh

REPO = Path(__file__).resolve().parents[1]
JOB_PY = REPO / "jobs" / "job.py"
#: the options that make the README's line the graphfedseg_patch3d configuration (sim_utils.GRAPHFEDSEG_PATCH3D)
PATCH3D_OPTIONS = ["-n", "2", "--profile", "tiny", "--rounds", "1", "--family", "prostate3d",
                   "--set", "local_epochs=1", "spatial_mode=patch"]


def readme_job_line() -> list:
    """The README's ``python jobs/job.py <method> --env sim ...`` line, as argv (its trailing comment dropped)."""
    lines = [line.strip() for line in (REPO / "README.md").read_text().splitlines()
             if line.strip().startswith("python jobs/job.py ") and "--env sim" in line]
    assert len(lines) == 1, f"expected one `python jobs/job.py ... --env sim` line in README.md, found {lines}"
    return shlex.split(lines[0], comments=True)


def load_job_py():
    """jobs/job.py as a module, without writing __pycache__ into the repository."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec = importlib.util.spec_from_file_location("fedseg_job_py", JOB_PY)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.dont_write_bytecode = before


def readme_sim_run(root: Path):
    """The shared run ``graphfedseg_patch3d``: the README's line (+ :data:`PATCH3D_OPTIONS`) in a fresh folder."""
    argv = readme_job_line()
    assert argv[:2] == ["python", "jobs/job.py"], argv
    method = argv[2]
    cmd = [sys.executable, REPO / argv[1], *argv[2:], *PATCH3D_OPTIONS, "-w", root / "ws"]
    workspace = root / "ws" / method  # SimEnv's workspace: <workspace root>/<job name>

    def simulate() -> SimRun:
        proc = run_fresh(cmd, workspace, root / "job_py.log", cwd=root / "fresh_folder")
        assert proc.returncode == 0, proc.stdout[-5000:]
        (report_path,) = workspace.rglob("report.json")
        report = json.loads(report_path.read_text()) | {"_path": str(report_path), "_log": proc.stdout}
        return SimRun("graphfedseg_patch3d", GRAPHFEDSEG_PATCH3D, None, workspace, report)

    return simulate


# ------------------------------------------------------------------------------------------ the README's line
@pytest.mark.shared_runs("graphfedseg_patch3d")
def test_readme_line_runs_the_recipe_in_a_fresh_simenv_workspace(shared_runs):
    from fedseg.fl.component_policy import class_allow_list

    run = shared_runs("graphfedseg_patch3d")
    assert readme_job_line()[2] == run.report["method"] == "graphfedseg"
    log = run.report["_log"]
    # the recipe put fedseg's allow list into the simulator workspace (nothing was prepared: run_fresh removed it)
    resources = json.loads((run.workspace / "local" / "resources.json").read_text())
    assert resources["class_allow_list"] == class_allow_list()
    assert "ComponentNotAuthorized" not in log and "not in allow_list" not in log
    # then job.py printed what `fedseg summarise <result>` prints for it
    assert f"job result: {run.workspace}" in log
    assert "graphfedseg — final global model (test split)" in log and "graphfedseg — final personalized model" in log
    assert f"report:  {run.report['_path']}" in log
    assert sorted(run.report["clients"]) == list(run.sites) and len(run.report["rounds"]) == 1


@pytest.mark.shared_runs("graphfedseg_patch3d")
def test_tensorboard_tracking_has_every_site_s_curves_and_final_metrics(shared_runs):
    """TensorBoard through NVFlare's add_experiment_tracking: per site, the round metrics and the final test metrics."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = shared_runs("graphfedseg_patch3d")
    for site in run.sites:
        (folder,) = [p for p in (run.run_dir / "tb_events").iterdir() if p.name == site]
        events = EventAccumulator(str(folder))
        events.Reload()
        tags = set(events.Tags()["scalars"])
        assert {"train_loss", "test_global/dice", "test_personalized/dice"} <= tags, tags
        # class and region suffixes as sub-names (MLflow refuses ':')
        assert any(t.startswith("test_global/dice/") for t in tags) and not any(":" in t for t in tags), tags


# ------------------------------------------------------------------------------------------ export and errors
def _files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_readme_line_with_the_run_s_options_is_the_shared_run_s_job(tmp_path, capsys):
    """The README's line with PATCH3D_OPTIONS exports exactly the job graphfedseg_patch3d used to export."""
    from fedseg.recipes.export import export_job

    job = load_job_py()
    assert job.main([*readme_job_line()[2:], *PATCH3D_OPTIONS, "--export", str(tmp_path / "a")]) == 0
    spec = GRAPHFEDSEG_PATCH3D
    expected = export_job(spec.method, tmp_path / "b", profile=spec.profile, **spec.options)
    assert _files(tmp_path / "a" / "graphfedseg") == _files(expected)
    assert "exported graphfedseg ->" in capsys.readouterr().out


def test_export_is_fedseg_export_with_the_method_s_own_options(tmp_path):
    from fedseg.recipes.export import export_job

    job = load_job_py()
    assert job.main(["graphfedseg", "--alpha", "0.5", "--uncertainty", "mc_dropout", "--export", str(tmp_path / "a")]) == 0
    expected = export_job("graphfedseg", tmp_path / "b", alpha=0.5, uncertainty="mc_dropout")
    assert _files(tmp_path / "a" / "graphfedseg") == _files(expected)
    # NVFlare's own spelling of the export options
    assert job.main(["fedavg", "--profile", "tiny", "--export", "--export-dir", str(tmp_path / "c")]) == 0
    assert _files(tmp_path / "c" / "fedavg") == _files(export_job("fedavg", tmp_path / "d", profile="tiny"))


def test_mistakes_are_one_line_naming_the_fix(tmp_path, capsys):
    import yaml

    job = load_job_py()
    project = yaml.safe_load((REPO / "poc_workspace" / "project.yml").read_text())
    project["builders"] = [b for b in project["builders"] if b["path"] != "fedseg.deploy.SitePolicyBuilder"]
    (tmp_path / "project.yml").write_text(yaml.safe_dump(project))
    cases = [
        (["fedavg", "--env", "prod"], "needs --startup-kit"),
        (["fedavg", "--env", "prod", "--startup-kit", str(tmp_path / "no_kit")], "does not exist"),
        (["fedavg", "--env", "poc", "--project", str(tmp_path / "project.yml")], "fedseg.deploy.SitePolicyBuilder"),
        (["fedavg", "--set", "no_such_key=1", "--export", str(tmp_path / "x")], "unknown train_config keys"),
    ]
    if importlib.util.find_spec("mlflow") is None:
        cases.append((["fedavg", "--tracking", "mlflow", "--export", str(tmp_path / "x")], "pip install mlflow"))
    for argv, fix in cases:
        assert job.main(argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("job.py: ") and fix in err and "\n" not in err, (argv, err)


@pytest.mark.parametrize("method", ["fedavgm", "fedadam", "fedavg", "graphfedseg"])
def test_every_method_s_command_line_builds(method):
    """Each method's own options and the server-step options share one command line (FedAvgM's own ``server_lr`` is
    its recipe's option, not the generic server step's)."""
    parser = load_job_py().build_parser(method)
    assert parser.parse_args([method]).method == method
