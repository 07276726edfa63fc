"""``fedseg bench``: every (method, seed) and (reference, seed) of a federation, then statistics and a report.

Resumable: each finished run is ``<out>/runs/<run id>.json`` with the ``run_config`` that made it; a
repeated command with the same ``--out`` skips a run whose file exists with the same ``run_config``
(and re-runs one whose budget, data or options changed).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from fedseg.bench.ranking import recommendation_lines
from fedseg.bundle import is_bundle_path
from fedseg.bench.report import budget_text, build_results, markdown, plot_results
from fedseg.bench.runs import (
    REFERENCES, Budget, RunSpec, federation_task, load_finished, parse_variant, record_task, refresh_method, run_method, run_reference,
    save_run, seeded_args, task_metrics,
)
from fedseg.bench.simulator import machine_info
from fedseg.fl.site_data import FOUNDATION_FAMILY  # FedEFM's phase-1 classification silos (fedseg.data.synthetic.xray_builtin)
from fedseg.processes import raise_if_stopping


def is_bundle_federation(mapping: Mapping[str, Any]) -> bool:
    """The sites are a user's bundle's: ``{site: {config id: value}}`` rather than ``{site: datalist path}``."""
    return any(isinstance(v, dict) for v in mapping.values())


def prepare_federation(out: Path, site_datalists: Optional[str] = None, family: Optional[str] = None,
                       sites: Optional[Sequence[str]] = None, data_profile: str = "default", data_seed: int = 0,
                       sets: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    """``{site: absolute datalist path}`` from a site -> datalist map file, or built-in data of ``family``
    generated under ``<out>/data`` (deterministic in family, site, seed and profile). The map is also
    written to ``<out>/site_datalists.json`` (the simulator sites read it).

    ``family="xray_foundation"``: FedEFM's classification silos, with the unseen proportion, scanner
    count and ViT image size of ``sets`` (``data_unseen``, ``data_scanners``, ``vit_image_size``; defaults
    :data:`fedseg.config.BASE_TRAIN_CONFIG`), i.e. the silos a site process would generate itself."""
    out.mkdir(parents=True, exist_ok=True)
    if site_datalists:
        mapping = read_site_datalists(site_datalists)
    elif family == FOUNDATION_FAMILY:
        from fedseg.config import BASE_TRAIN_CONFIG
        from fedseg.data.synthetic.xray_builtin import builtin_foundation_silos

        cfg = {**BASE_TRAIN_CONFIG, **(sets or {})}
        paths = builtin_foundation_silos(out / "data" / FOUNDATION_FAMILY, list(sites or ["site-1", "site-2", "site-3"]),
                                         unseen=float(cfg["data_unseen"]), seed=data_seed, profile=data_profile,
                                         n_scanners=cfg["data_scanners"], image_size=cfg["vit_image_size"])
        mapping = {s: str(Path(p).resolve()) for s, p in paths.items()}
    else:
        from fedseg.data.synthetic import generate_federation

        paths = generate_federation(family or "polyp", list(sites or ["site-1", "site-2", "site-3"]), out / "data",
                                    seed=data_seed, profile=data_profile)
        mapping = {s: str(Path(p).resolve()) for s, p in paths.items()}
    target = out / "site_datalists.json"
    text = json.dumps(mapping, indent=1)
    if not target.is_file() or target.read_text() != text:
        target.write_text(text)
    return mapping


def read_site_datalists(path: str) -> Dict[str, str]:
    """``{site: absolute datalist path}`` of a site -> datalist map file (relative paths against its folder)."""
    src = Path(path).resolve()
    raw = json.loads(src.read_text())
    return {s: str((src.parent / p).resolve()) for s, p in raw.items()}


def data_summary(mapping: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Images per split of every site (segmentation or classification datalists); a user's bundle: each site's
    overrides (its data are the bundle's to find)."""
    from fedseg.data.classification import load_classification_datalist
    from fedseg.data.datalist import load_datalist

    if is_bundle_federation(mapping):
        return {site: {"bundle_overrides": values} for site, values in mapping.items()}

    load = load_classification_datalist if federation_task(mapping) == "classification" else load_datalist
    return {site: {s: len(v) for s, v in load(p, check_files=False).items()} for site, p in mapping.items()}


