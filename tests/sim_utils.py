"""Run exported jobs in NVFlare's simulator from the tests, and share one run between every test that reads it.

A simulator run costs ~20 s on 2 cores whatever it trains (NVFlare starts a server and one process per site,
each importing torch and MONAI, and shuts them down with fixed grace periods), so the tests read a small set
of *shared runs*: :data:`SHARED_RUNS` names each configuration once, and the session fixture ``shared_runs``
(``conftest.py``) runs it once and hands every test that reads it the same :class:`SimRun`. The runs the
selected tests declare (marker ``shared_runs``) are started in the background as the session begins, the
costliest first (:func:`background_order`), so that they overlap the tests that need no simulator. At most
:data:`SIMULATOR_SLOTS` runs at once (a tiny run keeps about half a core busy: most of its wall time is process
start-up and NVFlare's waits): :func:`run_simulator` takes one slot, and so does every :class:`JobSpec` (the POC,
the deployment, the killed and resumed simulator, ``fedseg bench``), which starts its NVFlare processes itself.
``tests/README.md`` says how to add a test without adding a run.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import sim_fork
from fedseg.data.checks import check_federation, federation_label_config
from fedseg.fl.faults import FAULT_ENV
from fedseg.methods import PROTOCOL_METHODS

#: the environment every simulator run gets: one torch/OpenMP thread per site process (several site processes
#: share the machine's cores; more threads only oversubscribe them, benchmarks/cost/framework_overhead.py)
SIMULATOR_ENV = {"OMP_NUM_THREADS": "1", "FEDSEG_NUM_THREADS": "1"}
#: the environment as the session started: a run started in the background does not see what a test running
#: meanwhile sets (monkeypatch.setenv)
SESSION_ENV = dict(os.environ)


class SimulatorSlots:
    """``n`` slots for NVFlare runs on this machine: :meth:`one` for a simulator run, :meth:`all` for a test that must
    have the machine to itself. Re-entrant per thread: a thread that holds slots takes no more inside (``all``
    inside ``one`` waits for the others)."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"need at least one simulator slot, got {n}")
        self.n = n
        self._free = n
        self._cond = threading.Condition()
        self._held = threading.local()

    def _take(self, k: int) -> int:
        have = getattr(self._held, "count", 0)
        need = max(0, k - have)
        with self._cond:
            self._cond.wait_for(lambda: self._free >= need)
            self._free -= need
        self._held.count = have + need
        return need

    def _give(self, k: int) -> None:
        self._held.count -= k
        with self._cond:
            self._free += k
            self._cond.notify_all()

    @contextmanager
    def one(self) -> Iterator[None]:
        taken = self._take(1)
        try:
            yield
        finally:
            self._give(taken)

    @contextmanager
    def all(self) -> Iterator[None]:
        taken = self._take(self.n)
        try:
            yield
        finally:
            self._give(taken)


#: simulator runs at once (``FEDSEG_TEST_SIMULATORS``, default 2: two tiny runs share 2 cores without slowing
#: each other much, since each spends most of its wall time starting processes and waiting)
SIMULATOR_SLOTS = SimulatorSlots(int(os.environ.get("FEDSEG_TEST_SIMULATORS", "2")))


def simulator_args(job: Path, workspace: Path, n_clients: int = 3, clients: Optional[Sequence[str]] = None,
                   gpu: Optional[str] = None) -> List[str]:
    """``nvflare simulator``'s arguments: ``JOB -w WORKSPACE -t N -n N`` (or ``-c CLIENTS``; ``-gpu GPU``)."""
    argv = [str(job), "-w", str(workspace), "-t", str(len(clients) if clients else n_clients)]
    argv += ["-c", ",".join(clients)] if clients else ["-n", str(n_clients)]
    return argv + (["-gpu", str(gpu)] if gpu is not None else [])


