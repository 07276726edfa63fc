"""A site training as N ranks (``fedseg.engine.distributed``; recipe ``site_executor="client_api_torchrun"``).

Two CPU ranks (gloo, spawned here as torchrun would start them) against one rank of the same path, same global batch:

* one round of FedAvg and of GraphFedSeg (similarity regulariser on, so the objective's references to the model's
  parameters must reach the other rank intact) gives the same parameters, to 1e-12. The ranks run the network in
  float64. Not because the two paths do different maths: with two ranks a gradient is the gloo all-reduce of two
  one-image gradients, with one rank the batched backward sums the same terms in another order. In float32 the
  rounding of that order (~1e-5 in the activations after a few instance norms) decides, now and then, on which side
  of a ReLU's kink a pre-activation close to zero falls. Seen once on a 2-core AMD EPYC, by re-computing the 1-rank
  run's 4th step in float64 (a diagnosis, not a check of this suite): a deep decoder unit at 9e-7 flipped, the
  step's gradient was 1.7 % off, and the round's parameters ended 1.1e-4 apart (1 % of its update). Whether a run
  meets a flip depends on the CPU's kernels, so no float32 tolerance both holds everywhere and still sees a lost
  share of the regulariser (~3 % of the update). In float64 the rounding is ~1e-14, a flip is out of reach and the
  two paths agree to ~1e-16.
  The round uses SGD (lr 0.01, 2 epochs, 8 steps): Adam divides by the gradient's running magnitude, so on
  parameters whose gradient is zero up to rounding (conv biases ahead of instance norm, which removes any
  per-channel constant) it turns rounding noise into steps of +-lr that differ with the summation order. The tiny
  network normalises with instance norm (per image): no batch statistics that could differ between a rank's half
  batch and the global batch. Augmentation is off (random transforms draw per process);
* GraphFedSeg's uncertainty, a pass after training on rank 0 alone over every training image, is exactly what one
  process computes with the two-rank model; its ``last_epoch`` variant, recorded during the epochs on each rank's
  share, is gathered on rank 0 and equals one rank's to float tolerance;
* the job exported with ``site_executor="client_api_torchrun"`` carries the torchrun launch command, and one round
  runs in NVFlare's simulator with two ranks at the site.

Both the rank comparison and the simulator round run in the background as shared runs (``site_ranks_parity``,
``site_ranks``; tests/sim_utils.py); the tests read what they left.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from fedseg.fl.protocol import META_KEY, TRAIN_TASK

#: parameters of one round with 2 ranks and with 1 rank, networks in float64, agree to this (module docstring)
PARAM_ATOL = 1e-12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _direction(cfg):
    """A GraphFedSeg neighbour direction (the server's d_i) over every parameter: another network's unit weights."""
    from fedseg.bundle import build_network

    other = build_network({**cfg, "init_seed": 123}) if "init_seed" in cfg else build_network(cfg)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    named = dict(other.named_parameters())
    norm = torch.sqrt(sum((p.detach().double() ** 2).sum() for p in named.values()))
    return {k: (p.detach().double() / norm).float() for k, p in named.items()}


def _cases(cfg):
    """``{name: (objective, objective_args, extra meta)}``: the train tasks each group of ranks answers in turn."""
    graph = {"graphfedseg": {"lambda1": 0.5, "direction": _direction(cfg)}}
    return {
        "fedavg": ("fedavg", {}, {}),
        "graphfedseg": ("graphfedseg", {}, graph),
        "graphfedseg_last_epoch": ("graphfedseg", {"uncertainty_pass": "last_epoch"}, graph),
    }


def _meta(cfg, objective, objective_args, extra):
    job = {"method": objective, "objective": objective, "objective_args": objective_args, "train_config": cfg,
           "round": 1, "total_rounds": 2}
    return {META_KEY: job, **extra}


@contextmanager
def _networks_in_float64():
    """Networks built here are float64 and run on their inputs cast to float64 (module docstring: why)."""
    from fedseg.networks.unet import FeatureUNet

    dtype, run = torch.get_default_dtype(), FeatureUNet._run

    def run_in_parameter_dtype(self, x):
        return run(self, x.to(next(self.parameters()).dtype))

    torch.set_default_dtype(torch.float64)
    FeatureUNet._run = run_in_parameter_dtype
    try:
        yield
    finally:
        FeatureUNet._run = run
        torch.set_default_dtype(dtype)


def _rank_main(rank: int, world: int, port: int, datalist: str, cfg: dict, initial: dict, out: str) -> None:
    """One rank: rank 0 answers every case's train task through ``SiteRunner``; the others follow."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with _networks_in_float64():
        _rank_rounds(rank, world, datalist, cfg, initial, out)


def _rank_rounds(rank: int, world: int, datalist: str, cfg: dict, initial: dict, out: str) -> None:
    from fedseg.engine.distributed import STOP, RankGroup, follow
    from fedseg.engine.factory import build_engine
    from fedseg.fl.client import SiteRunner, parse_args

    ranks = RankGroup.from_env()
    try:
        if rank:
            follow(ranks, build_engine)
            return
        runner = SiteRunner("site-a", parse_args(["--datalist", datalist]), workspace=str(Path(out) / "ws"), ranks=ranks)
        results = {}
        for name, (objective, args, extra) in _cases(cfg).items():
            results[name] = runner.handle(TRAIN_TASK, dict(initial), _meta(cfg, objective, args, extra))
        if world > 1:
            ranks.send(STOP)
        torch.save(results, Path(out) / "results.pt")
    finally:
        ranks.close()


def _initial_weights(cfg) -> dict:
    """The round's start: the bundle network's float32 initial weights, in float64."""
    from fedseg.bundle import build_network

    return {k: v.double() for k, v in build_network(cfg).state_dict().items()}


def _run_ranks(world: int, datalist, cfg, initial, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank_main, args=(world, _free_port(), str(datalist), cfg, initial, str(out)),
                       nprocs=world, join=True, start_method="spawn")
    return torch.load(out / "results.pt", weights_only=False)


def ranks_parity_run(root: Path):
    """Shared run ``site_ranks_parity`` (tests/sim_utils.py): every case of :func:`_cases` answered by one rank and
    by two ranks (spawned as torchrun would start them) on the tiny polyp site; the readers get
    ``(cfg, datalist, one, two)``. The inputs are made here (building the network parses the bundle); the ranks run
    in a fork of the session's launcher (``sim_fork``), the one rank in that process itself."""
    from fedseg.config import resolve_profile
    from fedseg.data.synthetic import generate_site_data
    from sim_utils import run_call

    cfg = {**resolve_profile("tiny")["train_config"], "augment": False, "optimizer_name": "SGD", "learning_rate": 0.01,
           "local_epochs": 2}
    datalist = generate_site_data("polyp", "site-a", root / "data", profile="tiny")
    torch.save({"cfg": cfg, "datalist": str(datalist), "initial": _initial_weights(cfg)}, root / "inputs.pt")

    def run():
        run_call(["test_site_ranks:one_and_two_ranks_main", root], root / "ranks.log")
        load = lambda name: torch.load(root / name / "results.pt", weights_only=False)  # noqa: E731
        return cfg, datalist, load("one"), load("two")

    return run


def one_and_two_ranks_main(argv) -> int:
    """``argv``: the run's folder. One rank in this process (as the spawned rank would, ``_rank_main``), then two
    spawned ranks; each writes ``results.pt`` under ``one/`` and ``two/``."""
    root = Path(argv[0])
    inputs = torch.load(root / "inputs.pt", weights_only=False)
    (root / "one").mkdir(exist_ok=True)
    _rank_main(0, 1, _free_port(), inputs["datalist"], inputs["cfg"], inputs["initial"], str(root / "one"))
    _run_ranks(2, inputs["datalist"], inputs["cfg"], inputs["initial"], root / "two")
    return 0


@pytest.fixture(scope="module")
def one_and_two_ranks(shared_runs):
    return shared_runs("site_ranks_parity")


@pytest.mark.shared_runs("site_ranks_parity")
@pytest.mark.parametrize("case", ["fedavg", "graphfedseg", "graphfedseg_last_epoch"])
def test_two_ranks_train_like_one_with_the_same_global_batch(one_and_two_ranks, case):
    cfg, _, one, two = one_and_two_ranks
    a, b = one[case], two[case]
    initial = _initial_weights(cfg)
    assert a["params"].keys() == b["params"].keys() == initial.keys()
    assert {v.dtype for v in a["params"].values()} == {v.dtype for v in b["params"].values()} == {torch.float64}
    assert a["metrics"]["steps"] == b["metrics"]["steps"] == 2 * 8 / 2  # 2 epochs of 8 images in global batches of 2
    moved = max(float((a["params"][k] - initial[k]).abs().max()) for k in initial)
    assert moved > 1e-4, "the round did not train"
    worst = max(float((a["params"][k] - b["params"][k]).abs().max()) for k in initial)
    assert worst < PARAM_ATOL, (case, worst)
    assert a["metrics"]["train_loss"] == pytest.approx(b["metrics"]["train_loss"], rel=1e-12)
    # validation runs once, on rank 0, over the whole validation split
    assert a["metrics"]["val_dice"] == pytest.approx(b["metrics"]["val_dice"], abs=1e-12)
    if case.startswith("graphfedseg"):
        assert a["meta"]["uncertainty"] == pytest.approx(b["meta"]["uncertainty"], rel=1e-12)


@pytest.mark.shared_runs("site_ranks_parity")
def test_uncertainty_pass_runs_once_over_the_whole_site(one_and_two_ranks):
    """The after-training U_i of the two-rank run is one process's U_i of the two-rank model, bit for bit."""
    from fedseg.engine import SegEngine
    from fedseg.objectives.base import RoundContext
    from fedseg.objectives.graphfedseg import GraphFedSegObjective

    cfg, datalist, _, two = one_and_two_ranks
    with _networks_in_float64():
        engine = SegEngine("site-a", datalist, {**cfg, "foundation_ckpt": None})
        model = engine.build_network()
        model.load_state_dict(two["graphfedseg"]["params"])
        objective = GraphFedSegObjective()
        ctx = RoundContext(site="site-a", round=1, total_rounds=2, server_meta={}, train_config=engine.train_config)
        objective.begin_round(ctx, model)
        uncertainty = objective.end_round(ctx, model, engine)["uncertainty"]
    assert uncertainty == two["graphfedseg"]["meta"]["uncertainty"]


def test_ranked_site_option_and_its_launch_command(tmp_path):
    from fedseg.fl.site_executor import FedSegRanksExecutor, torchrun_command
    from fedseg.recipes.base import SiteScript

    command = torchrun_command(4, "--site_datalists sites.json")
    assert shlex.split(command) == ["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=4", "-m",
                                    "fedseg.fl.site_ranks", "--site_datalists", "sites.json"]
    assert FedSegRanksExecutor(command).execution_mode == "external_process"
    with pytest.raises(ValueError, match="site_ranks"):
        torchrun_command(0)
    with pytest.raises(ValueError, match="site_ranks"):
        SiteScript("", "native", site_ranks=2)  # N ranks asked for, one process would train
    with pytest.raises(SystemExit):
        torchrun_command(2, "--no_such_option x")


def test_batch_not_divisible_by_the_ranks_is_refused():
    from fedseg.engine.distributed import RankGroup

    with pytest.raises(ValueError, match="divisible"):
        RankGroup(rank=0, world_size=2, local_rank=0, device=torch.device("cpu")).per_rank_batch(3)
    assert RankGroup(rank=0, world_size=2, local_rank=0, device=torch.device("cpu")).per_rank_batch(4) == 2


def _export_torchrun_job(tmp_path, tiny_datalist, ranks=2):
    """FedAvg, tiny profile, one round of one epoch, one site (``min_clients=1``) training as ``ranks`` ranks."""
    from fedseg.recipes.export import export_job

    return export_job("fedavg", tmp_path / "jobs", profile="tiny", num_rounds=1, min_clients=1, augment=False,
                      local_epochs=1, site_executor="client_api_torchrun", site_ranks=ranks,
                      script_args=f"--datalist {tiny_datalist}")


def _client_executor(job: Path) -> dict:
    [config] = job.rglob("config_fed_client.json")
    [entry] = json.loads(config.read_text())["executors"]
    return entry["executor"]


def test_exported_job_carries_the_launch_command(tmp_path, tiny_datalist):
    executor = _client_executor(_export_torchrun_job(tmp_path, tiny_datalist))
    assert executor["path"] == "fedseg.fl.site_executor.FedSegRanksExecutor"
    assert shlex.split(executor["args"]["command"]) == [
        "torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=2", "-m", "fedseg.fl.site_ranks",
        "--datalist", str(tiny_datalist)]


def ranks_run(root: Path):
    """Shared run ``site_ranks`` (tests/sim_utils.py): the torchrun job of :func:`_export_torchrun_job` on a tiny polyp
    site (the ``tiny_datalist`` data), one site, in the simulator."""
    from fedseg.data.synthetic import generate_site_data
    from sim_utils import run_simulator

    job = _export_torchrun_job(root, generate_site_data("polyp", "site-a", root / "data", profile="tiny"))
    return lambda: run_simulator(job, root / "ws", n_clients=1)


@pytest.mark.slow
@pytest.mark.shared_runs("site_ranks")
def test_one_round_in_the_simulator_with_two_ranks_per_site(shared_runs):
    """One site, two CPU ranks under torchrun, FedAvg, one round: the round completes with the site's update."""
    report = shared_runs("site_ranks")
    [round_] = report["rounds"]
    assert round_["missing"] == [] and round_["rejected"] == {}, round_
    assert round_["metrics"]["site-1"]["steps"] == 8 / 2  # one epoch of 8 images, global batch 2
    assert set(report["final"]["global"]["site-1"]) == {"dice", "hd95", "assd"}  # rank 0 evaluated after training
