"""fedseg jobs carry no code, and every site's component allow list lets NVFlare build exactly their classes.

Checked with NVFlare's own app validator and component authorizer (the code a site runs before building a job).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from job_configs import ResourcesWorkspace, job_components

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("method", sorted(p.name for p in (REPO / "jobs").iterdir() if (p / "meta.json").is_file()))
def test_committed_job_carries_no_code_and_every_component_is_allowed(method, tmp_path):
    """NVFlare's own checks: its app validator finds no custom code; its component authorizer builds every class."""
    from nvflare.apis.app_validation import AppValidationKey
    from nvflare.apis.fl_exception import UnsafeComponentError
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer
    from nvflare.private.fed.app.default_app_validator import DefaultAppValidator

    from fedseg.fl.component_policy import add_to_resources

    job = REPO / "jobs" / method
    assert not any(p.suffix == ".py" for p in job.rglob("*")), f"jobs/{method} carries Python code"
    for app in (p for p in job.iterdir() if p.is_dir()):
        for site_type in ("server", "client"):
            err, info = DefaultAppValidator(site_type).validate(str(app))
            assert err == "" and not info.get(AppValidationKey.BYOC), (app, site_type, err, info)

    resources = tmp_path / "local" / "resources.json"
    add_to_resources(resources)
    authorizer, workspace = ComponentPathAuthorizer(), ResourcesWorkspace(resources)
    configs = list(job.rglob("config_fed_*.json"))
    assert len(configs) == 2
    paths = []
    for config in configs:
        for component in job_components(json.loads(config.read_text())):
            authorizer.authorize_component_config(component, workspace=workspace)  # raises if not allowed
            paths.append(component["path"])
    if method == "fedstats":  # NVFlare's statistics controller with fedseg's site component
        assert "fedseg.fl.site_statistics.SiteImageStatistics" in paths, paths
    else:
        assert "fedseg.fl.site_executor.FedSegSiteExecutor" in paths and "fedseg.fl.controller.FedSegController" in paths
    # the same authorizer refuses what a hostile job could name instead
    hostile = ("subprocess.Popen", "fedseg_evil.fl.Controller", "nvflare.app_common.executors.client_api_executor.ClientAPIExecutor")
    for path in hostile:
        with pytest.raises(UnsafeComponentError, match="not in allow_list"):
            authorizer.authorize_component_config({"path": path, "args": {}}, workspace=workspace)


def test_class_allow_list_under_nvflare_matching_rule():
    from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer

    from fedseg.fl.component_policy import FEDSEG_COMPONENTS, class_allow_list

    allow = class_allow_list(["my_site.models."])
    assert allow[: len(DEFAULT_CLASS_ALLOW_LIST)] == list(DEFAULT_CLASS_ALLOW_LIST)
    assert set(FEDSEG_COMPONENTS) | {"my_site.models."} <= set(allow) and len(allow) == len(set(allow))
    ComponentPathAuthorizer._normalize_allow_list(allow)  # NVFlare accepts every entry
    # what NVFlare builds under the list: fedseg's components and the site's own, never a lookalike name
    expected = {
        "fedseg.fl.controller.FedSegController": True, "fedseg.flx.Controller": False,
        "fedseg.networks.unet.FeatureUNet": True, "fedseg.cli.main": False,
        "my_site.models.Net": True, "my_site.modelsX.Net": False,
        "nvflare.app_opt.pt.file_model_persistor.PTFileModelPersistor": True,
        "nvflare.app_opt.pt.file_model_persistor.PTFileModelPersistorX": False,
        "nvflare.app_common.workflows.fedavg.FedAvg": True,
    }
    built = {path: any(ComponentPathAuthorizer._path_matches_prefix(path, prefix) for prefix in allow) for path in expected}
    assert built == expected