def simulator_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a simulator run: the session's as it started (:data:`SESSION_ENV`), one thread per
    process (:data:`SIMULATOR_ENV`), and ``env``."""
    return {**SESSION_ENV, **SIMULATOR_ENV, **(env or {})}


def run_simulator(
    job: Path, workspace: Path, n_clients: int = 3, timeout: int = 900, clients: Optional[List[str]] = None,
    env: Optional[Mapping[str, str]] = None, gpu: Optional[str] = None,
) -> Dict:
    """``nvflare simulator JOB -w WORKSPACE -n N -t N`` (or ``-c CLIENTS``; ``-gpu GPU``), started from the
    session's preloaded launcher (``sim_fork``: the simulated server does not import torch and MONAI again);
    returns report.json plus ``_path`` (its path) and ``_log`` (the simulator's output, also in
    ``WORKSPACE.log``). Fails the test on a non-zero exit."""
    workspace = Path(workspace)
    with SIMULATOR_SLOTS.one():
        # a fresh workspace with the component allow list; started again if a site process dies at start on a
        # taken port (NVFlare's simulator race; as fedseg.bench.simulator.run_simulator_command)
        proc = sim_fork.run_simulator(simulator_args(job, workspace, n_clients, clients, gpu), workspace,
                                      workspace.with_name(workspace.name + ".log"), simulator_env(env), timeout)
    log = proc.stdout
    assert proc.returncode == 0, log[-5000:]
    reports = list(workspace.rglob("report.json"))
    assert len(reports) == 1, f"expected one report.json under {workspace}, found {reports}\n{log[-3000:]}"
    return json.loads(reports[0].read_text()) | {"_path": str(reports[0]), "_log": log}


def read_audit(report: Dict) -> List[Dict]:
    path = Path(report["_path"]).parent / "privacy_audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------ shared runs
def sites(n: int) -> Tuple[str, ...]:
    """The simulator's default client names for ``-n n``: site-1 .. site-n."""
    return tuple(f"site-{i}" for i in range(1, n + 1))


@dataclass(frozen=True)
class RunSpec:
    """One simulator run: ``export_job(method, profile="tiny", **options)`` run with ``sites``.

    ``env`` is added to the simulator's environment (e.g. fault injection); ``datalists``, when given, is
    called with a folder and returns ``{site: datalist path}`` (written there), which the job receives as
    ``--site_datalists``; without it every site generates its built-in data. ``gpu`` is the simulator's
    ``-gpu`` option. ``cost``: about how many plain tiny 3-site runs it takes (:func:`background_order`).
    """

    method: str
    sites: Tuple[str, ...] = sites(3)
    options: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    datalists: Optional[Callable[[Path], Dict[str, str]]] = None
    gpu: Optional[str] = None
    profile: str = "tiny"
    cost: float = 1.0

    def but(self, **options: Any) -> "RunSpec":
        """The same run with some export options changed (a paired run: other executor, other wire dtype)."""
        return replace(self, options={**self.options, **options})


@dataclass
class SimRun:
    """What one simulator run left behind: its report, workspace and job."""

    name: str
    spec: RunSpec
    job: Path
    workspace: Path
    report: Dict

    @property
    def run_dir(self) -> Path:
        """The server's run directory (report.json, privacy_audit.jsonl, summary.md, plots/, checkpoints)."""
        return Path(self.report["_path"]).parent

    @property
    def sites(self) -> Tuple[str, ...]:
        return self.spec.sites

    def audit(self) -> List[Dict]:
        return read_audit(self.report)

    def site_outputs(self, site: str) -> Path:
        """The site's own output folder (overlays, per-image metrics, method figures)."""
        return self.workspace / site / "fedseg_outputs" / site

    def site_log(self, site: str) -> str:
        return (self.workspace / site / "log.txt").read_text()

    def global_model(self) -> Dict:
        """``FL_global_model.pt`` as saved by the server (``{"model": state dict, "train_config": ...}``)."""
        import torch

        return torch.load(next(self.workspace.rglob("FL_global_model.pt")), map_location="cpu", weights_only=False)


@dataclass(frozen=True)
class JobSpec:
    """A shared run that is not one exported job in the simulator (``fedseg bench``'s own runs, a job whose input is
    made first, a simulator killed and resumed, the POC, a provisioned deployment): ``make`` names a function
    ``"module:function"`` (a test module's) that gets the run's folder, makes its inputs and returns the part the
    background worker runs: a callable that starts at most one NVFlare run at a time, as subprocesses whose output
    goes to a file (:func:`run_cli`), and returns what the readers get. It must not build Python ASTs (no MONAI
    bundle parsing, no job export: :func:`prepare` says why); whatever needs that belongs to ``make``. ``cost``: about
    how many plain tiny 3-site simulator runs it takes (:func:`background_order`)."""

    make: str
    cost: float = 1.0


def run_cli(argv: Sequence[str], log: Path, timeout: int = 1200) -> None:
    """``python -m fedseg ARGV`` (one torch thread; a fork of the session's preloaded launcher, ``sim_fork``), its
    output to ``log``; fails with the log's end."""
    rc = sim_fork.run("fedseg", list(map(str, argv)), log, simulator_env(), timeout)
    assert rc == 0, f"fedseg {' '.join(map(str, argv))} failed:\n{log.read_text()[-5000:]}"


