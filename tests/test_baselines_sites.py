"""The baselines on the real engine and the real server workflow, in process (tiny data, seconds per run):
FedProx(mu=0) is FedAvg bit for bit, Ditto's personal model approaches the global one as lambda grows, every
method's site state survives a site-process restart (and is what makes the difference), and the cross-site
evaluation matrix."""

from __future__ import annotations

import argparse

import pytest
import torch

from fedseg.bench.runs import parse_variant
from fedseg.data.synthetic import generate_site_data
from fedseg.fl.client import SiteRunner
from fedseg.fl.protocol import META_KEY, SUBMIT_MODEL_TASK, TRAIN_TASK
from fedseg.recipes import get_recipe_class
from fedseg.recipes.base import build_initial_network
from inprocess import run_in_process

SITES = ("site-1", "site-2")


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline_sites")
    return {s: str(generate_site_data("polyp", s, root, profile="tiny")) for s in SITES}


@pytest.fixture(scope="module")
def site_config(tiny_train_config):
    # no augmentation: a restarted site must then reproduce the uninterrupted one bit for bit
    return {**tiny_train_config, "augment": False, "local_epochs": 1}


def _runner(workspace, datalist):
    args = argparse.Namespace(datalist=str(datalist), site_datalists=None, data_root=None, bundle_dir=None)
    return SiteRunner("site-a", args, workspace=str(workspace))


def _meta(cfg, round_, objective, options, total=3):
    return {META_KEY: {"method": objective, "objective": objective, "objective_args": options, "train_config": cfg,
                       "round": round_, "total_rounds": total}}


def _train_rounds(workspace, datalist, cfg, objective, options, rounds=2):
    runner = _runner(workspace, datalist)
    start = build_initial_network(cfg).state_dict()
    outs = [runner.handle(TRAIN_TASK, {k: v.clone() for k, v in start.items()}, _meta(cfg, r, objective, options)) for r in range(rounds)]
    return outs, runner


# ------------------------------------------------------------------------------------------------ FedProx
def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(tmp_path, tiny_datalist, site_config):
    fedavg, _ = _train_rounds(tmp_path / "avg", tiny_datalist, site_config, "fedavg", {})
    prox0, _ = _train_rounds(tmp_path / "prox0", tiny_datalist, site_config, "fedprox", {"mu": 0.0})
    for a, b in zip(fedavg, prox0):
        assert a["params"].keys() == b["params"].keys()
        assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
        assert a["metrics"]["train_loss"] == b["metrics"]["train_loss"]
    # the comparison can fail: a proximal weight changes the trained model
    prox, _ = _train_rounds(tmp_path / "prox", tiny_datalist, site_config, "fedprox", {"mu": 1.0}, rounds=1)
    assert not all(torch.equal(fedavg[0]["params"][k], prox[0]["params"][k]) for k in prox[0]["params"])


def test_fedprox_ablation_row_parses_and_builds():
    label, method, args = parse_variant("prox0=fedprox:mu=0")
    assert (label, method, args) == ("prox0", "fedprox", {"mu": 0})
    assert get_recipe_class(method)(profile="tiny", **args).name == "fedprox"
    with pytest.raises(ValueError, match="mu"):
        get_recipe_class("fedprox")(mu=-1)


# ------------------------------------------------------------------------------------------------ Ditto
def _distance(a, b):
    return float(torch.sqrt(sum(((a[k].float() - b[k].float()) ** 2).sum() for k in a if a[k].is_floating_point())))


def test_ditto_personal_model_approaches_the_global_model_as_lambda_grows(tmp_path, tiny_datalist, site_config):
    """With plain SGD (Ditto's optimiser) the personal model's distance to the received global model shrinks like
    ||grad L|| / lambda while lr * lambda <= 1. (With Adam it stops at about one Adam step per weight from it:
    Adam's step does not shrink with the gradient; docs/methods.md.)"""
    cfg = {**site_config, "optimizer_name": "SGD", "learning_rate": 0.01}
    start = build_initial_network(cfg).state_dict()
    distances = []
    for lam in (0.0, 10.0, 50.0, 100.0):
        runner = _runner(tmp_path / f"lam{lam}", tiny_datalist)
        out = runner.handle(TRAIN_TASK, {k: v.clone() for k, v in start.items()}, _meta(cfg, 0, "ditto", {"ditto_lambda": lam}))
        assert out["metrics"]["personal_steps"] == out["metrics"]["steps"] > 0
        submitted = runner.handle(SUBMIT_MODEL_TASK, {k: v.clone() for k, v in start.items()}, _meta(cfg, 3, "ditto", {"ditto_lambda": lam}))
        distances.append(_distance(submitted["params"], start))
    assert distances == sorted(distances, reverse=True) and len(set(distances)) == 4, distances
    assert distances[-1] < 0.35 * distances[0], distances


