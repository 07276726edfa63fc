"""The four MONAI bundles by MONAI's own rules, and MONAI's federated client ``MonaiAlgo`` on them.

* MONAI's property check (``ConfigWorkflow.check_properties``, ``monai.bundle.properties``) finds nothing missing and no
  optional property under a wrong id, for the train workflow (``train.json``; ``train.json`` + ``evaluate.json``, as
  MonaiAlgo's default evaluation and the model zoo's CI read them) and the infer workflow (``train.json`` +
  ``inference.json``), on a site's built-in data given as ``dataset_dir`` — as the model zoo's CI checks its bundles.
* ``train.json``, run the way ``monai.bundle run`` runs it, trains and runs its ``validate#evaluator`` every
  ``val_interval`` epochs.
* ``MonaiAlgo`` (through the site script ``fedseg.fl.monai_bundle_client``) evaluates received weights and trains one
  local epoch from them, in process, on each bundle at tiny sizes.
* NVFlare's ``FedAvgRecipe`` with that script, 2 sites x 2 rounds of ``unet2d_seg`` on built-in polyp data in
  ``SimEnv``, then NVFlare's cross-site evaluation (the script's ``submit_model`` and ``validate`` answers): the shared
  run ``monai_bundle_fedavg`` (tests/sim_utils.py), started in the background.

Every bundle folder must be unchanged afterwards: the bundles' writers are pointed into pytest's folders.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from sim_utils import run_fresh
from test_bundle import _files

REPO = Path(__file__).resolve().parents[1]
BUNDLES = ("unet2d_seg", "volume_seg", "unetr_seg", "vit_foundation")
#: small networks and inputs per bundle: the default code paths at a fraction of the CPU time
SMALL = {
    "unet2d_seg": {"channels": [4, 8, 16, 32, 64], "image_size": 32},
    "unetr_seg": {"image_size": 32},
    # the tiny prostate3d profile's own spacing; 2 pooling levels fit 16 x 16 x 8 patches
    "volume_seg": {"channels": [4, 8, 16], "patch_size": [16, 16, 8], "target_spacing": [2.5, 2.5, 4.0], "num_classes": 3},
    "vit_foundation": {"vit_image_size": 32},
}
#: the validate#key_metric of each bundle's train.json
KEY_METRICS = {"unet2d_seg": "val_mean_dice", "volume_seg": "val_mean_dice", "unetr_seg": "val_mean_dice",
               "vit_foundation": "val_accuracy"}
#: the workflows checked: (MONAI workflow type, configs)
WORKFLOWS = {"train": ("train", ("train",)), "train+evaluate": ("train", ("train", "evaluate")),
             "infer": ("infer", ("train", "inference"))}

# MONAI warns on every use that a bundle config runs as code (its security note); these bundles are ours
pytestmark = [pytest.mark.filterwarnings("ignore:executing the bundle config:UserWarning"),
              pytest.mark.filterwarnings("ignore:parsing config_file:UserWarning")]


@pytest.fixture(scope="module", autouse=True)
def bundles_untouched():
    before = {name: _files(REPO / "bundles" / name) for name in BUNDLES}
    yield
    assert {name: _files(REPO / "bundles" / name) for name in BUNDLES} == before, "a test wrote into a bundle folder"


@pytest.fixture(scope="module")
def sites(tmp_path_factory, tiny_datalist):
    """``{bundle: (dataset_dir, overrides)}``: a folder holding one site's built-in ``datalist.json`` (tiny polyp for the
    2-D bundles, prostate volumes, X-ray classification silo site-1 of two) and the bundle's small overrides."""
    from fedseg.data.synthetic import builtin_foundation_silos, generate_site_data

    root = tmp_path_factory.mktemp("monai_rules_data")
    volume = generate_site_data("prostate3d", "site-1", root, profile="tiny")
    silo = builtin_foundation_silos(root / "xray", ["site-1", "site-2"], profile="tiny", only_site="site-1")["site-1"]
    classes = len(json.loads(Path(silo).read_text())["label_space"])
    dirs = {"unet2d_seg": tiny_datalist.parent, "unetr_seg": tiny_datalist.parent, "volume_seg": volume.parent,
            "vit_foundation": Path(silo).parent}
    extra = {"vit_foundation": {"num_classes": classes}}
    return {b: (Path(dirs[b]), {**SMALL[b], **extra.get(b, {})}) for b in BUNDLES}


