"""Any MONAI bundle under the suite's methods: a model-zoo style bundle (tests/bundles, not ours) read through MONAI's
``ConfigWorkflow`` by ``BundleEngine``, each method's site side on it, the refusals and errors, and what leaves a site.

The bundles train on built-in data written in the layouts they read (``fedseg.data.synthetic.layouts``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedseg.bundle import BundleError, read_bundle
from fedseg.data.synthetic.layouts import write_layout_federation
from fedseg.engine.bundle_engine import BundleEngine
from fedseg.networks.feature_taps import (FeatureLayerError, default_bottleneck, find_head_layer, network_features,
                                          tag_network)
from fedseg.objectives.base import RoundContext
from fedseg.objectives.registry import build_objective

BUNDLES = Path(__file__).parent / "bundles"
ZOO_2D, ZOO_3D = BUNDLES / "zoo_2d", BUNDLES / "zoo_3d"
#: what a user sets on the command line for a CPU test: workers and caching (the bundles' configs stay as they are)
CPU = {"num_workers": 0, "device": "$torch.device('cpu')"}


@pytest.fixture(scope="module")
def polyp(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("zoo_polyp")
    write_layout_federation("polyp", ["site-1", "site-2"], root, layout="images-labels", profile="tiny")
    return root


@pytest.fixture(scope="module")
def prostate(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("zoo_prostate")
    write_layout_federation("prostate3d", ["site-1", "site-2"], root, profile="tiny", num_images=4)
    return root


def site_config(root: Path, bundle: Path, site: str = "site-1", **extra) -> dict:
    overrides = json.loads((root / "site_overrides.json").read_text())[site]
    return {"bundle": str(bundle), "bundle_overrides": {**CPU, **overrides, **extra.pop("bundle_overrides", {})},
            "local_epochs": 1, "seed": 0, **extra}


def one_round(engine: BundleEngine, method: str, tmp_path: Path, **options) -> dict:
    """One round of ``method``'s site side on ``engine``: begin, local training, end (the declared statistics)."""
    model = engine.build_network()
    objective = build_objective(method, **options)
    ctx = RoundContext(site=engine.site, round=0, total_rounds=2, train_config=engine.train_config, state_dir=str(tmp_path))
    objective.begin_round(ctx, model)
    metrics = objective.local_training(engine, model, ctx)
    statistics = objective.end_round(ctx, model, engine)
    assert metrics["steps"] > 0 and torch.isfinite(torch.tensor(metrics["train_loss"]))
    return statistics


# ------------------------------------------------------------------------------------------- feature taps
def _monai_networks():
    from monai.networks.nets import BasicUNet, FlexibleUNet, SegResNet, SwinUNETR, UNet, UNETR

    return {
        "UNet": (UNet(2, 1, 2, channels=(4, 8, 16, 32), strides=(2, 2, 2)), (1, 1, 32, 32)),
        "BasicUNet": (BasicUNet(2, 1, 2, features=(4, 4, 8, 8, 16, 4)), (1, 1, 32, 32)),
        "SegResNet": (SegResNet(2, init_filters=8, in_channels=1, out_channels=2), (1, 1, 32, 32)),
        "FlexibleUNet": (FlexibleUNet(1, 2, "efficientnet-b0", spatial_dims=2, pretrained=False), (1, 1, 64, 64)),
        "UNETR": (UNETR(1, 2, img_size=(32, 32, 32), feature_size=8, hidden_size=48, mlp_dim=96, num_heads=4), (1, 1, 32, 32, 32)),
        "SwinUNETR": (SwinUNETR(in_channels=1, out_channels=2, feature_size=12, spatial_dims=3), (1, 1, 64, 64, 64)),
    }


def test_feature_and_head_defaults_for_monais_networks():
    """Each listed network has a bottleneck default: the module whose output is the deepest (smallest) map of all its
    layers' outputs; the structural head is the module whose output is the logits tensor itself (a forward pass)."""
    for name, (net, shape) in _monai_networks().items():
        net.eval()
        x = torch.randn(shape)
        sizes, outputs = [], []
        handles = [m.register_forward_hook(lambda m, a, o, n=n: outputs.append((n, o)))
                   for n, m in net.named_modules() if n]
        with torch.no_grad():
            logits, feats = network_features(tag_network(net), x, ("bottleneck", "decoder_last"))
        for h in handles:
            h.remove()
        # UNETR's ViT works on tokens: its only spatial map inside is the patch embedding's, before the transformer
        sizes = [o.shape[2:].numel() for n, o in outputs if isinstance(o, torch.Tensor) and o.dim() == len(shape)
                 and not (name == "UNETR" and n.startswith("vit"))]
        # the deepest map (squeeze-and-excitation's pooled 1x1 maps aside)
        assert feats["bottleneck"].shape[2:].numel() == min(s for s in sizes if s > 1), name
        assert feats["decoder_last"].dim() == len(shape) and feats["decoder_last"].shape[2:] == logits.shape[2:] or name == "UNet"
        produced = [n for n, o in outputs if o is logits and any(True for _ in dict(net.named_modules())[n].parameters(recurse=False))]
        assert find_head_layer(net) in produced, name
        assert default_bottleneck(net) is not None


