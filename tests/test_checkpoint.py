"""Server restart: strategy state round trips and the controller's round checkpoint.

The reference for "continues identically" is the same strategy object run without interruption: a
strategy restored from a checkpoint written after round r (into a fresh object started from a
*different* initial model, as a re-submitted job may be) must send the same payloads and produce the
same aggregate, report fields and final models in every later round.
"""

from __future__ import annotations

import io
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import torch

from fedseg.fl.protocol import unpack_models
from fedseg.foundation.topology import gossip_mix
from fedseg.networks.unet import FeatureUNet
from fedseg.strategies import ClientUpdate, build_strategy
from fedseg.strategies.base import SitePayload

SITES = ["site-a", "site-b", "site-c"]
N_SAMPLES = {"site-a": 12, "site-b": 5, "site-c": 30}
ROUNDS = 3
TINY = dict(in_channels=3, out_channels=2, channels=(8, 16, 32, 64))


# ------------------------------------------------------------------------------------ fake sites
def _small_model(seed: int) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": torch.randn(4, 3, 3, 3, generator=gen),
        "conv.bias": torch.randn(4, generator=gen),
        "bn.running_mean": torch.randn(4, generator=gen),
        "bn.num_batches_tracked": torch.tensor(seed),
        "head.weight": torch.randn(2, 4, 1, 1, generator=gen),
    }


def _unet_model(seed: int) -> Dict[str, torch.Tensor]:
    return FeatureUNet(**TINY, init_seed=seed, feature_alignment=True).state_dict()


def _shifted(params: Dict[str, torch.Tensor], seed: int) -> Dict[str, torch.Tensor]:
    """``params`` plus seeded noise on the float entries: what a site's local training returns."""
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) if torch.is_floating_point(v) else v.clone() for k, v in params.items()}


class FakeSites:
    """Deterministic site answers, a function of (round, site, what the site was sent) only.

    ``train`` returns the payload's main model plus noise seeded by (round, site) and the declared
    statistics each method needs; FedEvi's surrogate task, FedEFM's overseas and gossip tasks are
    answered in the same way, so two strategies that send the same payloads get the same answers.
    """

    def __init__(self, method: str):
        self.method = method
        self.round = 0

    def train(self, payloads: Dict[str, SitePayload]) -> Dict[str, ClientUpdate]:
        out = {}
        for i, (site, payload) in enumerate(sorted(payloads.items())):
            main, _ = unpack_models(payload.params)
            seed = 1000 * (self.round + 1) + i
            meta: Dict[str, Any] = {}
            if self.method == "graphfedseg":
                meta["uncertainty"] = 0.1 + 0.07 * i + 0.01 * self.round
            if self.method == "pathfl":
                rng = np.random.default_rng(seed)
                meta = {
                    "ssa_noise": rng.normal(0.5, 0.2, size=(2, 3, 16, 16)).astype(np.float32),
                    "cse_mean": [0.1 * i, 0.2, 0.3 + self.round],
                    "cse_std": [0.1, 0.1 + 0.01 * i, 0.1],
                    "afa_mean": 0.4 + 0.1 * i,
                    "afa_sq_mean": 0.5 + 0.1 * i,
                }
            if self.method == "fedefm":
                meta["teacher_emd"] = 0.5 + i
            out[site] = ClientUpdate(site=site, params=_shifted(main, seed), n_samples=N_SAMPLES[site], metrics={"val_dice": 0.5}, meta=meta)
        return out

    def __call__(self, task: str, payloads: Dict[str, SitePayload]) -> Dict[str, ClientUpdate]:
        out = {}
        for i, (site, payload) in enumerate(sorted(payloads.items())):
            main, models = unpack_models(payload.params)
            if task == "evaluate_surrogate":
                meta = {"G": 0.05 + 0.05 * i + 0.01 * self.round, "A": 0.5 - 0.1 * i}
                out[site] = ClientUpdate(site=site, params={}, meta=meta)
            elif task == "overseas_train":
                trained = {n: _shifted(m, 7 * self.round + i) for n, m in models.items()}
                out[site] = ClientUpdate(site=site, params={}, n_samples=1, models=trained)
            elif task == "gossip":
                out[site] = ClientUpdate(site=site, params=gossip_mix(main, list(models.values()), 0.5), n_samples=1)
            else:
                raise AssertionError(f"unexpected task {task}")
        return out