def _workflow(bundle: str, kind: str, dataset_dir: Path, overrides: dict, out: Path):
    from monai.bundle import ConfigWorkflow

    workflow_type, names = WORKFLOWS[kind]
    configs = REPO / "bundles" / bundle / "configs"
    return ConfigWorkflow(
        config_file=[str(configs / f"{n}.json") for n in names], meta_file=str(configs / "metadata.json"), logging_file=False,
        workflow_type=workflow_type, bundle_root=str(configs.parent), dataset_dir=str(dataset_dir),
        ckpt_dir=str(out / "models"), output_dir=str(out / "eval"), **overrides,
    )


def _split(dataset_dir: Path, split: str) -> list:
    return json.loads((dataset_dir / "datalist.json").read_text())[split]


# ------------------------------------------------------------------------------------------ MONAI's properties
@pytest.mark.parametrize("kind", sorted(WORKFLOWS))
@pytest.mark.parametrize("bundle", BUNDLES)
def test_check_properties_finds_nothing_missing(tmp_path, sites, bundle, kind):
    from monai.engines import SupervisedEvaluator, SupervisedTrainer

    dataset_dir, overrides = sites[bundle]
    workflow = _workflow(bundle, kind, dataset_dir, overrides, tmp_path)
    if kind == "infer":  # inference.json's initialize loads the checkpoint into the evaluator
        ckpt = tmp_path / "model.pt"
        torch.save(workflow.parser.get_parsed_content("network_def", lazy=False).state_dict(), ckpt)
        workflow.parser["ckpt_path"] = str(ckpt)
    workflow.initialize()
    assert workflow.check_properties() == []
    # and the properties are the bundle's parts, on this site's data
    assert workflow.dataset_dir == str(dataset_dir) and str(workflow.device) in ("cpu", "cuda")
    if kind == "infer":
        assert isinstance(workflow.evaluator, SupervisedEvaluator)
        assert len(workflow.dataset) == len(_split(dataset_dir, "test"))
        return
    assert isinstance(workflow.trainer, SupervisedTrainer) and workflow.max_epochs == workflow.parser["max_epochs"]
    assert len(workflow.train_dataset_data) == len(_split(dataset_dir, "training"))
    assert isinstance(workflow.evaluator, SupervisedEvaluator) and workflow.val_interval == 1
    if kind == "train":  # evaluate.json replaces the validation with the test split, its metrics under their own names
        assert len(workflow.val_dataset_data) == len(_split(dataset_dir, "validation"))
        assert list(workflow.val_key_metric) == [KEY_METRICS[bundle]]
        assert list(workflow.train_key_metric) == [KEY_METRICS[bundle].replace("val_", "train_")]
    else:
        assert len(workflow.val_dataset_data) == len(_split(dataset_dir, "test"))


def test_check_properties_reports_a_property_under_another_id(tmp_path, sites):
    """The check can fail: a copy of unet2d_seg whose evaluator takes the inferer from elsewhere than validate#inferer
    is reported (MONAI's optional property val_inferer, wrong id)."""
    copy = tmp_path / "unet2d_seg"
    shutil.copytree(REPO / "bundles" / "unet2d_seg", copy, ignore=shutil.ignore_patterns("__pycache__", "models", "eval"))
    train = json.loads((copy / "configs" / "train.json").read_text())
    train["validate"]["evaluator"]["inferer"] = "@inferer"
    (copy / "configs" / "train.json").write_text(json.dumps(train))
    from monai.bundle import ConfigWorkflow

    dataset_dir, overrides = sites["unet2d_seg"]
    workflow = ConfigWorkflow(config_file=str(copy / "configs" / "train.json"), meta_file=str(copy / "configs" / "metadata.json"),
                              logging_file=False, workflow_type="train", bundle_root=str(copy), dataset_dir=str(dataset_dir),
                              ckpt_dir=str(tmp_path / "models"), **overrides)
    workflow.initialize()
    assert workflow.check_properties() == ["val_inferer"]