def test_a_network_without_a_default_names_feature_layer():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    with pytest.raises(FeatureLayerError, match="feature_layer"):
        network_features(tag_network(net), torch.randn(1, 1, 8, 8), ("bottleneck",))
    logits, feats = network_features(tag_network(net, feature_layer="1"), torch.randn(1, 1, 8, 8), ("bottleneck",))
    assert feats["bottleneck"].shape == (1, 4, 8, 8) and logits.shape == (1, 2, 8, 8)
    with pytest.raises(FeatureLayerError, match="not a module"):
        tag_network(net, feature_layer="nope")


# ------------------------------------------------------------------------------------------- every method, 2-D
METHODS_2D = {
    "fedavg": {}, "fedprox": {}, "feddyn": {}, "ditto": {}, "fedbn": {}, "fedrep": {}, "moon": {},
    "fedevi": {}, "graphfedseg": {}, "fvac": {}, "pathfl": {"ssa_noise_size": 16},
}


@pytest.fixture(scope="module")
def engine_2d(polyp) -> BundleEngine:
    return BundleEngine("site-1", site_config(polyp, ZOO_2D))


@pytest.mark.parametrize("method", sorted(METHODS_2D))
def test_each_method_trains_a_round_on_a_zoo_2d_bundle(engine_2d, method, tmp_path):
    statistics = one_round(engine_2d, method, tmp_path, **METHODS_2D[method])
    if method == "fedevi":
        assert {"A", "R_paper"} <= set(statistics)
    if method == "graphfedseg":
        assert 0 <= statistics["uncertainty"]
    if method == "pathfl":
        assert statistics["ssa_noise"].shape == (4, 3, 16, 16) and "afa_mean" in statistics and len(statistics["cse_mean"]) == 3


def test_the_zoo_2d_engine_reads_the_bundle(engine_2d):
    assert engine_2d.num_classes == 2 and engine_2d.train_config["spatial_dims"] == 2
    # the bundle's train#dataloader decides the batch
    assert engine_2d.train_config["batch_size"] == engine_2d.parser.get_parsed_content("train#dataloader#batch_size")
    means, rows = engine_2d.evaluate(engine_2d.build_network(), "test", per_image=True)
    assert {"dice", "hd95", "assd"} <= set(means) and rows and all(r["id"].endswith(".png") for r in rows)


def test_feature_alignment_on_a_users_network_keeps_its_own_state_dict_keys(polyp):
    from fedseg.bundle import build_bundle_network

    cfg = site_config(polyp, ZOO_2D)
    plain = build_bundle_network(cfg)
    aligned = build_bundle_network({**cfg, "feature_alignment": True})
    extra = set(aligned.state_dict()) - set(plain.state_dict())
    assert extra == {f"bottleneck_alignment.{k}" for k in ("target_mean", "target_std", "active", "at_inference")}
    aligned.bottleneck_alignment.set_target(5.0, 0.1, at_inference=True)
    aligned.eval()
    _, feats = network_features(aligned, torch.rand(1, 3, 64, 64), ("bottleneck",))
    assert abs(float(feats["bottleneck"].detach().mean()) - 5.0) < 1e-3  # the hook's alignment acts on the bottleneck


# ------------------------------------------------------------------------------------------- 3-D
@pytest.fixture(scope="module")
def engine_3d(prostate) -> BundleEngine:
    return BundleEngine("site-1", site_config(prostate, ZOO_3D))


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "fedevi", "graphfedseg", "fvac", "pathfl"])
def test_the_published_methods_train_a_round_on_a_zoo_3d_bundle(engine_3d, method, tmp_path):
    options = {"ssa_noise_size": 16} if method == "pathfl" else {}
    statistics = one_round(engine_3d, method, tmp_path, **options)
    if method == "pathfl":
        assert statistics["ssa_noise"].shape == (4, 1, 16, 16, 16)