def test_add_to_resources_keeps_site_entries_and_names_bad_files(tmp_path):
    from fedseg.fl.component_policy import add_to_resources, class_allow_list

    path = tmp_path / "resources.json"
    path.write_text(json.dumps({"format_version": 2, "class_allow_list": ["hospital.tools."], "other": 1}))
    written = add_to_resources(path)
    data = json.loads(path.read_text())
    assert data["other"] == 1 and data["class_allow_list"] == written == class_allow_list(["hospital.tools."])
    assert add_to_resources(path) == written  # idempotent
    path.write_text("{not json")
    with pytest.raises(ValueError, match="resources.json"):
        add_to_resources(path)
    path.write_text(json.dumps({"class_allow_list": "fedseg."}))
    with pytest.raises(ValueError, match="must be a list"):
        add_to_resources(path)




def test_allow_in_kit_edits_the_file_nvflare_reads(tmp_path):
    from fedseg.fl.component_policy import allow_in_kit, class_allow_list

    kit = tmp_path / "site-1"
    (kit / "local").mkdir(parents=True)
    default = kit / "local" / "resources.json.default"
    default.write_text(json.dumps({"format_version": 2, "components": [{"id": "x"}]}))
    assert allow_in_kit(kit) == default  # no site override: the default file
    assert json.loads(default.read_text())["components"] == [{"id": "x"}]
    override = kit / "local" / "resources.json"
    override.write_text(json.dumps({"format_version": 2}))
    assert allow_in_kit(kit) == override  # the site's own file wins in NVFlare, so that is the one to edit
    assert json.loads(override.read_text())["class_allow_list"] == class_allow_list()
    with pytest.raises(FileNotFoundError, match="no local"):
        allow_in_kit(tmp_path / "nothing")


def test_command_line_prepares_a_simulator_workspace_and_kits(tmp_path, capsys):
    from fedseg.fl.component_policy import class_allow_list, main

    main(["--simulator", str(tmp_path / "ws")])
    resources = json.loads((tmp_path / "ws" / "local" / "resources.json").read_text())
    assert resources["class_allow_list"] == class_allow_list()
    kit = tmp_path / "site-1"
    (kit / "local").mkdir(parents=True)
    main([str(kit)])
    assert (kit / "local" / "resources.json.default").is_file()
    assert "fedseg components allowed in" in capsys.readouterr().out


def test_summarise_names_the_missing_step_when_nvflare_refused_our_components(tmp_path):
    """A fresh simulator workspace has no allow list: NVFlare's authorizer (its default list) refuses fedseg's
    controller. With that refusal in a site or server log, ``fedseg summarise WS`` prints the one step it needs."""
    from nvflare.apis.fl_exception import UnsafeComponentError
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer

    from fedseg.cli import main
    from fedseg.fl.component_policy import refused_components_hint

    fresh = tmp_path / "fresh" / "local" / "resources.json"  # never written: NVFlare falls back to its default list
    with pytest.raises(UnsafeComponentError) as refused:
        ComponentPathAuthorizer().authorize_component_config(
            {"path": "fedseg.fl.controller.FedSegController", "args": {}}, workspace=ResourcesWorkspace(fresh))
    ws = tmp_path / "ws"
    (ws / "server").mkdir(parents=True)
    (ws / "server" / "log.txt").write_text(f"2026-01-01 - ServerRunner - ERROR - {type(refused.value).__name__}: {refused.value}\n")
    hint = refused_components_hint(ws)
    assert hint and f"python -m fedseg.fl.component_policy --simulator {ws}" in hint and "log.txt" in hint
    with pytest.raises(SystemExit, match="component_policy --simulator"):
        main(["summarise", str(ws)])
    # a workspace whose run failed for another reason gets no such hint
    (ws / "server" / "log.txt").write_text("ERROR - DatalistError\n")
    assert refused_components_hint(ws) is None
    with pytest.raises(SystemExit, match=r"^no report.json found under \S+$"):
        main(["summarise", str(ws)])