@pytest.mark.parametrize("bundle", BUNDLES)
def test_datalist_defaults_to_the_dataset_dir_s(tmp_path, bundle):
    """``dataset_dir`` alone: its ``datalist.json``; ``datalist`` (the engine and fedseg.inference set it) wins; neither:
    the empty default as before."""
    from monai.bundle import ConfigParser

    def datalist(**pairs):
        parser = ConfigParser()
        parser.read_config(str(REPO / "bundles" / bundle / "configs" / "train.json"))
        parser.update(pairs=pairs)
        return parser.get_parsed_content("datalist")

    assert datalist() == ""
    assert datalist(dataset_dir=str(tmp_path)) == str(tmp_path) + "/datalist.json"
    assert datalist(dataset_dir=str(tmp_path), datalist="/elsewhere/list.json") == "/elsewhere/list.json"


def test_monai_bundle_run_trains_and_validates_every_val_interval(tmp_path, sites):
    """What ``python -m monai.bundle run --config_file configs/train.json --dataset_dir DIR`` does (``create_workflow``,
    ``run``, ``finalize``): one epoch that ends with the validation evaluator's Dice, and the final checkpoint."""
    from monai.bundle import create_workflow

    dataset_dir, overrides = sites["unet2d_seg"]
    configs = REPO / "bundles" / "unet2d_seg" / "configs"
    workflow = create_workflow(config_file=str(configs / "train.json"), meta_file=str(configs / "metadata.json"),
                               logging_file=False, workflow_type="train", bundle_root=str(configs.parent),
                               dataset_dir=str(dataset_dir), ckpt_dir=str(tmp_path / "models"), max_epochs=1, **overrides)
    workflow.run()
    workflow.finalize()
    trainer, evaluator = workflow.trainer, workflow.evaluator
    assert trainer.state.epoch == 1 and math.isfinite(trainer.state.metrics["train_mean_dice"])
    assert evaluator.state.epoch == 1 and 0.0 <= evaluator.state.metrics["val_mean_dice"] <= 1.0
    assert evaluator.state.iteration == len(_split(dataset_dir, "validation"))  # one validation image per iteration
    assert (tmp_path / "models" / "model.pt").is_file()


# ------------------------------------------------------------------------------------------ MonaiAlgo
def _plain(state):
    return {k: v.detach().cpu().clone() for k, v in state.items()}


@pytest.mark.parametrize("bundle", BUNDLES)
def test_monai_algo_evaluates_and_trains_each_bundle(tmp_path, sites, bundle):
    """The site script's MonaiAlgo: the received weights scored by the bundle's validate#key_metric, then one local
    epoch from them; the bundle's writers and the evaluation log in the site's folder."""
    from fedseg.fl.monai_bundle_client import EVALUATION_LOG, BundleSite, resolve_bundle_root, site_overrides

    dataset_dir, overrides = sites[bundle]
    root = resolve_bundle_root(str(REPO / "bundles" / bundle))  # a folder: this checkout's bundle
    workdir = tmp_path / "site-1"
    values = site_overrides(root, ["configs/train.json"], overrides, {"dataset_dir": str(dataset_dir)}, workdir)
    assert values["ckpt_dir"] == str(workdir / "models") and values["output_dir"] == str(workdir / "eval")
    site = BundleSite("site-1", root, values, local_epochs=1, workdir=workdir)
    try:
        received = _plain(site.algo.trainer.network.state_dict())
        with torch.no_grad():  # another model than the one the trainer holds: the received weights must be loaded
            received = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in received.items()}
        before = site.evaluate(received, round_=0)
        assert list(before) == [KEY_METRICS[bundle]] and 0.0 <= before[KEY_METRICS[bundle]] <= 1.0
        weights, statistics = site.train(received)
        assert weights.keys() == received.keys()
        assert any(not torch.equal(weights[k], received[k]) for k in received if received[k].is_floating_point())
        assert statistics["num_executed_iterations"] >= 1 and statistics["current_epoch"] == 1
        after = site.evaluate(weights, round_=1)
        assert after.keys() == before.keys()
    finally:
        site.finalize()
    lines = [json.loads(line) for line in (workdir / EVALUATION_LOG).read_text().splitlines()]
    assert [(line["site"], line["round"], list(line["metrics"])) for line in lines] == [
        ("site-1", 0, [KEY_METRICS[bundle]]), ("site-1", 1, [KEY_METRICS[bundle]])]
    assert (workdir / "models" / "model.pt").is_file()  # the bundle's CheckpointSaver, in the site's folder