def test_the_zoo_3d_engine_scores_in_mm_with_the_bundles_sliding_window(engine_3d):
    from monai.inferers import SlidingWindowInferer

    assert engine_3d.volumes and isinstance(engine_3d.val_inferer, SlidingWindowInferer)
    means = engine_3d.evaluate(engine_3d.build_network(), "validation")
    assert "hd95_mm" in means and "dice" in means


# ------------------------------------------------------------------------------------------- bad input
def test_bad_input_gets_one_line(polyp, tmp_path):
    with pytest.raises(BundleError, match="no config id 'no#such#id'"):
        BundleEngine("site-1", site_config(polyp, ZOO_2D, bundle_overrides={"no#such#id": 1}))
    empty = tmp_path / "empty"
    (empty / "images").mkdir(parents=True)
    (empty / "labels").mkdir()
    with pytest.raises(BundleError, match="training data is empty"):
        BundleEngine("site-1", site_config(polyp, ZOO_2D, bundle_overrides={"dataset_dir": str(empty)}))
    with pytest.raises(BundleError, match="output channels"):
        # labels hold classes 0 and 1; a network of one output channel cannot score them as classes
        BundleEngine("site-1", site_config(polyp, ZOO_2D, bundle_overrides={"num_classes": 1}))
    # a bundle missing one of MONAI's required train properties, named with MONAI's property name
    broken = tmp_path / "broken"
    (broken / "configs").mkdir(parents=True)
    config = json.loads((ZOO_2D / "configs" / "train.json").read_text())
    del config["train"]["inferer"]
    config["train"]["trainer"]["inferer"] = {"_target_": "SimpleInferer"}
    (broken / "configs" / "train.json").write_text(json.dumps(config))
    with pytest.raises(BundleError, match=r"train_inferer \(train#inferer\)"):
        read_bundle(broken)


def test_a_sigmoid_head_refuses_fedevi(polyp, tmp_path):
    # the same labels under a sigmoid (multi-label) loss: what a bundle whose head is not a softmax head trains with
    cfg = site_config(polyp, ZOO_2D, bundle_overrides={"loss": {"_target_": "DiceCELoss", "to_onehot_y": True, "sigmoid": True}})
    engine = BundleEngine("site-1", cfg)
    with pytest.raises(BundleError, match="fedevi needs softmax class logits"):
        one_round(engine, "fedevi", tmp_path)


def test_fedefm_refuses_a_users_bundle():
    from fedseg.recipes import get_recipe_class

    with pytest.raises(BundleError, match="classification ViT"):
        get_recipe_class("fedefm")(bundle=str(ZOO_2D), num_rounds=1)


# ------------------------------------------------------------------------------------------- privacy
def test_only_parameters_and_declared_statistics_leave_a_bundle_site(polyp, tmp_path):
    """The site's answer to a train task on a user's bundle: the network's own entries, scalar metrics, and the
    objective's declared statistics; nothing of the site's data, not even its folder (the overrides stay at the site)."""
    import argparse

    from fedseg.fl.client import SiteRunner
    from fedseg.fl.protocol import BASE_STATISTICS, META_KEY, TRAIN_TASK

    overrides = tmp_path / "overrides.json"
    site = json.loads((polyp / "site_overrides.json").read_text())["site-1"]
    overrides.write_text(json.dumps({"site-1": {**CPU, **site}}))
    args = argparse.Namespace(datalist=None, site_datalists=None, data_root=None, bundle_dir=None, site_overrides=str(overrides))
    runner = SiteRunner("site-1", args, workspace=str(tmp_path / "ws"))
    cfg = {"bundle": str(ZOO_2D), "local_epochs": 1, "seed": 0}
    job = {"objective": "fedevi", "objective_args": {}, "train_config": cfg, "round": 0, "total_rounds": 2}
    from fedseg.bundle import build_bundle_network

    initial = {k: v.numpy() for k, v in build_bundle_network({**cfg, "bundle_overrides": CPU}).state_dict().items()}
    out = runner.handle(TRAIN_TASK, initial, {META_KEY: job})
    model_keys = set(runner.model.state_dict())
    assert set(out["params"]) == model_keys
    assert all(isinstance(v, float) for v in out["metrics"].values())
    allowed = set(BASE_STATISTICS) | set(runner.objective.declared_statistics) | {"n_samples", "round"}
    assert set(out["meta"]) <= allowed
    text = json.dumps({"metrics": out["metrics"], "meta": out["meta"]}, default=str)
    assert str(polyp) not in text and ".png" not in text
    assert not any((ZOO_2D / d).exists() for d in ("models", "eval"))  # nothing written into the user's bundle