def plan(methods: Sequence[str], references: Sequence[str], seeds: Sequence[int]) -> List[RunSpec]:
    """Run order: seed by seed, every method then every reference (so a partial bench has complete seeds)."""
    specs = []
    labels = set()
    parsed = []
    for m in methods:
        label, method, args = parse_variant(m)
        if label in labels:
            raise ValueError(f"two methods share the label {label!r}; name ablation rows LABEL=METHOD:key=value")
        labels.add(label)
        parsed.append((label, method, args))
    for ref in references:
        if ref not in REFERENCES:
            raise ValueError(f"unknown reference {ref!r}; choose from {REFERENCES}")
    for seed in seeds:
        specs += [RunSpec("method", label, method, int(seed), seeded_args(args, seed)) for label, method, args in parsed]
        specs += [RunSpec("reference", ref, ref, int(seed)) for ref in references]
    return specs


#: where a copy of the code without git names the commit it was copied from (:func:`code_version`)
CODE_COMMIT_ENV = "FEDSEG_CODE_COMMIT"


def code_version(path: Optional[Path] = None) -> Dict[str, Any]:
    """The git commit of the code that runs: ``{"commit": short hash, "dirty": bool}`` of the repository whose
    tracked files hold ``path`` (default: this package). ``dirty``: tracked files differ from the commit (untracked
    files, e.g. outputs, do not count). ``{"commit": None, "dirty": None}`` where the package is not a git
    checkout (installed from a wheel, or git missing): ``git ls-files`` must list ``path``'s ``__init__.py``, so a
    package installed inside another repository's folder is not given that repository's commit. A commit hash in
    ``$FEDSEG_CODE_COMMIT`` is taken as stated, before any git folder: ``{"commit": it, "dirty": False, "stated":
    True}`` (whoever copies a tree to another machine knows its commit; a git folder travelling with the copy may be
    an older one)."""
    here = Path(path) if path is not None else Path(__file__).resolve().parent
    stated = os.environ.get(CODE_COMMIT_ENV, "").strip()
    if re.fullmatch(r"[0-9a-f]{7,40}", stated):
        return {"commit": stated, "dirty": False, "stated": True}

    def git(*args: str) -> Optional[str]:
        try:
            proc = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD") if git("ls-files", "--error-unmatch", "__init__.py") is not None else None
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    if not commit or status is None:
        return {"commit": None, "dirty": None}
    return {"commit": commit.strip(), "dirty": bool(status.strip())}


def version_label(version: Optional[Dict[str, Any]]) -> str:
    """``"3454ff5"``, ``"3454ff5+dirty"`` (uncommitted changes), ``"unknown"`` (no git checkout) or ``"not recorded"``
    (a run stored before ``fedseg bench`` recorded its code version)."""
    if not version:
        return "not recorded"
    if not version.get("commit"):
        return "unknown"
    return version["commit"] + ("+dirty" if version.get("dirty") else "")


def run_code_versions(records: Sequence[Dict[str, Any]]) -> Dict[str, List[str]]:
    """``{version label: [run ids]}`` of the code that trained each run (:func:`version_label`); a resumed bench
    can hold runs of several versions."""
    out: Dict[str, List[str]] = {}
    for rec in records:
        out.setdefault(version_label(rec.get("code_version")), []).append(rec["id"])
    return out


def spatial_settings(records: Sequence[Dict[str, Any]], mapping: Dict[str, str]) -> Dict[str, Dict[str, Any]]:
    """How each site's images reached the network: ``{site: {"spatial_mode", "rescale", "spatial_dims", "input_size",
    ...}}`` (:func:`fedseg.engine.spatial.resolve_spatial_settings` of the first run's ``train_config`` and the site's
    datalist; every run of a bench shares the budget's spatial settings). ``input_size``: ``image_size`` in resize mode,
    else ``patch_size``. A site whose settings cannot be resolved gets ``{"error": why}`` (the runs are already done:
    their results are written regardless)."""
    from fedseg.data.datalist import read_datalist_json
    from fedseg.engine.spatial import resolve_spatial_settings

    train_config = next((r["train_config"] for r in records if r.get("train_config")), None)
    if train_config is None or is_bundle_federation(mapping):  # a user's bundle: its own transforms decide
        return {}
    out: Dict[str, Dict[str, Any]] = {}
    for site, path in mapping.items():
        try:
            settings = resolve_spatial_settings(train_config, read_datalist_json(path)[1], where=f"of site {site}")
        except (ValueError, OSError) as e:  # DatalistError is a ValueError
            out[site] = {"error": str(e)}
            continue
        size = train_config.get("image_size") if settings["spatial_mode"] == "resize" else train_config.get("patch_size")
        out[site] = {**settings, "input_size": size}
    return out