def test_monai_algo_sends_the_weight_difference_when_asked(tmp_path, sites):
    """``--send_weight_diff``: what is sent is the trained network minus the received weights (NVFlare's DIFF)."""
    from fedseg.fl.monai_bundle_client import BundleSite, resolve_bundle_root, site_overrides

    dataset_dir, overrides = sites["unet2d_seg"]
    root = resolve_bundle_root(str(REPO / "bundles" / "unet2d_seg"))
    values = site_overrides(root, ["configs/train.json"], overrides, {"dataset_dir": str(dataset_dir)}, tmp_path)
    site = BundleSite("site-1", root, values, send_weight_diff=True)
    try:
        received = _plain(site.algo.trainer.network.state_dict())
        diff, _ = site.train(received)
        trained = site.local_weights()
        for k, v in received.items():
            if v.is_floating_point():
                torch.testing.assert_close(diff[k], trained[k] - v)
        assert any(bool(d.abs().sum() > 0) for k, d in diff.items() if received[k].is_floating_point())
    finally:
        site.finalize()


def test_site_script_refuses_unknown_ids_and_a_site_left_out(tmp_path):
    from fedseg.bundle import default_bundle_dir
    from fedseg.bench.runs import parse_assignments as parse_sets
    from fedseg.bundle import read_site_overrides
    from fedseg.fl.monai_bundle_client import resolve_bundle_root, site_overrides

    root = resolve_bundle_root("unet2d_seg")  # a name: the installed package's bundle, as at a site
    assert root == default_bundle_dir("unet2d_seg").resolve()
    assert parse_sets(["image_size=64", "channels=[8,16,32,64,128]", "dataset_dir=/data/a"]) == {
        "image_size": 64, "channels": [8, 16, 32, 64, 128], "dataset_dir": "/data/a"}
    with pytest.raises(ValueError, match="no config id.*imagesize"):
        site_overrides(root, ["configs/train.json"], {"imagesize": 64}, {}, tmp_path)
    path = tmp_path / "sites.json"
    path.write_text(json.dumps({"site-1": {"dataset_dir": "/data/a"}}))
    assert read_site_overrides(path, "site-1") == {"dataset_dir": "/data/a"}
    with pytest.raises(ValueError, match="no entry for site 'site-2'"):
        read_site_overrides(path, "site-2")
    with pytest.raises(FileNotFoundError):
        resolve_bundle_root(str(tmp_path / "no_bundle"))


def test_recipe_is_nvflare_s_fedavg_around_the_site_script(tmp_path):
    """NVFlare's own FedAvgRecipe: the bundle's network as the initial model, the site script with its arguments,
    the bundle's validation metric for model selection; white space in a value is refused (NVFlare splits on it)."""
    from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe

    from fedseg.recipes.monai_bundle import monai_bundle_recipe

    sites_file = tmp_path / "sites.json"
    sites_file.write_text(json.dumps({"site-1": {"dataset_dir": "/data/a"}, "site-2": {"dataset_dir": "/data/b"}}))
    recipe = monai_bundle_recipe("unet2d_seg", num_rounds=1, sets=SMALL["unet2d_seg"], site_overrides=sites_file)
    assert isinstance(recipe, FedAvgRecipe)
    recipe.export(str(tmp_path / "jobs"))
    app = tmp_path / "jobs" / recipe.name / "app" / "config"
    server, client = (json.loads((app / f"config_fed_{n}.json").read_text()) for n in ("server", "client"))
    components = {c["id"]: c for c in server["components"]}
    model = components["persistor"]["args"]["model"]
    assert model["path"] == "fedseg.networks.unet.FeatureUNet" and model["args"]["channels"] == SMALL["unet2d_seg"]["channels"]
    assert components["model_selector"]["args"]["key_metric"] == "val_mean_dice"
    assert server["server"]["task_request_interval"] == 0.05  # the suite's recipes' value, not NVFlare's 2 s
    args = json.dumps(client)
    assert "monai_bundle_client.py" in args and f"--site_overrides {sites_file}" in args
    assert "--bundle_root unet2d_seg" in args and "channels=[4,8,16,32,64]" in args
    with pytest.raises(ValueError, match="white space"):
        monai_bundle_recipe("unet2d_seg", sets={"output_dir": "/a b"})