# ------------------------------------------------------------------------------------------- NVFlare runs
def bundle_2d_sim_run(root: Path):
    """Shared run ``bundle_zoo2d_fedavg``: ``fedseg run fedavg --bundle tests/bundles/zoo_2d --site-overrides FILE``
    on built-in polyp data written in the bundle's layout, 2 sites x 2 rounds, the bundle's configs unchanged."""
    from sim_utils import run_cli

    write_layout_federation("polyp", ["site-1", "site-2"], root / "data", layout="images-labels", profile="tiny")
    workspace = root / "ws"

    def simulate() -> dict:
        run_cli(["run", "fedavg", "--bundle", ZOO_2D, "--site-overrides", root / "data" / "site_overrides.json",
                 "--set", "num_workers=0", "--rounds", "2", "-w", workspace], root / "run.log")
        return {"workspace": workspace, "data": root / "data", "log": (root / "run.log").read_text()}

    return simulate


def bundle_3d_bench_run(root: Path):
    """Shared run ``bundle_zoo3d_bench``: ``fedseg bench --bundle tests/bundles/zoo_3d --site-overrides FILE --methods
    fedavg fvac`` on built-in prostate volumes in the decathlon layout, 1 round, one seed."""
    from sim_utils import run_cli

    write_layout_federation("prostate3d", ["site-1", "site-2"], root / "data", profile="tiny", num_images=4)

    def bench() -> dict:
        run_cli(["bench", "--bundle", ZOO_3D, "--site-overrides", root / "data" / "site_overrides.json",
                 "--set", "num_workers=0", "--methods", "fedavg", "fvac", "--rounds", "1", "--out", root / "bench"],
                root / "bench.log")
        return {"out": root / "bench"}

    return bench


@pytest.mark.shared_runs("bundle_zoo2d_fedavg")
def test_a_zoo_bundle_trains_under_fedavg_and_its_checkpoint_runs_its_own_inference(shared_runs, tmp_path):
    """The report has Dice / HD95 / ASSD per site; the global model loads in the bundle's own inference.json
    (MONAI's ConfigWorkflow, ``fedseg infer --bundle``), which writes a mask per image; nothing entered the bundle."""
    from fedseg.cli import find_reports, main

    run = shared_runs("bundle_zoo2d_fedavg")
    report = json.loads(find_reports(run["workspace"])[-1].read_text())
    final = report["final"]["global"]
    assert set(final) == {"site-1", "site-2"} and all({"dice", "hd95", "assd"} <= set(m) for m in final.values())
    assert report["config"]["train_config"]["bundle"] == str(ZOO_2D.resolve())
    checkpoint = next(Path(run["workspace"]).rglob("FL_global_model.pt"))
    images = run["data"] / "site-2" / "images"
    main(["infer", "--checkpoint", str(checkpoint), "--input", str(run["data"] / "site-2"), "--output", str(tmp_path / "masks"),
          "--set", "num_workers=0"])
    masks = sorted((tmp_path / "masks").rglob("*.png"))
    assert len(masks) == len(list(images.glob("*.png")))
    assert not any((ZOO_2D / d).exists() for d in ("models", "eval"))


@pytest.mark.shared_runs("bundle_zoo3d_bench")
def test_fedseg_bench_compares_methods_on_a_zoo_3d_bundle_per_image(shared_runs):
    out = shared_runs("bundle_zoo3d_bench")["out"]
    results = json.loads((out / "results.json").read_text())
    assert {"fedavg", "fvac"} <= set(results["approaches"])
    rows = json.loads(next((out / "runs").glob("method-fvac-seed0.json")).read_text())["per_image"]["global"]
    assert set(rows) == {"site-1", "site-2"} and all(r and r[0]["id"].endswith(".nii.gz") for r in rows.values())


def test_cli_refuses_bad_bundle_input_with_one_line(polyp, tmp_path, capsys):
    from fedseg.cli import main

    overrides = tmp_path / "sites.json"
    overrides.write_text(json.dumps({"site-1": {"dataset_dir": str(tmp_path / "nothing_here")}}))
    with pytest.raises(SystemExit, match="site-1: no training images under dataset_dir"):
        main(["run", "fedavg", "--bundle", str(ZOO_2D), "--site-overrides", str(overrides), "-w", str(tmp_path / "ws")])
    overrides.write_text(json.dumps({"site-1": {"dataset_dir": str(polyp / "site-1"), "no_such_id": 1}}))
    with pytest.raises(SystemExit, match="has no config id 'no_such_id'"):
        main(["run", "fedavg", "--bundle", str(ZOO_2D), "--site-overrides", str(overrides), "-w", str(tmp_path / "ws")])
    with pytest.raises(SystemExit, match="bogus: neither a config id of the bundle .* nor a train_config key"):
        main(["export", "--method", "fedavg", "--bundle", str(ZOO_2D), "--set", "bogus=1", "--out", str(tmp_path / "jobs")])
    assert not (tmp_path / "ws").exists()  # nothing that looks like a run