def _fmt_s(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def run_bench(
    out: str,
    methods: Sequence[str] = ("fedavg",),
    references: Sequence[str] = REFERENCES,
    seeds: Sequence[int] = (0,),
    site_datalists: Optional[str] = None,
    family: Optional[str] = None,
    sites: Optional[Sequence[str]] = None,
    data_profile: str = "default",
    data_seed: int = 0,
    budget: Optional[Budget] = None,
    command: Optional[str] = None,
    baseline: Optional[str] = None,
    refresh: bool = False,
    reuse: Sequence[str] = (),
    parallel: int = 1,
    simulator_timeout: int = 3600,
    site_overrides: Optional[str] = None,
    site_statistics: Optional[str] = None,
) -> Dict[str, Any]:
    """Run (or resume) a bench and write ``results.json``, ``results.md`` and ``plots/`` under ``out``.

    Args:
        out: output folder (runs/, workspaces/, jobs/, logs/, data/, results, plots/).
        methods: method names or ablation rows ``LABEL=METHOD:key=value,...``; ``{seed}`` in a value is the run's
            seed (:func:`fedseg.bench.runs.seeded_args`: each seed's run names another bench's run of that seed).
        references: any of ``local`` (every site trains alone) and ``pooled`` (one model on the union).
        seeds: training seeds (``train_config["seed"]``: initial weights, shuffling, augmentation);
            the data (and so the test images) stay the same, which makes the per-image pairing valid.
        site_datalists: JSON map site -> datalist; else built-in data of ``family`` for ``sites``.
        family, sites, data_profile, data_seed: the built-in federation.
        budget: rounds, local epochs, profile, ``train_config`` overrides and job settings.
        command: the command line, recorded in ``results.json``.
        baseline: label every approach is tested against (default ``fedavg``, else the only label
            starting with ``fedavg``; :func:`fedseg.bench.report.resolve_baseline`).
        refresh: re-read every finished method run from its workspace with this code instead of taking
            its stored record as it is (nothing is re-trained); references keep their stored records,
            since their models are not kept.
        reuse: other bench output folders; a run missing here but finished in one of them with the same
            ``run_config`` (method, options, seed, budget, data) is copied into ``out/runs`` instead of trained
            again (e.g. seed 0 of a one-seed bench inside a three-seed bench of fewer methods).
        parallel: method runs (simulator jobs) at once, for a machine with cores and GPU memory to spare; their
            round times then include each other's load (``parallel_runs`` in ``results.json``). References run
            one at a time first.
        simulator_timeout: seconds one method run (its simulator) may take before it is stopped and the bench fails;
            not part of a run's configuration (a finished run is the same run whatever its allowance).
        site_overrides: a user's MONAI bundle (``budget.sets["bundle"]``): the JSON map ``{site: {config id: value}}``
            whose keys are the sites; methods only (no references). Each site's validation images are scored one by
            one, so the paired tests are per image, as with datalists.
        site_statistics: how the sites differ, shown beside the verdict: "run" runs NVFlare's federated statistics
            over the bench's datalists before the runs (:func:`fedseg.fl.fed_statistics.bench_site_statistics`), a
            path reads a ``stats.json``; None: none.

    Returns:
        The ``results.json`` dict. Besides :func:`fedseg.bench.report.build_results`'s fields its header records
        ``code_version`` (the git commit of this code, :func:`code_version`; each run's own is in its
        ``runs/<id>.json`` and summarised in ``run_code_versions``), ``machine``, ``date`` (when the results were
        written), ``budget`` and ``spatial`` (each site's spatial mode and input size, :func:`spatial_settings`).
    """
    budget = budget or Budget()
    bundle = _check_bench_options(budget, references, site_datalists, family, parallel, simulator_timeout, site_overrides)
    started = time.perf_counter()
    version, machine = code_version(), machine_info()  # before the runs: the load they start under
    root = Path(out).resolve()
    specs = plan(methods, references, seeds)  # fail on a bad spec before any data or job
    if baseline is not None and baseline not in {s.label for s in specs}:
        raise ValueError(f"--baseline {baseline!r} is not one of the bench's labels {sorted({s.label for s in specs})}")
    if bundle:
        mapping, site_map_file = _bundle_sites(root, site_overrides)
    else:
        mapping = prepare_federation(root, site_datalists, family, sites, data_profile, data_seed, budget.sets)
        site_map_file = root / "site_datalists.json"
    statistics = None
    if site_statistics is not None:
        if bundle:
            raise ValueError("site statistics read the sites' datalists; a bench on a user's bundle has none")
        from fedseg.fl.fed_statistics import bench_site_statistics

        statistics = bench_site_statistics(root, mapping, site_statistics)
    records, todo = load_finished_runs(specs, root, budget, mapping, reuse=reuse, refresh=refresh)
    execute_runs(specs, todo, records, budget=budget, mapping=mapping, root=root, site_map_file=site_map_file,
                 version=version, simulator_timeout=simulator_timeout, parallel=parallel, started=started)
    done: List[Dict[str, Any]] = [r for r in records if r is not None]  # every run, in the bench's order
    header = {
        "benchmark": "fedseg bench",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": command,
        "code_version": version,
        "run_code_versions": run_code_versions(done),
        "machine": machine,
        "seeds": [int(s) for s in seeds],
        "parallel_runs": parallel,
        "budget": budget.to_dict(),
        "spatial": spatial_settings(done, mapping),
        "site_datalists": mapping,
        "data": data_summary(mapping),
        "runs": {r["id"]: str(root / "runs" / f"{r['id']}.json") for r in done},
        **({"site_statistics": statistics} if statistics else {}),
    }
    return write_results(root, done, list(mapping), header, baseline=baseline, started=started)


def _check_bench_options(budget: Budget, references: Sequence[str], site_datalists: Optional[str], family: Optional[str],
                         parallel: int, simulator_timeout: int, site_overrides: Optional[str]) -> bool:
    """Whether the bench runs on a user's MONAI bundle, after checking :func:`run_bench`'s options against each other
    (a ``ValueError`` names the first that is wrong); a bench on built-in data records its family in ``budget``."""
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise ValueError(f"parallel must be a positive number of runs, got {parallel!r}")
    if not isinstance(simulator_timeout, int) or isinstance(simulator_timeout, bool) or simulator_timeout < 1:
        raise ValueError(f"simulator_timeout must be a positive number of seconds, got {simulator_timeout!r}")
    bundle = site_overrides is not None or is_bundle_path(budget.sets.get("bundle"))
    if bundle:
        if not is_bundle_path(budget.sets.get("bundle")) or not site_overrides:
            raise ValueError("a bench on a user's bundle needs both the bundle (budget sets 'bundle') and --site-overrides")
        if references:
            raise ValueError(f"references {list(references)} train on datalists in this process; a bench on a user's "
                             "bundle compares federated methods only (--references with nothing after it)")
    elif not site_datalists:
        budget.data_family = budget.data_family or family or "polyp"
    return bundle


def _bundle_sites(root: Path, site_overrides: str) -> Tuple[Dict[str, Dict[str, Any]], Path]:
    """A bench on a user's bundle: its sites ``{site: {config id: value}}`` read from ``site_overrides`` and the copy
    ``<root>/site_overrides.json`` the simulated sites read."""
    mapping = json.loads(Path(site_overrides).read_text())
    root.mkdir(parents=True, exist_ok=True)
    site_map_file = root / "site_overrides.json"
    site_map_file.write_text(json.dumps(mapping, indent=1))
    return mapping, site_map_file


def load_finished_runs(specs: Sequence[RunSpec], root: Path, budget: Budget, mapping: Mapping[str, Any],
                       reuse: Sequence[str] = (), refresh: bool = False) -> Tuple[List[Optional[Dict[str, Any]]], List[int]]:
    """``(records, todo)``: each spec's finished record (``None`` where it has none) and the indices of the specs still
    to run. A record counts as finished when ``<root>/runs/<id>.json`` (else the same file in one of the ``reuse``
    folders, then copied into ``root``) holds the spec's ``run_config``; ``refresh`` re-reads a finished method run
    from its workspace (references keep theirs: their models are not kept). Each skipped run is printed with why."""
    records: List[Optional[Dict[str, Any]]] = [None] * len(specs)
    todo: List[int] = []
    for i, spec in enumerate(specs):
        path = root / "runs" / f"{spec.id}.json"
        config = spec.run_config(budget, mapping)
        record, how = load_finished(path, config), "finished earlier"
        for other in reuse if record is None else ():
            record = load_finished(Path(other).resolve() / "runs" / f"{spec.id}.json", config)
            if record is not None:
                save_run(path, record)
                how = f"copied from {other}"
                break
        if record is None:
            todo.append(i)
            continue
        if refresh and spec.kind == "method":  # references keep theirs: their models are not kept
            record = refresh_method(record, spec, mapping)
            save_run(path, record)
            how = "re-read from its workspace"
        print(f"[{i + 1}/{len(specs)}] skipped {spec.label} seed {spec.seed}: {how} ({path})", flush=True)
        records[i] = record
    return records, todo


def _train_run(spec: RunSpec, budget: Budget, mapping: Mapping[str, Any], root: Path, site_map_file: Path,
               version: Dict[str, Any], simulator_timeout: int) -> Dict[str, Any]:
    """One run of the bench trained (a method in NVFlare's simulator, a reference in this process) and its record,
    stamped with its id, ``run_config`` and code version, saved as ``<root>/runs/<id>.json``."""
    if spec.kind == "method":
        record = run_method(spec, budget, mapping, root, site_map_file, timeout=simulator_timeout)
    else:
        record = run_reference(spec, budget, mapping, root)
    record.update(id=spec.id, run_config=spec.run_config(budget, mapping), code_version=version)
    save_run(root / "runs" / f"{spec.id}.json", record)
    return record


def _mean_test_score(record: Dict[str, Any]) -> Tuple[str, float]:
    """``(metric, mean)``: a run's main test metric (``dice`` for segmentation) and its mean over the sites of the
    final global model (the personalised models where the method has no global one: FedBN, FedRep); NaN for none."""
    metric = task_metrics(record_task(record))[0]
    final = record["final"].get("global") or record["final"].get("personalized") or {}
    values = [m.get(metric) for m in final.values() if m.get(metric) is not None]
    return metric, (sum(values) / len(values)) if values else float("nan")


def execute_runs(specs: Sequence[RunSpec], todo: Sequence[int], records: List[Optional[Dict[str, Any]]], *,
                 budget: Budget, mapping: Mapping[str, Any], root: Path, site_map_file: Path, version: Dict[str, Any],
                 simulator_timeout: int, parallel: int, started: float) -> None:
    """Train the runs still to do (``todo``: indices into ``specs``) and put their records into ``records``: the
    references one at a time in this process first, then the method runs (simulator processes), ``parallel`` at once.
    Each run prints its start, its mean test score and an estimate of the time left (``started``: the bench's start,
    ``time.perf_counter``); a stopped bench (SIGTERM, Ctrl-C) starts no further run, and the first failure stops it
    (finished runs are saved already)."""
    progress = {"seconds": 0.0, "executed": 0}
    lock = threading.Lock()

    def execute(i: int) -> None:
        raise_if_stopping()  # a stopped bench (SIGTERM, Ctrl-C) starts no further run, in no thread
        spec = specs[i]
        print(f"[{_dt.datetime.now():%H:%M:%S}] [{i + 1}/{len(specs)}] {spec.label} seed {spec.seed} ...", flush=True)
        run_started = time.perf_counter()
        records[i] = _train_run(spec, budget, mapping, root, site_map_file, version, simulator_timeout)
        metric, mean = _mean_test_score(records[i])
        with lock:
            progress["seconds"] += time.perf_counter() - run_started
            progress["executed"] += 1
            remaining = len(todo) - progress["executed"]
            eta = progress["seconds"] / progress["executed"] * remaining / parallel
        print(f"[{i + 1}/{len(specs)}] done {spec.label} seed {spec.seed}: mean test {'Dice' if metric == 'dice' else metric} "
              f"{mean:.3f} in {_fmt_s(time.perf_counter() - run_started)}; "
              f"elapsed {_fmt_s(time.perf_counter() - started)}, about {_fmt_s(eta)} remaining", flush=True)

    # references train in this process (one at a time); method runs are simulator processes, `parallel` at once
    for i in [i for i in todo if specs[i].kind != "method"]:
        execute(i)
    method_runs = [i for i in todo if specs[i].kind == "method"]
    if parallel > 1 and len(method_runs) > 1:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            for future in [pool.submit(execute, i) for i in method_runs]:
                future.result()  # the first failure stops the bench; finished runs are saved already
    else:
        for i in method_runs:
            execute(i)


def write_results(root: Path, done: List[Dict[str, Any]], site_names: List[str], header: Dict[str, Any],
                  baseline: Optional[str], started: float) -> Dict[str, Any]:
    """The bench's results (:func:`fedseg.bench.report.build_results` of the finished runs ``done`` under ``header``,
    with ``plots`` and ``wall_time_s`` since ``started``) written as ``<root>/results.json``, ``results.md`` and
    ``plots/``; the page and the ranking's recommendation are printed."""
    results = build_results(done, site_names, header, baseline=baseline)
    results["plots"] = [str(p) for p in plot_results(results, done, root / "plots")]
    results["wall_time_s"] = time.perf_counter() - started
    (root / "results.json").write_text(json.dumps(results, indent=1))
    text = markdown(results)
    (root / "results.md").write_text(text)
    print("\n" + text)
    print(f"wrote {root / 'results.json'}, {root / 'results.md'} and {root / 'plots'}")
    for line in recommendation_lines(results.get("ranking"), "these sites", budget_text(results["budget"])):
        print(line)
    return results
