"""The local-protocol options every method can use (augmentation preset, per-image intensity, drop-last,
largest-component scoring, best-validation-round selection) and the bench's shared protocol.

References: exact binomial tests (scipy) for the augmentation's distribution, arithmetic by hand for the
intensity and the batches, MONAI's ``KeepLargestConnectedComponent`` (scikit-image) and hand-made masks for the
largest component, and the report's own per-round validation values for the selected round.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

from fedseg.bundle import load_bundle
from fedseg.config import LOCAL_PROTOCOL_KEYS, check_training_options, resolve_profile
from fedseg.data.transforms import DivideByMaxd, KeepLargestComponentd
from fedseg.metrics.segmentation import keep_largest_component, largest_component_key

from inprocess import builtin_sites, run_in_process


# ------------------------------------------------------------------------------------------ augmentation
def _flip_outcomes(level: str, draws: int) -> dict:
    """How often the bundle's augmentation of ``level`` leaves a marked 2-D image as it is, flips it along axis 0
    (rows), along axis 1 (columns), or does anything else."""
    from monai.transforms import Compose

    parser = load_bundle(None, {"augment_level": level})
    key = "flip_augment_transforms" if level == "flip" else "augment_transforms"
    augment = Compose(parser.get_parsed_content(key, instantiate=True))
    augment.set_random_state(seed=0)
    image = torch.arange(16, dtype=torch.float32).reshape(1, 4, 4)
    seen = {"none": 0, "rows": 0, "cols": 0, "other": 0}
    for _ in range(draws):
        out = torch.as_tensor(augment({"image": image.clone(), "label": image.clone()})["image"])
        if torch.equal(out, image):
            seen["none"] += 1
        elif torch.equal(out, image.flip(1)):
            seen["rows"] += 1
        elif torch.equal(out, image.flip(2)):
            seen["cols"] += 1
        else:
            seen["other"] += 1
    return seen


def test_flip_preset_draws_one_flip_along_a_random_axis_half_of_the_time():
    draws = 800
    seen = _flip_outcomes("flip", draws)
    assert seen["other"] == 0  # never a rotation, never both flips
    # P(no flip) = 0.5, P(rows) = P(cols) = 0.25 (the reference code's RandomFlip): exact binomial tests
    assert stats.binomtest(seen["none"], draws, 0.5).pvalue > 1e-3
    assert stats.binomtest(seen["rows"], draws, 0.25).pvalue > 1e-3
    assert stats.binomtest(seen["cols"], draws, 0.25).pvalue > 1e-3


def test_basic_preset_is_not_the_flip_preset():
    seen = _flip_outcomes("basic", 400)
    assert seen["other"] > 0  # rotations and double flips: the suite's default augmentation


def test_unknown_choices_are_refused_with_the_allowed_values():
    with pytest.raises(ValueError, match="augment_level.*flip"):
        check_training_options({"augment_level": "flips"})
    with pytest.raises(ValueError, match="intensity.*image_max"):
        resolve_profile("tiny", None, None, intensity="max")
    with pytest.raises(ValueError, match="volumes"):
        check_training_options({"intensity": "image_max", "spatial_dims": 3})
    with pytest.raises(ValueError, match="drop_last"):
        check_training_options({"drop_last": "yes"})


# ------------------------------------------------------------------------------------------ intensity
def test_divide_by_max_scales_each_image_by_its_own_maximum():
    image = torch.tensor([[[0.0, 10.0], [40.0, 20.0]], [[5.0, 0.0], [0.0, 30.0]]])  # max 40 over both channels
    out = DivideByMaxd(keys="image")({"image": image})["image"]
    assert torch.allclose(out, image / 40.0)
    black = torch.zeros(3, 4, 4)
    assert torch.equal(DivideByMaxd(keys="image")({"image": black})["image"], black)  # nothing to scale, no NaN


def test_the_bundle_applies_per_image_max_on_the_network_grid(tmp_path):
    from fedseg.engine.engine import SegEngine

    sites = builtin_sites("polyp", ["site-1"], tmp_path)
    fixed = SegEngine("site-1", sites["site-1"], resolve_profile("tiny", None, None)["train_config"])
    scaled = SegEngine("site-1", sites["site-1"], resolve_profile("tiny", None, None, intensity="image_max")["train_config"])
    assert len(fixed._dataset("test", False)) > 0
    for i in range(len(fixed._dataset("test", False))):
        a = torch.as_tensor(fixed._dataset("test", False)[i]["image"])
        b = torch.as_tensor(scaled._dataset("test", False)[i]["image"])
        assert float(b.max()) == pytest.approx(1.0)
        # the same resized image divided by its own maximum (the fixed mode's /255 cancels)
        assert torch.allclose(b, a / a.max(), atol=1e-6)
    batch = next(iter(scaled.loader("training", shuffle=True, train=True)))
    assert all(float(x.max()) == pytest.approx(1.0) for x in batch["image"])


# ------------------------------------------------------------------------------------------ drop_last
def test_drop_last_drops_the_incomplete_batch_and_refuses_a_site_smaller_than_a_batch(tmp_path):
    from fedseg.engine.engine import SegEngine

    sites = builtin_sites("polyp", ["site-1"], tmp_path)
    keep = SegEngine("site-1", sites["site-1"], resolve_profile("tiny", None, None)["train_config"])
    n = keep.n_train
    bs = next(b for b in (3, 5, 7) if n % b and b < n)  # a batch size that leaves an incomplete last batch
    cfg = {**keep.train_config, "batch_size": bs}
    keep = SegEngine("site-1", sites["site-1"], cfg)
    drop = SegEngine("site-1", sites["site-1"], {**cfg, "drop_last": True})
    assert len(keep.loader("training", train=True)) == -(-n // bs)
    assert len(drop.loader("training", train=True)) == n // bs
    assert all(b["image"].shape[0] == bs for b in drop.loader("training", shuffle=True, train=True))
    big = SegEngine("site-1", sites["site-1"], {**cfg, "drop_last": True, "batch_size": n + 1})
    with pytest.raises(ValueError, match="fewer than batch_size.*drop_last"):
        big.loader("training", train=True)


# -------------------------------------------------------------------------------------- largest component
def test_largest_component_on_hand_made_masks():
    mask = torch.zeros(1, 1, 8, 8, dtype=torch.long)
    mask[0, 0, 0:2, 0:3] = 1  # 6 pixels
    mask[0, 0, 5:7, 5:7] = 1  # 4 pixels
    mask[0, 0, 2, 3] = 1  # touches the first blob only at a corner: its own component under 4-connectivity
    kept = keep_largest_component(mask, 2)
    expected = torch.zeros_like(mask)
    expected[0, 0, 0:2, 0:3] = 1
    assert torch.equal(kept, expected)
    # classes are reduced one by one: class 2's small blob survives when it is class 2's largest
    multi = mask.clone()
    multi[0, 0, 5:7, 5:7] = 2
    kept = keep_largest_component(multi, 3)
    assert int((kept == 1).sum()) == 6 and int((kept == 2).sum()) == 4
    # an empty prediction stays empty (the reference code would fill the whole image)
    empty = torch.zeros(2, 1, 5, 5, dtype=torch.long)
    assert torch.equal(keep_largest_component(empty, 2), empty)
    assert largest_component_key("dice") == "dice_lcc" and largest_component_key("dice:cup") == "dice_lcc:cup"


def _blobby_labels(seed: int) -> torch.Tensor:
    """A (1, 1, 32, 32) map of 3 classes made of smooth random blobs, whose two largest components of each class
    differ in size (MONAI and we may break a tie between equal components differently)."""
    from scipy import ndimage

    for attempt in range(100):
        rng = np.random.default_rng([seed, attempt])
        field = ndimage.gaussian_filter(rng.normal(size=(32, 32)), 1.5)
        labels = np.digitize(field, np.quantile(field, [0.6, 0.8]))  # 60 % background, 20 % each class
        tied = False
        for c in (1, 2):
            sizes = np.sort(np.bincount(ndimage.label(labels == c)[0].ravel())[1:])
            tied |= bool(len(sizes) > 1 and sizes[-1] == sizes[-2])
        if not tied:
            return torch.as_tensor(labels)[None, None]
    raise AssertionError("no tie-free map drawn")


@pytest.mark.parametrize("seed", range(6))
def test_largest_component_agrees_with_monai(seed):
    pytest.importorskip("skimage")  # MONAI's KeepLargestConnectedComponent needs scikit-image
    from monai.transforms import KeepLargestConnectedComponent

    labels = _blobby_labels(seed)
    monai = KeepLargestConnectedComponent(applied_labels=[1, 2], is_onehot=False, independent=True, connectivity=1)
    theirs = np.asarray(monai(labels[0].clone()))[None]  # (MONAI's transform writes into its input)
    ours = keep_largest_component(labels, 3)
    assert not np.array_equal(ours.numpy(), labels.numpy())  # something was removed
    assert np.array_equal(ours.numpy(), theirs)


def test_keep_largest_component_transform_keeps_metadata():
    from monai.data import MetaTensor

    pred = MetaTensor(torch.tensor([[[1.0, 0, 1], [1, 0, 0], [0, 0, 0]]]), meta={"filename_or_obj": "a.png"})
    out = KeepLargestComponentd(keys="pred", num_classes=2)({"pred": pred})["pred"]
    assert out.meta["filename_or_obj"] == "a.png"
    assert out.tolist() == [[[1, 0, 0], [1, 0, 0], [0, 0, 0]]]


# ------------------------------------------------------------------- evaluation options in a real workflow
@pytest.fixture(scope="module")
def protocol_run(tmp_path_factory):
    """FedAvg in the real server workflow (in-process sites), 3 rounds, with LCC scoring and best-round selection."""
    tmp = tmp_path_factory.mktemp("protocol_run")
    sites = builtin_sites("polyp", ["site-1", "site-2"], tmp / "data")
    report = run_in_process("fedavg", sites, tmp, num_rounds=3, local_epochs=1, eval_largest_component=True,
                            eval_best_val_round=True)
    return report, sites, tmp


def test_raw_and_largest_component_scores_are_reported_side_by_side(protocol_run):
    report, sites, tmp = protocol_run
    for site in sites:
        final = report["final"]["global"][site]
        assert {"dice", "hd95", "assd", "dice_lcc", "hd95_lcc", "assd_lcc"} <= set(final)
        rows = json.loads((tmp / "sites" / site / "fedseg_outputs" / site / "per_image_global.json").read_text())["rows"]
        assert all({"dice", "dice_lcc"} <= set(r) for r in rows)
        assert final["dice_lcc"] == pytest.approx(np.mean([r["dice_lcc"] for r in rows]))


def test_best_validation_round_is_the_round_with_the_highest_mean_validation_dice(protocol_run):
    report, sites, tmp = protocol_run
    means = [np.mean([r["global_val"][s] for s in sites]) for r in report["rounds"]]
    assert report["final"]["best_val_round"] == int(np.argmax(means))
    assert report["final"]["best_val_score"] == pytest.approx(max(means))
    assert set(report["final"]["global_best_val"]) == set(sites)
    # the selected model is the global model the persistor saved after that round; evaluated as its own model
    controller = report["_controller"]
    best = controller._selection.params
    saved = controller.saved[report["final"]["best_val_round"]]
    assert all(torch.equal(best[k], torch.as_tensor(saved[k])) for k in best)
    for site in sites:
        assert (tmp / "sites" / site / "fedseg_outputs" / site / "per_image_global_best_val.json").is_file()
    stored = torch.load(tmp / "server" / report["final"]["best_val_checkpoint"], weights_only=True)
    assert all(torch.equal(stored["model"][k], best[k]) for k in best) and stored["train_config"]["eval_best_val_round"]
    # one task per round: each round's global model was validated with the next train task (the last one with the
    # final evaluation), and no evaluate task was sent during training
    assert not [r for r in controller.sent if r["task"] == "evaluate" and r["meta"]["fedseg"]["round"] < 3]
    assert all(r["meta"].get("validate_received") for r in controller.sent if r["task"] == "train" and r["meta"]["fedseg"]["round"] > 0)


@pytest.fixture(scope="module")
def protocol_run_two_tasks(tmp_path_factory):
    """The same run as ``protocol_run`` with an evaluate task of its own after every round."""
    tmp = tmp_path_factory.mktemp("protocol_run_two_tasks")
    sites = builtin_sites("polyp", ["site-1", "site-2"], tmp / "data")
    report = run_in_process("fedavg", sites, tmp, num_rounds=3, local_epochs=1, eval_largest_component=True,
                            eval_best_val_round=True, round_validation="task")
    return report, sites, tmp


def test_one_task_rounds_validate_as_two_task_rounds(protocol_run, protocol_run_two_tasks):
    """Same seed, same global models: each round's validation scores, the selected round and its test scores are the
    same whether the validation rides on the next task or has a task of its own."""
    one, sites, _ = protocol_run
    two, _, _ = protocol_run_two_tasks
    for a, b in zip(one["rounds"], two["rounds"]):
        assert a["global_val"] == pytest.approx(b["global_val"], abs=1e-9), a["round"]
    assert one["final"]["best_val_round"] == two["final"]["best_val_round"]
    for site in sites:
        assert one["final"]["global_best_val"][site]["dice"] == pytest.approx(two["final"]["global_best_val"][site]["dice"])
        assert one["final"]["global"][site] == pytest.approx(two["final"]["global"][site])
    # the two-task run's validation answers carry only the validation metric
    controller = two["_controller"]
    validation = [r for r in controller.received if r["task"] == "evaluate" and r["round"] < 3]
    assert len(validation) == 3 * len(sites) and all(r["params"] == [] for r in validation)


def test_summarise_shows_the_best_round_and_the_largest_component_scores(protocol_run, capsys):
    from fedseg.cli import main

    report, sites, tmp = protocol_run
    main(["summarise", str(tmp / "server" / "report.json")])
    out = capsys.readouterr().out
    assert f"best validation round's global model (round {report['final']['best_val_round']})" in out
    assert "Dice LCC" in out and str(tmp / "server" / "best_val_model.pt") in out
    summary = (tmp / "server" / "summary.md").read_text()
    assert "Best validation round's global model" in summary


def test_best_round_selection_keeps_the_earlier_of_equal_rounds_and_skips_missing_scores():
    from fedseg.fl.model_selection import BestValidationRound

    sel = BestValidationRound()
    params = {"w": torch.zeros(2)}
    assert sel.offer(0, {"a": 0.5, "b": 0.7}, params)
    assert not sel.offer(1, {"a": 0.6, "b": 0.6}, {"w": torch.ones(2)})  # equal mean: the earlier round stays
    assert not sel.offer(2, {"a": float("nan")}, params)
    assert sel.offer(3, {"a": 0.9}, {"w": torch.full((2,), 3.0)})
    restored = BestValidationRound()
    restored.load_state_dict(sel.state_dict())
    assert restored.best_round == 3 and torch.equal(restored.params["w"], torch.full((2,), 3.0))


# ---------------------------------------------------------------------------------- the bench's protocol
def test_every_method_of_a_paper_bench_trains_with_one_protocol(tmp_path):
    from fedseg.bench.runs import Budget
    from fedseg.recipes import comparison_protocol, paper_protocol
    from fedseg.recipes.export import export_job
    from fedseg.recipes.fedevi import PAPER_PROFILES

    protocol = paper_protocol("fedevi")
    assert set(protocol["train_config"]) == set(LOCAL_PROTOCOL_KEYS)
    for key, value in PAPER_PROFILES["paper"]["train_config"].items():
        if key in LOCAL_PROTOCOL_KEYS:
            assert protocol["train_config"][key] == value
    budget = Budget(profile="paper", rounds=2, sets={"image_size": 32}, protocol="fedevi")
    configs = {}
    for method in ("fedavg", "graphfedseg", "fvac", "fedevi"):
        job = export_job(method, tmp_path / method, "paper", num_rounds=budget.num_rounds(), **budget.overrides(0))
        config = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
        (args,) = [w["args"] for w in config["workflows"] if w["path"].endswith("FedSegController")]
        configs[method] = {k: args["train_config"][k] for k in LOCAL_PROTOCOL_KEYS}
        assert args["num_rounds"] == 2
    # FVAC's own paper profile (AdamW, strong augmentation, 5 epochs) and GraphFedSeg's (lr 5e-4, batch 4) give way
    assert all(c == configs["fedevi"] for c in configs.values())
    assert configs["fedavg"]["image_size"] == 32 and configs["fedavg"]["augment_level"] == "flip"
    assert comparison_protocol(["fedavg", "fedevi"]) == "fedevi"
    assert comparison_protocol(["fedavg", "scaffold"]) == "fedavg"
    with pytest.raises(ValueError, match="--protocol"):
        comparison_protocol(["fedevi", "graphfedseg"])
    assert comparison_protocol(["fedevi", "graphfedseg"], "graphfedseg") == "graphfedseg"


def test_a_bench_without_a_protocol_keeps_its_stored_run_config():
    from fedseg.bench.runs import Budget

    assert "protocol" not in Budget().to_dict()  # benches stored before protocols resume as they are
    assert Budget(protocol="fedevi").to_dict()["protocol"] == "fedevi"
    assert Budget(rounds=3).overrides(1) == {"seed": 1}


def test_the_reference_runs_of_a_paper_bench_train_with_its_protocol(monkeypatch):
    from fedseg.bench import runs

    monkeypatch.setattr(runs, "federation_task", lambda mapping: "segmentation")
    resolved = runs.reference_config(runs.Budget(profile="paper", protocol="fedevi", local_epochs=1), 0, {"site-1": "x"})
    assert resolved["num_rounds"] == 200  # FedEvi's paper rounds
    cfg = resolved["train_config"]
    assert (cfg["network_variant"], cfg["intensity"], cfg["batch_size"], cfg["local_epochs"]) == (
        "three_conv_nearest", "image_max", 8, 1)
    with pytest.raises(ValueError, match="protocol or rounds"):
        runs.reference_config(runs.Budget(profile="paper"), 0, {"site-1": "x"})


def test_fedevi_paper_profile_computes_the_surrogate_as_the_reference_code(tmp_path):
    from fedseg.bench.inprocess import controller_args

    paper = controller_args("fedevi", tmp_path / "p", profile="paper", image_size=32)["objective_args"]
    default = controller_args("fedevi", tmp_path / "d", profile="default")["objective_args"]
    chosen = controller_args("fedevi", tmp_path / "c", profile="paper", image_size=32, uncertainty_grid="image")["objective_args"]
    assert (paper["uncertainty_grid"], paper["clamp_epistemic"]) == ("network", False)
    assert (default["uncertainty_grid"], default["clamp_epistemic"]) == ("image", True)
    assert chosen["uncertainty_grid"] == "image"


def test_fedevi_surrogate_on_the_network_grid(tmp_path):
    """G with ``uncertainty_grid="network"`` is the mean over validation images of the pixel-mean epistemic uncertainty
    of the logits on the network's grid (the resized image), recomputed here with SciPy; the image grid differs."""
    from scipy.special import digamma

    from fedseg.data.synthetic import generate_federation
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import RoundContext
    from fedseg.objectives.fedevi import FedEviObjective

    sites = generate_federation("polyp", ["site-1"], tmp_path, profile="tiny", image_size=48)  # network grid: 32 px
    engine = SegEngine("site-1", sites["site-1"], resolve_profile("tiny", None, None)["train_config"])
    model = engine.build_network()
    ctx = RoundContext(site="site-1", round=0, total_rounds=1, state_dir=str(tmp_path / "state"),
                       server_meta={"fedevi": {"round": 0}})
    expected = []
    model.eval()
    with torch.no_grad():
        for batch in engine.loader("validation"):
            assert batch["image"].shape[-1] == 32
            alpha = np.exp(np.minimum(model(batch["image"]).double().numpy(), 80.0)) + 1.0
            strength = alpha.sum(axis=1)
            rho = alpha / strength[:, None]
            aleatoric = digamma(strength + 1.0) - (rho * digamma(alpha + 1.0)).sum(axis=1)
            expected.append(float((-(rho * np.log(rho)).sum(axis=1) - aleatoric).mean()))
    stats_ = {}
    for grid in ("network", "image"):
        objective = FedEviObjective(uncertainty_grid=grid, clamp_epistemic=False)
        objective.end_round(ctx, model, engine)
        stats_[grid] = objective.handle_task("evaluate_surrogate", ctx, model, engine)
    assert stats_["network"]["G"] == pytest.approx(np.mean(expected), rel=1e-5)
    assert stats_["image"]["G"] != pytest.approx(np.mean(expected), rel=1e-5)