# ------------------------------------------------------------------------------------------------ restarts
STATEFUL = [
    ("scaffold", "scaffold_control.pt", {}),
    ("moon", "moon_previous_model.pt", {}),
    ("feddyn", "feddyn_state.pt", {"alpha": 0.1}),
    ("fedce", "fedce_previous_model.pt", {}),
    ("ditto", "ditto_personal.pt", {}),
    ("fedbn", "fedbn_local_layers.pt", {}),
    ("fedrep", "fedrep_local_layers.pt", {}),
]


def _outcome(report):
    """The final global model (last saved) and the personalised checkpoints of an in-process run."""
    controller = report["_controller"]
    final = controller.saved[-1]
    personal = {}
    for site, rel in (report["final"].get("personalized_checkpoints") or {}).items():
        personal[site] = torch.load(controller.run_dir / rel, map_location="cpu", weights_only=False)["model"]
    return final, personal


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


@pytest.mark.parametrize("method, state_file, options", STATEFUL, ids=[m for m, _, _ in STATEFUL])
def test_site_state_survives_a_site_restart(tmp_path, two_sites, method, state_file, options):
    """Two rounds uninterrupted vs every site process replaced before round 1 (the state of round 0 is all the
    second round has): the same models bit for bit. With the method's state file deleted at the restart, they
    differ: the state is what carries the method."""
    kw = dict(num_rounds=2, local_epochs=1, augment=False, **options)
    runs = {}
    for name, restart in (("uninterrupted", {}), ("restarted", {"restart_before": 1}),
                          ("forgotten", {"restart_before": 1, "forget": state_file})):
        report = run_in_process(method, two_sites, tmp_path / name, **restart, **kw)
        runs[name] = _outcome(report)
        if restart:
            assert report["_controller"].restarted
            state = tmp_path / name / "sites" / SITES[0] / "fedseg_state" / SITES[0] / state_file
            assert state.is_file(), f"{method} keeps no {state_file}"
    (glob_a, pers_a), (glob_b, pers_b), (glob_c, pers_c) = runs["uninterrupted"], runs["restarted"], runs["forgotten"]
    assert _same(glob_a, glob_b) and all(_same(pers_a[s], pers_b[s]) for s in pers_a)
    differs = not _same(glob_a, glob_c) or any(not _same(pers_a[s], pers_c[s]) for s in pers_a)
    assert differs, f"{method}: deleting {state_file} changed nothing"


# ------------------------------------------------------------------------------------------------ cross-site
def test_cross_site_matrix_and_what_fedbn_sends(tmp_path, two_sites):
    report = run_in_process("fedbn", two_sites, tmp_path, num_rounds=2)
    controller = report["_controller"]
    final = report["final"]
    assert "global" not in final  # FedBN has no complete global model: its sites' own models are evaluated
    cross = final["cross_site"]
    assert cross["models"] == cross["test_sites"] == list(SITES) and cross["global"] is None
    for i, m in enumerate(SITES):
        assert cross["dice"][i][i] == final["personalized"][m]["dice"]  # the diagonal: each model at home
        assert all(0.0 <= v <= 1.0 for v in cross["dice"][i])
    # an off-diagonal cell is the site's own evaluation of the other site's submitted model
    owners = [t for t in controller.sent if t["task"] == "evaluate" and t["meta"].get("model_name", "").startswith("cross_site_")]
    assert sorted((t["meta"]["model_name"], tuple(t["targets"])) for t in owners) == [
        ("cross_site_site-1", ("site-2",)), ("cross_site_site-2", ("site-1",))]
    # the norm layers never travelled during training: train tasks and train results carry the shared entries only
    norm_keys = {k for k in build_initial_network({**controller.train_config}).state_dict() if ".adn.N." in k}
    assert norm_keys
    for task in controller.sent:
        if task["task"] == "train":
            assert not norm_keys & set(task["keys"])
    submitted = [t for t in controller.sent if t["task"] == SUBMIT_MODEL_TASK]
    assert len(submitted) == 1 and sorted(submitted[0]["targets"]) == list(SITES)
    run_dir = controller.run_dir
    assert (run_dir / "plots" / "cross_site_dice.png").is_file()
    assert "## Cross-site evaluation" in (run_dir / "summary.md").read_text()