CASES: Dict[str, Callable[[], tuple]] = {
    "fedavg": lambda: ("fedavg", {}, _small_model),
    "fedevi": lambda: ("fedevi", {}, _small_model),
    "graphfedseg": lambda: ("graphfedseg", {"solver": "closed_form"}, _small_model),
    "pathfl": lambda: ("pathfl", {}, _unet_model),
    "fedefm-cfl": lambda: ("fedefm", {"mode": "cfl"}, _small_model),
    "fedefm-dfl": lambda: ("fedefm", {"mode": "dfl", "topology": "full"}, _small_model),
}


def _new(name: str, options: Dict[str, Any], initial: Dict[str, torch.Tensor]):
    strategy = build_strategy(name, **options)
    if getattr(strategy, "needs_network", False):
        strategy.network_factory = lambda: FeatureUNet(**TINY, feature_alignment=True)
    strategy.total_rounds = ROUNDS
    strategy.start(SITES, initial)
    return strategy


def _run_round(strategy, sites: FakeSites, round_: int, log: List[Any]) -> None:
    sites.round = round_
    payloads = {s: strategy.payload(s, round_) for s in SITES}
    updates = sites.train(payloads)
    fields = strategy.aggregate(round_, updates, sites)
    log.append((payloads, fields, {k: v.clone() for k, v in strategy.global_params().items()}))


