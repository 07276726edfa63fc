"""Every method's recipe in NVFlare's execution environments (``fedseg.recipes.environments``), without running a job.

``SimEnv``: what ``recipe.execute(SimEnv(...))`` does before the simulator starts — the recipe's ``process_env``, then
NVFlare's own deployment steps (its scripts check, its default-policy step) — and whether NVFlare's component
authorizer, reading the simulated workspace's allow list, builds every component of the job. ``PocEnv`` / ``ProdEnv``:
the checks that name the fix before anything starts. Experiment tracking: the receivers the job carries. The jobs run
for real in ``test_job_py.py`` (SimEnv, the README's line), ``test_poc.py`` (PocEnv) and ``test_deploy.py`` (ProdEnv).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from fedseg.recipes import available_methods, get_recipe_class
from fedseg.recipes.environments import ExecEnvError

from job_configs import ResourcesWorkspace, job_components

REPO = Path(__file__).resolve().parents[1]
POC_PROJECT = REPO / "poc_workspace" / "project.yml"
POC_ADMIN = "admin@fedseg.org"


def _exported_components(recipe, out: Path):
    """Every component path of the job the recipe deploys (its configs, as NVFlare writes them)."""
    recipe.export(str(out))
    assert not any(p.suffix == ".py" or p.name == "custom" for p in (out / recipe.name).rglob("*")), "the job carries code"
    configs = list((out / recipe.name).rglob("config_fed_*.json"))
    assert len(configs) == 2, configs
    return [c for config in configs for c in job_components(json.loads(config.read_text()))]


def _one_line(error) -> str:
    message = str(error)
    assert "\n" not in message and message, message
    return message


@pytest.fixture(scope="module")
def tiny_fedavg():
    from fedseg.recipes.fedavg import FedAvgRecipe

    return FedAvgRecipe(profile="tiny")


# ------------------------------------------------------------------------------------------ SimEnv
@pytest.mark.parametrize("method", available_methods())
def test_every_recipe_deploys_in_a_fresh_simenv_workspace(method, tmp_path):
    """The snippet ``Recipe(...).execute(SimEnv(num_clients=2))`` up to the simulator's start: the recipe puts the allow
    list into the fresh workspace, NVFlare's SimEnv keeps it, and every component of the job is allowed by it."""
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer
    from nvflare.recipe import SimEnv
    from nvflare.recipe.utils import collect_non_local_scripts

    from fedseg.fl.component_policy import class_allow_list

    recipe = get_recipe_class(method)(profile="tiny")
    env = SimEnv(num_clients=2, workspace_root=str(tmp_path / "sim"))
    workspace = tmp_path / "sim" / recipe.name
    assert not workspace.exists()
    recipe.process_env(env)  # what Recipe.run does before env.deploy(job)
    # SimEnv.deploy's own steps before the simulator: no script to find, then its default policy where there is none
    assert collect_non_local_scripts(recipe._job) == []
    SimEnv._ensure_default_component_policy(str(workspace))
    resources = json.loads((workspace / "local" / "resources.json").read_text())
    assert resources["class_allow_list"] == class_allow_list()

    authorizer, ws = ComponentPathAuthorizer(), ResourcesWorkspace(workspace / "local" / "resources.json")
    paths = []
    for component in _exported_components(recipe, tmp_path / "job"):
        authorizer.authorize_component_config(component, workspace=ws)  # raises UnsafeComponentError if refused
        paths.append(component["path"])
    assert "fedseg.fl.controller.FedSegController" in paths and "fedseg.fl.site_executor.FedSegSiteExecutor" in paths
    # TensorBoard tracking, added through NVFlare's add_experiment_tracking
    assert "nvflare.app_opt.tracking.tb.tb_receiver.TBAnalyticsReceiver" in paths


def test_a_fresh_simenv_workspace_without_the_recipe_refuses_fedseg(tmp_path):
    """The failure the recipe's process_env prevents: NVFlare's SimEnv alone installs its default list, no fedseg."""
    from nvflare.apis.fl_exception import UnsafeComponentError
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer
    from nvflare.recipe import SimEnv

    workspace = tmp_path / "fedavg"
    SimEnv._ensure_default_component_policy(str(workspace))
    with pytest.raises(UnsafeComponentError, match="not in allow_list"):
        ComponentPathAuthorizer().authorize_component_config(
            {"path": "fedseg.fl.controller.FedSegController", "args": {}},
            workspace=ResourcesWorkspace(workspace / "local" / "resources.json"))