# ------------------------------------------------------------------------------------------- one path
def test_our_bundle_through_the_bundle_path_trains_as_todays_path(tmp_path):
    """``bundles/unet2d_seg`` read as a user's bundle (MONAI's ConfigWorkflow, ``BundleEngine``) builds the same initial
    network, holds its training split on the device with the same batch augmentation, and trains to the same per-round
    ``train_loss`` / ``val_dice`` as today's ``SegEngine``."""
    from fedseg.bundle import default_bundle_dir
    from fedseg.data.synthetic import generate_site_data
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import ClientObjective

    datalist = generate_site_data("polyp", "site-1", tmp_path, profile="tiny")
    bundle = BundleEngine("site-1", {"bundle": str(default_bundle_dir("unet2d_seg")), "local_epochs": 1, "seed": 0,
                                     "bundle_overrides": {"dataset_dir": str(datalist.parent), "image_size": 32}})
    today = SegEngine("site-1", datalist, {"local_epochs": 1, "seed": 0, "image_size": 32})
    curves = []
    for engine in (bundle, today):
        model = engine.build_network()
        curve = [engine.validation_metrics(model)["val_dice"]]
        for round_ in range(2):
            loss = engine.train(model, ClientObjective(), RoundContext("site-1", round_, 2, train_config=engine.train_config))
            curve += [loss["train_loss"], engine.validation_metrics(model)["val_dice"]]
        curves.append(curve)
    assert bundle._resident and today._resident  # both hold the split on the device
    assert curves[0] == pytest.approx(curves[1], abs=1e-6)


def test_pathfl_writes_its_site_figure_for_a_3d_bundle(engine_3d, tmp_path):
    """Style mixing on volumes: the site-local figure of CSE shows each volume's middle slice."""
    model = engine_3d.build_network()
    objective = build_objective("pathfl", ssa_noise_size=16)
    for round_ in range(2):  # the style pool arrives with round 1
        ctx = RoundContext(site="site-1", round=round_, total_rounds=2, train_config=engine_3d.train_config,
                           state_dir=str(tmp_path), server_meta={"cse_style_pool": {"mean": [[0.3]], "std": [[0.2]]}} if round_ else {})
        objective.begin_round(ctx, model)
        objective.local_training(engine_3d, model, ctx)
        objective.end_round(ctx, model, engine_3d)
    objective.save_site_figures(str(tmp_path / "figures"), ctx)
    assert (tmp_path / "figures" / "pathfl_cse_examples.png").is_file()


def test_a_failed_bundle_run_leaves_no_report_that_passes_for_finished(polyp, tmp_path, monkeypatch):
    """An earlier run's report in the workspace is gone before a new run starts: if the new run fails, ``fedseg
    summarise`` finds nothing rather than the old run."""
    import subprocess

    from fedseg.cli import find_reports, main

    workspace = tmp_path / "ws"
    old = workspace / "server" / "simulate_job" / "report.json"
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: 1)  # the simulator fails
    with pytest.raises(SystemExit, match="the simulator failed"):
        main(["run", "fedavg", "--bundle", str(ZOO_2D), "--site-overrides", str(polyp / "site_overrides.json"),
              "-w", str(workspace)])
    assert find_reports(workspace) == []


def test_a_pathfl_checkpoint_with_feature_alignment_runs_the_bundles_own_inference(polyp, tmp_path):
    """PathFL's AFA adds an alignment layer to the user's network; ``fedseg infer`` builds the bundle's inference network
    with the same layer, so the checkpoint loads strictly and the alignment acts as in evaluation."""
    from fedseg.bundle import build_bundle_network
    from fedseg.inference import run_bundle_inference

    cfg = {"bundle": str(ZOO_2D.resolve()), "bundle_overrides": {"num_workers": 0}, "seed": 0, "feature_alignment": True}
    network = build_bundle_network(cfg)
    network.bottleneck_alignment.set_target(0.5, 2.0, at_inference=True)
    checkpoint = tmp_path / "FL_global_model.pt"
    torch.save({"model": network.state_dict(), "train_config": cfg}, checkpoint)
    written = run_bundle_inference(checkpoint, tmp_path / "masks", input_dir=polyp / "site-1")
    assert len([p for p in written if p.suffix == ".png"]) == len(list((polyp / "site-1" / "images").glob("*.png")))