def _through_file(state: Dict[str, Any]) -> Dict[str, Any]:
    """What a restarted server reads back: torch.save + torch.load(weights_only=True)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Exact equality of nested dicts/lists of tensors, arrays, numbers, strings (and SitePayloads)."""
    if isinstance(a, SitePayload):
        assert isinstance(b, SitePayload), where
        assert_same(a.params, b.params, where + ".params")
        assert_same(a.meta, b.meta, where + ".meta")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(a), sorted(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("stop_after", [0, 1])
def test_restored_strategy_continues_identically(case, stop_after):
    name, options, make_model = CASES[case]()
    reference_log: List[Any] = []
    reference = _new(name, options, make_model(0))
    sites = FakeSites(name)
    state = None
    for r in range(ROUNDS):
        _run_round(reference, sites, r, reference_log)
        if r == stop_after:
            state = _through_file(reference.state_dict())
    reference_final = reference.finish()

    # a fresh server process: another initial model, then the checkpoint
    restored = _new(name, options, make_model(99))
    restored.load_state_dict(state)
    restored_log: List[Any] = reference_log[: stop_after + 1]
    sites = FakeSites(name)
    for r in range(stop_after + 1, ROUNDS):
        _run_round(restored, sites, r, restored_log)
    assert_same(restored_log, reference_log, case)
    assert_same(restored.finish(), reference_final, "finish")
    assert_same(restored.global_params(), reference.global_params(), "global")
    assert_same(restored.personalized_params(), reference.personalized_params(), "personalized")


def test_state_carries_each_methods_own_state():
    """The stateful fields of the methods: FedEvi's beta, GraphFedSeg's graph + personalised models, PathFL's pool."""
    got = {}
    for case in ("fedevi", "graphfedseg", "pathfl", "fedefm-dfl"):
        name, options, make_model = CASES[case]()
        strategy = _new(name, options, make_model(0))
        sites = FakeSites(name)
        _run_round(strategy, sites, 0, [])
        got[case] = _through_file(strategy.state_dict())
    assert sum(got["fedevi"]["beta"].values()) == pytest.approx(1.0) and set(got["fedevi"]["beta"]) == set(SITES)
    assert got["graphfedseg"]["graph"].shape == (3, 3) and set(got["graphfedseg"]["personal"]) == set(SITES)
    assert len(got["pathfl"]["styles"]) == 3
    assert set(got["fedefm-dfl"]["experts"]) == set(SITES)


def test_state_of_another_run_is_refused():
    fedavg = _new("fedavg", {}, _small_model(0))
    state = fedavg.state_dict()
    with pytest.raises(ValueError, match="strategy 'fedavg'"):
        _new("fedevi", {}, _small_model(0)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"options: \['weighting'\]"):
        _new("fedavg", {"weighting": "uniform"}, _small_model(0)).load_state_dict(state)
    other_sites = build_strategy("fedavg")
    other_sites.start(["site-a", "site-b"], _small_model(0))
    with pytest.raises(ValueError, match="sites"):
        other_sites.load_state_dict(state)


# ------------------------------------------------------------------------------ round checkpoint file
from fedseg.fl.checkpoint import CHECKPOINT_NAME, CheckpointMismatchError, load_checkpoint, save_checkpoint  # noqa: E402

CONFIG = {"num_rounds": 4, "strategy": "fedevi", "train_config": {"channels": (8, 16), "image_size": 32}}


def _save_after(tmp_path, round_: int, strategy, config=CONFIG):
    state = strategy.state_dict()
    rounds = [{"round": r, "metrics": {"site-a": {"val_dice": np.float32(0.5)}}, "beta": {"site-a": 1.0}} for r in range(round_ + 1)]
    return save_checkpoint(
        tmp_path, config=config, completed_round=round_, global_params=state["global"], strategy_state=state,
        rounds=rounds, resumed_at=[],
    )


def test_checkpoint_round_trip_restores_the_strategy(tmp_path):
    name, options, make_model = CASES["fedevi"]()
    strategy = _new(name, options, make_model(0))
    _run_round(strategy, FakeSites(name), 0, [])
    path = _save_after(tmp_path, 0, strategy)
    assert path == tmp_path / CHECKPOINT_NAME and not list(tmp_path.glob("*.tmp"))
    # a config with tuples (as the recipes build it) matches its JSON form in the file
    state = load_checkpoint(tmp_path, CONFIG)
    assert state["completed_round"] == 0 and state["report"]["rounds"][0]["metrics"]["site-a"]["val_dice"] == 0.5
    assert_same(state["global"], strategy.global_params())
    restored = _new(name, options, make_model(5))
    restored.load_state_dict(state["strategy"])
    assert restored.beta == strategy.beta


def test_missing_checkpoint_means_a_fresh_start(tmp_path):
    assert load_checkpoint(tmp_path / "nothing-here", CONFIG) is None


def test_checkpoint_of_another_job_names_what_differs(tmp_path):
    strategy = _new("fedavg", {}, _small_model(0))
    _save_after(tmp_path, 0, strategy)
    other = {**CONFIG, "num_rounds": 6, "train_config": {"channels": (8, 16), "image_size": 64}}
    with pytest.raises(CheckpointMismatchError, match=r"differs in \['num_rounds', 'train_config'\]"):
        load_checkpoint(tmp_path, other)


def test_checkpoint_needs_every_round_once(tmp_path):
    strategy = _new("fedavg", {}, _small_model(0))
    state = strategy.state_dict()
    for rounds in ([{"round": 0}], [{"round": 0}, {"round": 0}, {"round": 1}]):
        with pytest.raises(ValueError, match="rounds 0..1 once each"):
            save_checkpoint(tmp_path, config=CONFIG, completed_round=1, global_params=state["global"],
                            strategy_state=state, rounds=rounds, resumed_at=[])


def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    strategy = _new("fedavg", {}, _small_model(0))
    _save_after(tmp_path, 0, strategy)

    def dies_half_way(obj, f, *a, **k):
        f.write(b"\x80\x02half a pickle")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(OSError):
        _save_after(tmp_path, 1, strategy)
    monkeypatch.undo()
    assert load_checkpoint(tmp_path, CONFIG)["completed_round"] == 0


def test_foreign_or_truncated_file_is_refused_with_its_path(tmp_path):
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=CHECKPOINT_NAME):
        load_checkpoint(tmp_path, CONFIG)
    torch.save({"format": 99}, tmp_path / CHECKPOINT_NAME)
    with pytest.raises(ValueError, match="format 1"):
        load_checkpoint(tmp_path, CONFIG)
    # a pickle that would run code is not loaded (weights_only)
    torch.save({"format": 1, "config": CONFIG, "evil": SitePayload(params={})}, tmp_path / CHECKPOINT_NAME)
    with pytest.raises(ValueError, match="not a readable"):
        load_checkpoint(tmp_path, CONFIG)


def test_export_writes_checkpoint_dir_and_task_timeout(tmp_path):
    import json

    from fedseg.cli import main

    main(["export", "--method", "fedavg", "--profile", "tiny", "--out", str(tmp_path),
          "--checkpoint-dir", "/srv/fedseg/ckpt", "--task-timeout", "120"])
    config = json.loads((tmp_path / "fedavg" / "app" / "config" / "config_fed_server.json").read_text())
    (args,) = [w["args"] for w in config["workflows"] if w["path"].endswith("FedSegController")]
    assert args["checkpoint_dir"] == "/srv/fedseg/ckpt" and args["task_timeout"] == 120
    with pytest.raises(SystemExit, match="absolute"):
        main(["export", "--method", "fedavg", "--out", str(tmp_path), "--checkpoint-dir", "ckpt"])