def run_call(argv: Sequence[str], log: Path, timeout: int = 1200, env: Optional[Mapping[str, str]] = None) -> None:
    """``argv[0]`` = ``"test_module:function"``: ``function(argv[1:])`` in a fork of the session's preloaded launcher
    (``sim_fork``; one torch thread; ``env`` added), its output to ``log``; fails with the log's end unless it
    returns 0."""
    rc = sim_fork.run("call", list(map(str, argv)), log, simulator_env(env), timeout)
    assert rc == 0, f"{argv[0]} failed:\n{log.read_text()[-5000:]}"


def run_fresh(cmd: Sequence[str], workspace: Path, log: Path, cwd: Path, timeout: float = 900, retries: int = 2,
              poll_s: float = 1.0) -> "subprocess.CompletedProcess":
    """Run a command that starts NVFlare's simulator in ``workspace`` and prepares that workspace itself (``jobs/job.py``:
    the recipe's ``SimEnv``), from the folder ``cwd``, its output to ``log``; returns the completed process (output in
    ``stdout``). The workspace's parent is removed first: nothing is prepared for the command.

    Like ``fedseg.bench.simulator.run_simulator_command``, a run whose site process died at start on a taken port is
    stopped at once and started again (at most ``retries`` times).

    Raises:
        subprocess.TimeoutExpired: the command ran past ``timeout`` seconds (it is killed, with its simulator).
    """
    import shutil
    import subprocess
    import time

    from fedseg.bench.simulator import SITE_START_FAILURE, failed_site_start

    def kill(proc: subprocess.Popen) -> None:
        sim_fork.kill_tree(proc.pid)
        proc.wait()

    env = {**SESSION_ENV, **SIMULATOR_ENV, "PYTHONDONTWRITEBYTECODE": "1"}
    cwd.mkdir(parents=True, exist_ok=True)
    for _ in range(retries + 1):
        shutil.rmtree(workspace.parent, ignore_errors=True)
        deadline = time.monotonic() + timeout
        with open(log, "w") as out:
            proc = subprocess.Popen(list(map(str, cmd)), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            failed = None
            while proc.poll() is None:
                time.sleep(poll_s)
                failed = failed_site_start(workspace)
                if failed or time.monotonic() > deadline:
                    kill(proc)
                    if not failed:
                        raise subprocess.TimeoutExpired(cmd, timeout, log.read_text())
        text = log.read_text()
        if not failed and proc.returncode != 0 and SITE_START_FAILURE in text:
            failed = "server"
        if not failed:
            return subprocess.CompletedProcess(list(cmd), proc.returncode, text, "")
    raise RuntimeError(f"a site could not start on {retries + 1} tries ({SITE_START_FAILURE}): {' '.join(map(str, cmd))}")


def prepare(name: str, spec: "RunSpec | JobSpec", root: Path) -> Callable[[], Any]:
    """Make a run's inputs under ``root`` (site datalists, the exported job; a :class:`JobSpec`'s own) and return
    the part a background worker runs: the simulator in workspace ``root/ws`` -> :class:`SimRun`.

    Called in the main thread: CPython 3.11 keeps one AST recursion counter per interpreter, so two threads
    building ASTs at once (MONAI's bundle parser in ``export_job``, ``inspect.signature``, pytest's assertion
    rewriting) fail with "SystemError: AST constructor recursion depth mismatch"; the workers only wait on
    subprocesses."""
    from fedseg.recipes.export import export_job

    if isinstance(spec, JobSpec):
        import importlib

        module, function = spec.make.split(":")
        job_run = getattr(importlib.import_module(module), function)(root)

        def in_one_slot() -> Any:
            with SIMULATOR_SLOTS.one():
                return job_run()

        return in_one_slot

    options = dict(spec.options)
    if spec.datalists is not None:
        mapping = root / "site_datalists.json"
        mapping.write_text(json.dumps(spec.datalists(root / "data")))
        options["script_args"] = f"--site_datalists {mapping}"
    job = export_job(spec.method, root / "jobs", profile=spec.profile, **options)

    def simulate() -> SimRun:
        report = run_simulator(job, root / "ws", clients=list(spec.sites), env=spec.env, gpu=spec.gpu)
        return SimRun(name, spec, job, root / "ws", report)

    return simulate


class SharedRuns:
    """Session cache of simulator runs: ``shared_runs("fedevi")`` is :data:`SHARED_RUNS` ``["fedevi"]``, run once.

    :meth:`prefetch` prepares the runs the selected tests declare (:func:`prepare`, in the calling thread) and
    queues them in the order given (the session gives :func:`background_order`); ``workers`` background threads (one
    per simulator slot) take them in that order and a reader waits for its run. A run that failed (to prepare or to
    run) fails every test that reads it with the same error, without being run again. :attr:`seconds` holds each
    finished run's wall time (the session prints them with ``--durations``).
    """

    def __init__(self, make_root: Callable[[str], Path], specs: Mapping[str, "RunSpec | JobSpec"],
                 prepare_run: Optional[Callable[[str, Any, Path], Callable[[], Any]]] = None,
                 workers: Optional[int] = None):
        self._make_root = make_root
        self._specs = specs
        self._prepare = prepare_run or prepare  # (name, spec, root) -> the worker's part
        self._jobs: Dict[str, Callable[[], Any]] = {}
        self._results: Dict[str, Any] = {}
        self._done: Dict[str, threading.Event] = {}
        self._queue: "queue.Queue[Optional[str]]" = queue.Queue()
        self._n_workers = workers or SIMULATOR_SLOTS.n
        self._workers: List[threading.Thread] = []
        self.seconds: Dict[str, float] = {}

    def prefetch(self, names: Sequence[str]) -> None:
        """Run ``names`` in the background, in this order (the order the tests will read them)."""
        for name in names:
            if name not in self._specs:
                raise KeyError(f"no shared simulator run {name!r}; add it to SHARED_RUNS in tests/sim_utils.py ({sorted(self._specs)})")
        if not self._workers and names:
            self._workers = [threading.Thread(target=self._drain, name=f"shared-simulator-runs-{i}", daemon=True)
                             for i in range(self._n_workers)]
            for worker in self._workers:
                worker.start()
        for name in names:
            if name in self._done:
                continue
            self._done[name] = threading.Event()
            try:
                self._jobs[name] = self._prepare(name, self._specs[name], self._make_root(name))
            except Exception as e:  # noqa: BLE001 - remembered and re-raised for every reader
                self._results[name] = e
                self._done[name].set()
                continue
            self._queue.put(name)  # the workers start on the first runs while the later ones are prepared

    def _drain(self) -> None:
        import time

        while (name := self._queue.get()) is not None:
            start = time.monotonic()
            try:
                self._results[name] = self._jobs[name]()
            except BaseException as e:  # noqa: BLE001 - remembered and re-raised for every reader
                self._results[name] = e
            finally:
                self.seconds[name] = time.monotonic() - start
                self._done[name].set()

    def close(self) -> None:
        """Start no more runs (those in progress finish) and wait for the workers."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for _ in self._workers:
            self._queue.put(None)
        for worker in self._workers:
            worker.join()

    def __call__(self, name: str) -> Any:
        if name not in self._specs:
            raise KeyError(f"no shared simulator run {name!r}; add it to SHARED_RUNS in tests/sim_utils.py ({sorted(self._specs)})")
        if name not in self._done:
            raise KeyError(f"shared run {name!r} is read but not declared: mark the test "
                           f"@pytest.mark.shared_runs({name!r}) (tests/README.md)")
        self._done[name].wait()
        result = self._results[name]
        if isinstance(result, BaseException):
            raise result
        return result


def background_order(names: Sequence[str], specs: Optional[Mapping[str, "RunSpec | JobSpec"]] = None) -> List[str]:
    """``names`` in the order the background workers take them: the costliest first (``cost``; ties keep the order
    given). With the long runs (``fedseg bench``, the POC, the deployment) started first, the last run to finish is a
    short one, and the readers, which run in this order, find their runs done or nearly."""
    specs = SHARED_RUNS if specs is None else specs
    return sorted(names, key=lambda name: -specs[name].cost if name in specs else 0.0)  # unknown: prefetch refuses it


# ------------------------------------------------------------------------------------------ the runs
def _bad_data_datalists(folder: Path) -> Dict[str, str]:
    """Built-in tiny polyp data for site-1..site-5, with site-5's first training image corrupt."""
    from fedseg.data.synthetic import generate_site_data

    mapping = {s: str(generate_site_data("polyp", s, folder, profile="tiny")) for s in sites(5)}
    broken = Path(mapping["site-5"])
    first_image = json.loads(broken.read_text())["training"][0]["image"]
    (broken.parent / first_image).write_bytes(b"not a png")
    return mapping


def broken_image_name(run: SimRun) -> str:
    """The file name of the corrupt image in the ``robustness`` run (site-5's first training image)."""
    datalist = json.loads((run.workspace.parent / "site_datalists.json").read_text())["site-5"]
    return json.loads(Path(datalist).read_text())["training"][0]["image"].split("/")[-1]


def _classification_datalists(folder: Path) -> Dict[str, str]:
    from test_engine_classification import write_classification_datalist

    return {s: str(write_classification_datalist(folder / s, n_per_class=(4, 2, 2), seed=i)) for i, s in enumerate(sites(2))}


#: FedEvi on built-in vessel data (patch mode), no augmentation (the executor pair compares exact numbers)
FEDEVI = RunSpec("fedevi", options={"data_family": "vessel", "augment": False, "local_epochs": 1})
#: FedEFM DFL (ring gossip, the server relays) with EMD teacher weights, no augmentation
FEDEFM_DFL = RunSpec("fedefm", options={"mode": "dfl", "augment": False, "local_epochs": 1})
#: hostile results (fault injection) and a site whose data is broken, FedAvg, 5 sites, 3 rounds, one local epoch
ROBUSTNESS_FAULTS = "site-2:scale=100@0,site-3:zero@0,site-2:sign_flip@1,site-3:stale@1,site-4:bad_stat@2"

#: every shared run: name -> configuration (tiny profile unless said). Tests read them through ``shared_runs``.
#: the label-space and volume train_config fields of the built-in multi-class and volume families (what
#: ``fedseg run`` / ``fedseg export --family`` add to a job)
FUNDUS_FIELDS = federation_label_config(family="fundus")
VOLUME_FIELDS = check_federation(family="prostate3d", explicit={"data_profile": "tiny"})
#: FedAvg and the published segmentation methods (fedseg.methods), each run on the three-class data in process
MULTICLASS_METHODS = ("fedavg", *PROTOCOL_METHODS)
#: (method, spatial mode) -> extra options; PathFL runs in slice mode (its style statistics are 2-D)
VOLUME_RUNS = {
    ("fedevi", "patch"): {},
    ("graphfedseg", "patch"): {},
    ("fvac", "patch"): {},
    ("fedavg", "slices"): {"slice_foreground_only": True},
    ("pathfl", "slices"): {},
}

SHARED_RUNS: Dict[str, "RunSpec | JobSpec"] = {
    # one run per method; every test of the method's report, audit and site outputs reads it
    # built-in vessel data (patch mode), 3 sites, 2 rounds x 3 local epochs (its test compares with the untrained model)
    "fedavg": RunSpec("fedavg", options={"data_family": "vessel"}),
    "fedevi": FEDEVI,
    "graphfedseg": RunSpec("graphfedseg", options={"data_family": "vessel", "dp_target_epsilon": 10.0, "local_epochs": 1}),
    "fvac": RunSpec("fvac", options={"local_epochs": 1}),
    "pathfl": RunSpec("pathfl", options={"local_epochs": 1}),
    "fedefm_cfl": RunSpec("fedefm", options={"use_emd": False, "local_epochs": 1}),
    "fedefm_dfl": FEDEFM_DFL,
    "classification": RunSpec(
        "fedavg", sites(2), {"num_rounds": 2, "task": "classification", "num_classes": 2, "in_channels": 1,
                             "vit_image_size": 32, "batch_size": 4, "local_epochs": 1},
        datalists=_classification_datalists,
    ),
    # pairs: the same configuration with one thing changed
    "fedevi_client_api": FEDEVI.but(site_executor="client_api"),
    # homomorphic aggregation: FEDEVI's configuration with CKKS-encrypted models (tests/test_homomorphic.py)
    "fedevi_he": JobSpec("test_homomorphic:fedevi_he_run", cost=1.5),
    "fedefm_dfl_client_api": FEDEFM_DFL.but(site_executor="client_api"),
    # CUDA (tests/test_cuda.py, skipped without a GPU): both sites on GPU 0 through the simulator's -gpu option
    "fedavg_gpu": RunSpec("fedavg", sites(2), {"num_rounds": 1, "local_epochs": 1}, gpu="0"),
    "robustness": RunSpec("fedavg", sites(5), {"num_rounds": 3, "local_epochs": 1},
                          env={FAULT_ENV: ROBUSTNESS_FAULTS}, datalists=_bad_data_datalists, cost=2.5),
    # the baseline whose payload carries more than the weights (tests/test_baselines_runs.py; the nine baselines run
    # in process there): 2 sites, 2 rounds (round-to-round site state)
    "scaffold": RunSpec("scaffold", sites(2), {"num_rounds": 2, "local_epochs": 1}),
    # three-class data (built-in fundus: rim and cup, region disc) through NVFlare; every method runs on it in process
    # (tests/test_multiclass_runs.py)
    "fedevi_fundus": RunSpec("fedevi", sites(2), {"num_rounds": 1, "local_epochs": 1, "data_family": "fundus",
                                                  **FUNDUS_FIELDS}),
    # fedseg bench end to end (2 polyp sites, fedavg + fedevi + local, 2 seeds) and `fedseg run --seed 1` beside it
    # (tests/test_bench_sim.py); FedEFM's classification bench; FedEFM's downstream job from a foundation checkpoint
    # made first (tests/test_fedefm_downstream.py)
    "bench_polyp": JobSpec("test_bench_sim:polyp_bench", cost=6.0),
    "bench_fedefm": JobSpec("test_bench_sim:fedefm_bench", cost=2.5),
    "fedefm_downstream": JobSpec("test_fedefm_downstream:downstream_run", cost=1.5),
    # volumes (built-in prostate3d, two zones) through NVFlare: GraphFedSeg on 3-D patches (its personalised payloads
    # and the checkpoint's volume settings); every (method, mode) of VOLUME_RUNS runs in process
    # (tests/test_volume_runs.py). Run by the README's `python jobs/job.py graphfedseg --env sim ...` line with this
    # configuration's options added (the recipe in NVFlare's SimEnv, a fresh folder and workspace: tests/test_job_py.py)
    "graphfedseg_patch3d": JobSpec("test_job_py:readme_sim_run", cost=1.5),
    # a MONAI bundle as NVFlare runs one: NVFlare's FedAvgRecipe with MONAI's MonaiAlgo at each site (the site script
    # fedseg/fl/monai_bundle_client.py), unet2d_seg at 32 px, 2 sites x 2 rounds (round 1 scores the averaged model), in
    # SimEnv from `python -m fedseg.recipes.monai_bundle` in a fresh folder (tests/test_bundle_monai_rules.py)
    "monai_bundle_fedavg": JobSpec("test_bundle_monai_rules:monai_algo_sim_run", cost=1.5),
    # a model-zoo style bundle (tests/bundles, not ours) under the suite's methods: `fedseg run fedavg --bundle ...
    # --site-overrides ...` in 2-D, `fedseg bench --bundle ... --methods fedavg fvac` in 3-D (tests/test_bundle_path.py)
    "bundle_zoo2d_fedavg": JobSpec("test_bundle_path:bundle_2d_sim_run", cost=1.0),
    "bundle_zoo3d_bench": JobSpec("test_bundle_path:bundle_3d_bench_run", cost=2.0),
    # NVFlare started other ways than one `nvflare simulator` run, each by a test module's function: FedEvi's simulator
    # killed after a checkpointed round and run again (tests/test_simulator_resume.py); one site training as two ranks
    # under torchrun (tests/test_site_ranks.py); the tiny FedAvg recipe in NVFlare's PocEnv, the one POC of the suite
    # (tests/test_poc.py); deploy/project.yml provisioned and started on loopback, with an impostor site, custom code
    # refused and the recipe through ProdEnv (tests/test_deploy.py)
    "resume": JobSpec("test_simulator_resume:resume_run", cost=2.5),
    "site_ranks": JobSpec("test_site_ranks:ranks_run", cost=1.5),
    # one rank against two ranks of the same site, float64, the three train tasks of tests/test_site_ranks.py
    "site_ranks_parity": JobSpec("test_site_ranks:ranks_parity_run", cost=1.5),
    "poc": JobSpec("test_poc:poc_run", cost=3.0),
    "deployment": JobSpec("test_deploy:deployment_run", cost=3.0),
}
#: what the ``graphfedseg_patch3d`` run is (the README's job.py line makes the same job: test_job_py.py checks it)
GRAPHFEDSEG_PATCH3D = RunSpec("graphfedseg", sites(2), {"num_rounds": 1, "local_epochs": 1, "data_family": "prostate3d",
                                                        "spatial_mode": "patch", **VOLUME_FIELDS})