# ------------------------------------------------------------------------------------------ NVFlare's SimEnv
SIM_SITES = ("site-1", "site-2")
SIM_ROUNDS = 2


def monai_algo_sim_run(root: Path):
    """Shared run ``monai_bundle_fedavg``: built-in polyp data per site and the site overrides file made here, then
    ``python -m fedseg.recipes.monai_bundle`` (the recipe in NVFlare's SimEnv) in a fresh folder, its output to a log."""
    from fedseg.data.synthetic import generate_site_data
    from fedseg.recipes.monai_bundle import DEFAULT_NAME

    overrides = {s: {"dataset_dir": str(generate_site_data("polyp", s, root / "data", profile="tiny").parent)} for s in SIM_SITES}
    (root / "sites.json").write_text(json.dumps(overrides))
    sets = [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in SMALL["unet2d_seg"].items()]
    cmd = [sys.executable, "-m", "fedseg.recipes.monai_bundle", "--bundle", "unet2d_seg", "--sites", *SIM_SITES,
           "--rounds", str(SIM_ROUNDS), "--site-overrides", root / "sites.json", "--set", *sets, "--cross-site-eval",
           "-w", root / "ws"]
    workspace = root / "ws" / DEFAULT_NAME

    def simulate() -> dict:
        proc = run_fresh(cmd, workspace, root / "monai_bundle.log", cwd=root / "fresh_folder")
        assert proc.returncode == 0, proc.stdout[-5000:]
        return {"workspace": workspace, "log": proc.stdout}

    return simulate


@pytest.mark.shared_runs("monai_bundle_fedavg")
def test_fedavg_recipe_with_monai_algo_in_simenv(shared_runs):
    from fedseg.fl.monai_bundle_client import EVALUATION_LOG
    from fedseg.recipes.monai_bundle import bundle_network

    run = shared_runs("monai_bundle_fedavg")
    workspace = run["workspace"]
    assert f"job result: {workspace}" in run["log"]
    # the server's global model after the last round: the bundle's network, trained
    (path,) = workspace.rglob("FL_global_model.pt")
    state = torch.load(path, map_location="cpu", weights_only=False)["model"]
    initial = bundle_network("unet2d_seg", SMALL["unet2d_seg"])
    initial_state = _plain(initial.state_dict())
    initial.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})  # strict: every tensor, the same shapes
    assert any(not torch.equal(torch.as_tensor(state[k]), v) for k, v in initial_state.items() if v.is_floating_point())
    server_log = (workspace / "server" / "log.txt").read_text()
    (cross_site,) = workspace.rglob("cross_val_results.json")
    cross_site = json.loads(cross_site.read_text())
    assert sorted(cross_site) == list(SIM_SITES)
    for site in SIM_SITES:
        # each site scored every received global model on its validation split ...
        (log,) = (workspace / site).rglob(EVALUATION_LOG)
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        rounds = [line for line in lines if line["model"] == "global"]
        assert [line["round"] for line in rounds] == list(range(SIM_ROUNDS))
        assert all(0.0 <= line["metrics"]["val_mean_dice"] <= 1.0 for line in lines)
        # ... the server's model selector received it ...
        assert f"validation metric {rounds[-1]['metrics']['val_mean_dice']} from client {site}" in server_log
        # ... and in the cross-site evaluation it scored the final and best global models and every site's local model
        scores = cross_site[site]
        assert set(scores) == {"SRV_FL_global_model.pt", "SRV_best_FL_global_model.pt", *SIM_SITES}
        assert all(0.0 <= s["val_mean_dice"] <= 1.0 for s in scores.values())
        assert sorted(line["metrics"]["val_mean_dice"] for line in lines if line["model"] == "received") == sorted(
            s["val_mean_dice"] for s in scores.values())
    assert "new best validation metric" in server_log and next(workspace.rglob("best_FL_global_model.pt"), None)