def test_simenv_keeps_a_workspace_s_own_entries(tiny_fedavg, tmp_path):
    from nvflare.recipe import SimEnv

    from fedseg.fl.component_policy import class_allow_list

    resources = tmp_path / "sim" / tiny_fedavg.name / "local" / "resources.json"
    resources.parent.mkdir(parents=True)
    resources.write_text(json.dumps({"format_version": 2, "class_allow_list": ["hospital.tools."], "x": 1}))
    tiny_fedavg.process_env(SimEnv(num_clients=2, workspace_root=str(tmp_path / "sim")))
    data = json.loads(resources.read_text())
    assert data["x"] == 1 and data["class_allow_list"] == class_allow_list(["hospital.tools."])
    resources.write_text("{broken")
    with pytest.raises(ExecEnvError) as e:
        tiny_fedavg.process_env(SimEnv(num_clients=2, workspace_root=str(tmp_path / "sim")))
    assert "resources.json" in _one_line(e.value)


# ------------------------------------------------------------------------------------------ PocEnv / ProdEnv
def _project_without_policy(tmp_path: Path) -> Path:
    project = yaml.safe_load(POC_PROJECT.read_text())
    project["builders"] = [b for b in project["builders"] if b["path"] != "fedseg.deploy.SitePolicyBuilder"]
    path = tmp_path / "project.yml"
    path.write_text(yaml.safe_dump(project, sort_keys=False))
    return path


def test_pocenv_needs_the_project_with_fedseg_s_site_policy(tiny_fedavg, tmp_path):
    from nvflare.recipe import PocEnv

    tiny_fedavg.process_env(PocEnv(project_conf_path=str(POC_PROJECT), username=POC_ADMIN))  # the repository's: fine
    cases = [
        (PocEnv(num_clients=2), "project_conf_path='poc_workspace/project.yml'"),  # NVFlare's default project
        (PocEnv(project_conf_path=str(_project_without_policy(tmp_path)), username=POC_ADMIN),
         "add `- path: fedseg.deploy.SitePolicyBuilder`"),
        (PocEnv(project_conf_path=str(POC_PROJECT)), f"use username='{POC_ADMIN}'"),  # NVFlare's default admin name
        (PocEnv(project_conf_path=str(tmp_path / "missing.yml"), username=POC_ADMIN), "does not exist"),
    ]
    for env, fix in cases:
        with pytest.raises(ExecEnvError) as e:
            tiny_fedavg.process_env(env)
        assert fix in _one_line(e.value)


def test_poc_env_helper_logs_in_as_the_project_admin():
    from fedseg.recipes.environments import poc_env

    env = poc_env(POC_PROJECT)
    assert env.username == POC_ADMIN and env.project_conf_path == str(POC_PROJECT.resolve())
    assert env.get_extra_prop("login_timeout") == 60.0


def _admin_kit(root: Path, name: str, kind: str = "fed_admin.json") -> Path:
    """A startup kit's layout (the real ones are provisioned in test_deploy.py, which checks them too)."""
    (root / name / "startup").mkdir(parents=True)
    (root / name / "startup" / kind).write_text("{}")
    return root / name


def test_prodenv_needs_an_admin_startup_kit(tiny_fedavg, tmp_path):
    from nvflare.recipe import ProdEnv

    from fedseg.recipes.environments import prod_env

    admin = _admin_kit(tmp_path, "admin@hospital.example")
    tiny_fedavg.process_env(ProdEnv(startup_kit_location=str(admin), username="admin@hospital.example"))
    assert prod_env(admin).username == "admin@hospital.example"  # the kit's user, not NVFlare's default name
    site = _admin_kit(tmp_path, "hospital-a", "fed_client.json")
    for env_call, fix in [
        (lambda: tiny_fedavg.process_env(ProdEnv(startup_kit_location=str(site), username="hospital-a")),
         "not an admin's startup kit"),
        (lambda: tiny_fedavg.process_env(ProdEnv(startup_kit_location=str(admin))), "log in as username='admin@hospital.example'"),
        (lambda: prod_env(tmp_path / "nowhere"), "does not exist"),
    ]:
        with pytest.raises(ExecEnvError) as e:
            env_call()
        assert fix in _one_line(e.value)


def test_a_failed_deployment_is_one_line_naming_the_next_step(tmp_path):
    from nvflare.fuel.flare_api.api_spec import NoConnection
    from nvflare.recipe import PocEnv, ProdEnv, SimEnv

    from fedseg.recipes.environments import deployment_failure

    admin = _admin_kit(tmp_path, "admin@hospital.example")
    down = NoConnection("cannot connect to server\nretried 10 times")
    cases = [
        (PocEnv(project_conf_path=str(POC_PROJECT), username=POC_ADMIN), down, "is not running"),
        (ProdEnv(startup_kit_location=str(admin), username="admin@hospital.example"), RuntimeError(f"Failed to submit job: {down}"),
         "is the FL server running"),
        (SimEnv(num_clients=2, workspace_root=str(tmp_path)), RuntimeError("Simulation failed with return code 1."),
         "server/simulate_job/log.txt"),
    ]
    for env, error, hint in cases:
        assert hint in _one_line(deployment_failure(env, "fedavg", error))
    assert deployment_failure(object(), "fedavg", down) is None  # not NVFlare's: the caller's error stands


# ------------------------------------------------------------------------------------------ experiment tracking
def test_sites_track_round_metrics_and_final_test_metrics():
    from fedseg.fl.tracking import tracked_metrics

    train = tracked_metrics("train", {"train_loss": 0.5, "val_dice:cup": 0.25, "steps": 3}, {})
    assert train == {"train_loss": 0.5, "val_dice/cup": 0.25, "steps": 3.0}  # MLflow refuses ':' in a name
    test = tracked_metrics("evaluate", {"dice": 0.75, "hd95": float("inf")}, {"model_name": "personalized"})
    assert test == {"test_personalized/dice": 0.75}
    assert tracked_metrics("evaluate", {"val_dice": 0.5}, {"model_name": "global", "split": "validation"}) == {}
    assert tracked_metrics("fedevi_surrogate", {"G": 1.0}, {}) == {}


@pytest.fixture
def mlflow_installed(monkeypatch):
    """An importable ``mlflow`` (it is not a fedseg dependency): the names NVFlare's receiver module imports."""
    mlflow = types.ModuleType("mlflow")
    mlflow.__spec__ = importlib.machinery.ModuleSpec("mlflow", None)
    entities = types.ModuleType("mlflow.entities")
    entities.Metric = entities.Param = entities.RunTag = object
    client = types.ModuleType("mlflow.tracking.client")
    client.MlflowClient = object
    receiver = "nvflare.app_opt.tracking.mlflow.mlflow_receiver"
    monkeypatch.delitem(sys.modules, receiver, raising=False)
    for name, module in {"mlflow": mlflow, "mlflow.entities": entities, "mlflow.tracking": types.ModuleType("mlflow.tracking"),
                         "mlflow.tracking.client": client}.items():
        monkeypatch.setitem(sys.modules, name, module)
    yield
    sys.modules.pop(receiver, None)  # built on the stand-in: not for later imports


def test_mlflow_tracking_writes_nvflare_s_receiver_beside_tensorboard(mlflow_installed, tmp_path):
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer

    from fedseg.fl.component_policy import prepare_simulator_workspace
    from fedseg.recipes.fedavg import FedAvgRecipe
    from fedseg.recipes.tracking import add_mlflow

    recipe = FedAvgRecipe(profile="tiny")
    add_mlflow(recipe, tracking_uri="http://mlflow.hospital.example:5000")
    recipe.export(str(tmp_path))
    server = json.loads((tmp_path / "fedavg" / "app" / "config" / "config_fed_server.json").read_text())
    receivers = {c["path"].rsplit(".", 1)[-1]: c for c in server["components"] if "tracking" in c["path"]}
    assert set(receivers) == {"TBAnalyticsReceiver", "MLflowReceiver"}
    args = receivers["MLflowReceiver"]["args"]
    assert args["tracking_uri"] == "http://mlflow.hospital.example:5000" and args["events"] == ["fed.analytix_log_stats"]
    assert args["kw_args"] == {"experiment_name": "fedseg-fedavg", "run_name": "fedavg"}
    # a code-free job: every participant builds the receiver from its allow list (NVFlare's default names it)
    prepare_simulator_workspace(tmp_path / "ws")
    ComponentPathAuthorizer().authorize_component_config(
        receivers["MLflowReceiver"], workspace=ResourcesWorkspace(tmp_path / "ws" / "local" / "resources.json"))


def test_mlflow_tracking_without_the_package_names_the_install(tiny_fedavg):
    from fedseg.recipes.tracking import add_mlflow

    if importlib.util.find_spec("mlflow") is not None:
        pytest.skip("mlflow is installed here")
    with pytest.raises(ValueError) as e:
        add_mlflow(tiny_fedavg)
    assert "pip install mlflow" in _one_line(e.value)
