"""One bench run: a federated method in NVFlare's simulator, or a local-only / pooled reference in process.

Every run is stored as ``<out>/runs/<run id>.json`` holding its ``run_config`` (everything that
determines it) and its results; :func:`load_finished` lets a repeated ``fedseg bench`` skip it.

Per-image test results: each site writes them into its own workspace
(``<simulator workspace>/<site>/fedseg_outputs/<site>/per_image_<model>.json``, see
``fedseg.fl.client.SiteRunner``); they never travel to the server. ``fedseg bench`` runs every site
on this machine, so :func:`read_site_per_image` reads them back from there.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from fedseg.bench.simulator import patch_job, round_timings, run_simulator
from fedseg.config import validation_due
from fedseg.fl.report import METRIC_ORDER

#: every final metric a site may report (FOV and mm variants only where its datalist allows them)
METRICS = METRIC_ORDER
#: the final metrics of each task (classification: accuracy_class_<k> stays in report.json, not in the tables)
CLASSIFICATION_METRICS = ("accuracy", "balanced_accuracy")
TASK_METRICS = {
    "segmentation": tuple(m for m in METRIC_ORDER if m not in CLASSIFICATION_METRICS),
    "classification": CLASSIFICATION_METRICS,
}
#: the validation metric a site sends with its weights, per task (``validation_metrics`` of its engine)
VAL_METRIC = {"segmentation": "val_dice", "classification": "val_accuracy"}
REFERENCES = ("local", "pooled")


def with_structures(metrics: Sequence[str], keys: Sequence[str], train_config: Optional[Mapping[str, Any]] = None) -> Tuple[str, ...]:
    """``metrics`` followed, each, by its per-class / per-region variants among ``keys`` (``dice``, ``dice:rim``,
    ``dice:cup``, ``dice:disc``, ``hd95``, ...; ``fedseg.data.labels.metric_key``), classes in label order
    (``train_config``'s ``labels`` / ``regions``; :func:`fedseg.data.labels.order_structure_keys`)."""
    from fedseg.data.labels import order_structure_keys, split_metric_key

    structures = order_structure_keys([k for k in keys if split_metric_key(k)[1] is not None], train_config)
    out = []
    for m in metrics:
        out.append(m)
        out += [k for k in structures if split_metric_key(k)[0] == m]
    return tuple(out)


def task_metrics(task: str) -> Tuple[str, ...]:
    """The final test metrics reported for ``task`` ("segmentation" or "classification")."""
    if task not in TASK_METRICS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASK_METRICS)}")
    return TASK_METRICS[task]


def federation_task(mapping: Mapping[str, str]) -> str:
    """The task every site's datalist declares (absent ``"task"`` = segmentation).

    Raises:
        ValueError: the sites' datalists declare different tasks.
    """
    from fedseg.data.classification import datalist_task
    from fedseg.data.datalist import read_datalist_json

    if any(isinstance(p, dict) for p in mapping.values()):  # a user's bundle's sites (their overrides): segmentation
        return "segmentation"
    tasks = {site: datalist_task(read_datalist_json(p)[1]) for site, p in mapping.items()}
    if len(set(tasks.values())) > 1:
        raise ValueError(f"the sites' datalists declare different tasks: {tasks}")
    return next(iter(tasks.values()), "segmentation")


def record_task(record: Mapping[str, Any]) -> str:
    """The task of a stored run (runs stored before classification existed are segmentation)."""
    return record.get("task") or "segmentation"


# -------------------------------------------------------------------------------------- parsing
def parse_value(text: str) -> Any:
    """``text`` read as JSON where possible (numbers, true/false, null, lists), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: Optional[Sequence[str]]) -> Dict[str, Any]:
    """``["ID=VALUE", ...]`` -> ``{ID: value}`` (:func:`parse_value`), whatever the ids name (a MONAI config id of a
    bundle, a ``train_config`` key).

    Raises:
        ValueError: an item without ``=`` or without an id.
    """
    out: Dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects ID=VALUE, got {item!r}")
        out[key.strip()] = parse_value(value)
    return out


def parse_sets(items: Optional[Sequence[str]]) -> Dict[str, Any]:
    """``["key=value", ...]`` -> ``{key: value}`` for ``train_config``; values parsed by :func:`parse_value`.

    Raises:
        ValueError: an item without ``=``, or a key that is not a ``train_config`` key
            (:data:`fedseg.config.BASE_TRAIN_CONFIG`).
    """
    from fedseg.config import check_train_config_keys

    out = parse_assignments(items)
    check_train_config_keys(out, "in --set")
    return out


def parse_variant(spec: str) -> Tuple[str, str, Dict[str, Any]]:
    """``fedavg`` or ``LABEL=METHOD:key=value,key=value`` (an ablation row) -> (label, method, recipe kwargs).

    ``METHOD:key=value`` without a label is labelled ``METHOD:key=value``. Values are read as JSON where
    possible, else kept as strings, e.g. ``graph_only=graphfedseg:gamma=0,lam=0`` or
    ``graphfedseg:uncertainty_pass=last_epoch``.
    """
    head = spec.split(":")[0]
    if "=" in head:
        label, _, rest = spec.partition("=")
    else:
        label, rest = "", spec
    method, _, options = rest.partition(":")
    kwargs: Dict[str, Any] = {}
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = parse_value(value)
    return label or (spec if options else method), method, kwargs


#: written in a variant's string value, the run's seed: a seed's run can name what another bench's run of the same
#: seed made, e.g. ``fedefm_downstream:foundation_ckpt=OUT/workspaces/method-fedefm-seed{seed}/.../FL_global_model.pt``
SEED_FIELD = "{seed}"


def seeded_args(args: Mapping[str, Any], seed: int) -> Dict[str, Any]:
    """``args`` (a variant's recipe kwargs, :func:`parse_variant`) of the run with ``seed``: :data:`SEED_FIELD` in
    every string value becomes the seed; other values, and other braces, are kept as they are."""
    return {k: v.replace(SEED_FIELD, str(int(seed))) if isinstance(v, str) else v for k, v in args.items()}


def run_id(kind: str, label: str, seed: int) -> str:
    """File-name-safe id of a run, e.g. ``method-fedavg-seed0``."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", f"{kind}-{label}-seed{seed}")


# ----------------------------------------------------------------------------------------- specs
@dataclass
class Budget:
    """What every run of a bench shares: schedule, profile, ``train_config`` overrides, job settings.

    ``protocol``: the method whose ``paper`` local protocol every run of the bench trains with
    (:func:`fedseg.recipes.paper_protocol`: network, optimiser, batches, epochs, augmentation, intensity, loss,
    evaluation options), under the ``sets`` and ``local_epochs`` given here; None = each method its own profile.
    ``fedseg bench --profile paper`` always sets one (:func:`fedseg.recipes.comparison_protocol`), so that the
    local recipe belongs to the comparison, not to the method.

    ``task_timeout``: seconds a site may take for one task (None: the recipe's default for its inputs, 300 s for one
    epoch of 64 px patches), for a machine too busy for the default. Not part of :meth:`to_dict` (a run's
    configuration): every site must answer every round (``min_clients`` = the sites), so a timeout fails a run and
    never changes the result of one that finishes.
    """

    profile: str = "default"
    rounds: Optional[int] = None
    local_epochs: Optional[int] = None
    sets: Dict[str, Any] = field(default_factory=dict)
    data_family: Optional[str] = None
    task_check_period: float = 0.5
    task_request_interval: Optional[float] = None
    omp_threads: Optional[str] = "1"
    protocol: Optional[str] = None
    task_timeout: Optional[int] = None

    def overrides(self, seed: int) -> Dict[str, Any]:
        """``train_config`` overrides of a run with ``seed`` (the protocol's keys under the bench's own sets)."""
        out = dict(self.protocol_config()["train_config"]) if self.protocol else {}
        out.update(self.sets)
        if self.data_family:
            out.setdefault("data_family", self.data_family)
        if self.local_epochs is not None:
            out["local_epochs"] = self.local_epochs
        out["seed"] = int(seed)
        return out

    def num_rounds(self) -> Optional[int]:
        """``rounds`` where given, else the protocol's (None: each method's profile decides)."""
        if self.rounds is not None or not self.protocol:
            return self.rounds
        return self.protocol_config()["num_rounds"]

    def protocol_config(self) -> Dict[str, Any]:
        from fedseg.recipes import paper_protocol

        # a volume bench (the preflight's spatial_dims 3 among the sets) takes the protocol's volume network and patches
        return paper_protocol(self.protocol, self.sets.get("spatial_dims"), self.sets.get("spatial_mode"))

    def to_dict(self) -> Dict[str, Any]:
        # without a protocol, the record of a bench stored before protocols existed (its runs resume as they are)
        return {k: v for k, v in self.__dict__.items()
                if k != "task_timeout" and (k != "protocol" or v is not None)}


@dataclass
class RunSpec:
    """One run: ``kind`` "method" (label, method, variant_args) or "reference" (label = local | pooled)."""

    kind: str
    label: str
    method: str
    seed: int
    variant_args: Dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return run_id(self.kind, self.label, self.seed)

    def run_config(self, budget: Budget, mapping: Mapping[str, str]) -> Dict[str, Any]:
        """Everything that determines this run's result (compared on resume)."""
        return {"kind": self.kind, "label": self.label, "method": self.method, "seed": self.seed,
                "variant_args": self.variant_args, "budget": budget.to_dict(), "site_datalists": dict(mapping)}


def load_finished(path: Path, run_config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The stored run at ``path`` if it exists and was made with ``run_config``, else None."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    # compare through JSON so tuples/lists and int/float keys compare as they were stored
    return stored if stored.get("run_config") == json.loads(json.dumps(run_config)) else None


def refresh_method(stored: Dict[str, Any], spec: RunSpec, mapping: Mapping[str, str]) -> Dict[str, Any]:
    """A finished method run re-read from its workspace by this code (e.g. a metric added to the tables
    since it ran): finals, per-image rows, timings and bytes anew; command, wall time and run_config kept.

    Raises:
        FileNotFoundError: the run's ``report.json`` or a site's per-image file is gone.
    """
    report_path = Path(stored["report_path"])
    if not report_path.is_file():
        raise FileNotFoundError(f"{spec.id}: cannot refresh, its report {report_path} is gone")
    report = json.loads(report_path.read_text())
    record = method_record(spec, mapping, Path(stored["workspace"]), report, stored.get("command"), str(report_path),
                           stored.get("wall_s"))
    # the code that trained it stays the run's code version (only the reading is this code's)
    record.update(id=stored["id"], run_config=stored["run_config"], code_version=stored.get("code_version"))
    return record


def save_run(path: Path, record: Dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------- helpers
def clean(x: Any) -> Optional[float]:
    """``x`` as a finite float, else None."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def read_site_per_image(workspace: Path, site: str, model: str = "global") -> List[Dict[str, Any]]:
    """Per-image test rows site ``site`` wrote into its own workspace during a simulator run.

    Looks for ``<workspace>/<site>/fedseg_outputs/<site>/per_image_<model>.json`` (the simulator runs
    site ``s`` in ``<workspace>/<s>``), else anywhere below ``<workspace>/<site>``.

    Raises:
        FileNotFoundError: the site wrote no such file.
    """
    name = f"per_image_{model}.json"
    direct = Path(workspace) / site / "fedseg_outputs" / site / name
    found = [direct] if direct.is_file() else sorted((Path(workspace) / site).rglob(f"fedseg_outputs/{site}/{name}"))
    if not found:
        raise FileNotFoundError(f"site {site} wrote no {name} under {Path(workspace) / site}")
    return json.loads(found[0].read_text())["rows"]


def _median_task_times(rounds: List[Dict[str, Any]]) -> Dict[str, float]:
    names = sorted({t for r in rounds for t in (r.get("task_times") or {})})
    return {t: statistics.median([r["task_times"][t] for r in rounds if t in (r.get("task_times") or {})]) for t in names}


def _site_summary(rows: List[Dict[str, Any]], metrics: Sequence[str] = METRICS) -> Dict[str, Optional[float]]:
    return {k: _mean([clean(r.get(k)) for r in rows]) for k in metrics}


# ------------------------------------------------------------------------------------ method runs
_EXPORT_LOCK = threading.Lock()


def run_method(spec: RunSpec, budget: Budget, mapping: Mapping[str, str], out: Path,
               site_map_file: Path, timeout: int = 3600) -> Dict[str, Any]:
    """Export ``spec.method`` with the budget and ``spec.seed``, run it in the simulator (threads == sites,
    one torch thread per site process; stopped after ``timeout`` seconds), and collect the report's results and the
    sites' per-image rows."""
    from fedseg.recipes.export import export_job

    sites = list(mapping)
    # one export at a time (``fedseg bench --parallel`` runs this in threads): MONAI's bundle parser scans sys.modules
    # while it instantiates, and a module another thread imports meanwhile breaks that scan
    with _EXPORT_LOCK:
        job = export_job(
            spec.method, out / "jobs" / spec.id, budget.profile, num_rounds=budget.num_rounds(),
            script_args=f"--{'site_overrides' if Path(site_map_file).name == 'site_overrides.json' else 'site_datalists'} "
                        f"{Path(site_map_file).resolve()}", min_clients=len(sites),
            task_check_period=budget.task_check_period, **{**budget.overrides(spec.seed), **spec.variant_args},
            **({"task_timeout": budget.task_timeout} if budget.task_timeout is not None else {}),
        )
    patch_job(job, budget.task_request_interval)
    workspace = out / "workspaces" / spec.id
    res = run_simulator(job, workspace, sites, threads=len(sites), omp_threads=budget.omp_threads,
                        fedseg_threads=budget.omp_threads, timeout=timeout, log_path=out / "logs" / f"{spec.id}.log")
    return method_record(spec, mapping, workspace, res["report"], res["command"], res["report_path"], res["total_wall_s"])


def method_record(spec: RunSpec, mapping: Mapping[str, str], workspace: Path, report: Dict[str, Any],
                  command: Any, report_path: str, wall_s: float) -> Dict[str, Any]:
    """A method run's bench record from its server ``report.json`` and its sites' per-image files."""
    sites = list(mapping)
    task = federation_task(mapping)
    metrics, val_key = task_metrics(task), VAL_METRIC[task]
    walls = [r["wall"] for r in round_timings(report)]
    record: Dict[str, Any] = {
        "kind": "method", "label": spec.label, "method": spec.method, "seed": spec.seed,
        "variant_args": spec.variant_args, "task": task,
        "train_config": report.get("config", {}).get("train_config"),
        "num_rounds": report.get("config", {}).get("num_rounds"),
        "command": command, "report_path": str(report_path), "workspace": str(workspace),
        "wall_s": wall_s,
        "round_walls": walls,
        "median_round_wall": statistics.median(walls[1:] if len(walls) > 1 else walls) if walls else None,
        "median_task_times": _median_task_times(report["rounds"][1:] or report["rounds"]),
        "val_metric": val_key,
        f"{val_key}_per_round": [_mean([clean(m.get(val_key)) for m in r["metrics"].values()]) for r in report["rounds"]],
        "upload_mb_per_site_round": _payload_mb(report["rounds"], "bytes_received", len(sites)),
        # each site's peak resident memory over the run (its own report, metrics peak_memory_mb), then the largest site
        "peak_site_memory_mb": max((m["peak_memory_mb"] for r in report["rounds"] for m in r["metrics"].values()
                                    if m.get("peak_memory_mb") is not None), default=None),
        "download_mb_per_site_round": _payload_mb(report["rounds"], "bytes_sent", len(sites)),
        "final": {}, "per_image": {},
    }
    for model in ("global", "personalized", "global_best_val", "local"):
        final = (report.get("final") or {}).get(model)
        if not final:
            continue
        names = with_structures(metrics, [k for s in sites if s in final for k in final[s]],
                                report.get("config", {}).get("train_config"))
        record["final"][model] = {s: {k: clean(final[s].get(k)) for k in names} for s in sites if s in final}
        # site-local files, read here because every site of the bench runs on this machine
        record["per_image"][model] = {s: read_site_per_image(workspace, s, model) for s in sites if s in final}
    return record


def _payload_mb(rounds: List[Dict[str, Any]], field: str, n_sites: int) -> Optional[float]:
    """Median over rounds of a round's payload bytes (``bytes_sent`` / ``bytes_received`` in report.json)
    per site, in MB (1e6 bytes)."""
    values = [r[field] / n_sites for r in rounds if r.get(field)]
    return statistics.median(values) / 1e6 if values else None


# --------------------------------------------------------------------------------- reference runs
def pooled_datalist(mapping: Mapping[str, str], path: Path) -> Path:
    """A datalist whose splits are the unions of the sites' splits (absolute paths, nothing copied).

    Segmentation: each entry keeps its data set's fixed ``rescale`` factor (patch mode), and the pooled list
    declares the sites' common ``spatial_mode`` (none when they differ: then the job's ``train_config``
    decides). Classification (:func:`pooled_classification_datalist`): the sites' common label space and
    integer labels.
    """
    from fedseg.data.datalist import common_spatial_mode, load_datalist, read_datalist_json, write_json_atomic

    if federation_task(mapping) == "classification":
        return pooled_classification_datalist(mapping, path)
    union: Dict[str, List[Dict[str, Any]]] = {"training": [], "validation": [], "test": []}
    for site, p in mapping.items():
        _, info = read_datalist_json(p)
        rescale = float(info.get("rescale", 1.0))
        for split, entries in load_datalist(p, check_files=False).items():
            # image + label (+ the data set's rescale factor) only: extra keys that only some sites
            # have (e.g. retina "fov") break collation
            # and each site's stored mask encoding (label_values), which may differ from site to site
            union[split] += [{"image": e["image"], "label": e["label"], "rescale": float(e.get("rescale", rescale)),
                              **({"label_values": e["label_values"]} if "label_values" in e else {})} for e in entries]
    header = {"name": "pooled", "sites": list(mapping), "allow_external_paths": True}  # the sites' own files
    # the classes and regions every site declares (fedseg bench checked they agree before any run)
    _, first = read_datalist_json(next(iter(mapping.values())))
    header.update({k: first[k] for k in ("labels", "regions", "num_classes") if k in first})
    mode = common_spatial_mode(mapping.values())
    if mode:
        header["spatial_mode"] = mode
    return write_json_atomic(Path(path), {**header, **union})


def pooled_classification_datalist(mapping: Mapping[str, str], path: Path) -> Path:
    """The union of classification silos: ``task`` / ``label_space`` of the sites (which must share one
    global label space, else the class indices would mean different classes), entries ``{"image":
    absolute path, "label": int}``; ``classes`` = the label-space classes any silo holds.

    Raises:
        ValueError: the sites' label spaces differ.
    """
    from fedseg.data.classification import label_space, load_classification_datalist
    from fedseg.data.datalist import read_datalist_json, write_json_atomic

    spaces = {}
    union: Dict[str, List[Dict[str, Any]]] = {"training": [], "validation": [], "test": []}
    for site, p in mapping.items():
        dl_path, info = read_datalist_json(p)
        spaces[site] = label_space(info, dl_path)
        for split, entries in load_classification_datalist(p, check_files=False).items():
            union[split] += [{"image": e["image"], "label": int(e["label"])} for e in entries]
    space = next(iter(spaces.values()))
    if any(s != space for s in spaces.values()):
        raise ValueError(f"cannot pool classification silos with different label spaces: {spaces}")
    held = sorted({e["label"] for entries in union.values() for e in entries})
    header = {"name": "pooled", "task": "classification", "label_space": space, "classes": [space[k] for k in held],
              "sites": list(mapping), "allow_external_paths": True}  # the sites' own files
    return write_json_atomic(Path(path), {**header, **union})


def _train(name: str, datalist: str, cfg: Dict[str, Any], rounds: int, val_engines: Dict[str, Any]):
    """R calls of the task's engine ``train`` (E local epochs each, Adam state kept, per-round learning
    rate) — the federated schedule without the federation. Returns (engine, model, seconds, losses, mean
    over ``val_engines`` of their validation metric per round: Dice or accuracy)."""
    from fedseg.engine.factory import build_engine
    from fedseg.objectives.base import ClientObjective, RoundContext

    engine = build_engine(name, datalist, cfg)
    model = engine.build_network()
    objective = ClientObjective()
    seconds, losses, val = 0.0, [], []
    for r in range(rounds):
        started = time.perf_counter()
        ctx = RoundContext(site=name, round=r, total_rounds=rounds, train_config=cfg)
        losses.append(engine.train(model, objective, ctx)["train_loss"])
        seconds += time.perf_counter() - started
        # the value a federated site sends with its weights (val_dice / val_accuracy)
        due = validation_due(cfg, r, rounds)
        val.append(_mean([next(iter(e.validation_metrics(model).values())) for e in val_engines.values()]) if due else None)
    return engine, model, seconds, losses, val


def reference_config(budget: Budget, seed: int, mapping: Mapping[str, str]) -> Dict[str, Any]:
    """``{"num_rounds", "train_config"}`` of a reference run.

    Segmentation: the base profile with the budget's overrides (with a protocol, its keys too: the references
    train as every method of the bench does; a profile other than ``tiny`` / ``default`` needs one, or
    ``rounds``). Classification: also FedEFM's
    classification defaults and ``paper`` profile (``fedseg.recipes.fedefm``) under the budget's
    overrides, and ``num_classes`` = the sites' label-space size, so that the references train the same
    ViT as the federated runs.
    """
    from fedseg.config import PROFILES, resolve_profile

    overrides = budget.overrides(seed)
    if federation_task(mapping) != "classification":
        # a paper profile: the protocol's keys are in the overrides already; the rest is the base configuration
        profiles = None
        if budget.profile not in PROFILES:
            if budget.num_rounds() is None:
                raise ValueError(f"a reference run with profile {budget.profile!r} needs the bench's protocol or rounds")
            profiles = {budget.profile: {"num_rounds": budget.num_rounds()}}
        return resolve_profile(budget.profile, profiles, budget.num_rounds(), **overrides)
    from fedseg.data.classification import label_space
    from fedseg.data.datalist import read_datalist_json
    from fedseg.recipes.fedefm import CLASSIFICATION_DEFAULTS, PAPER_PROFILES

    path, info = read_datalist_json(next(iter(mapping.values())))
    merged = {**CLASSIFICATION_DEFAULTS, **overrides}
    merged.setdefault("num_classes", len(label_space(info, path)))
    return resolve_profile(budget.profile, PAPER_PROFILES, budget.rounds, **merged)


def run_reference(spec: RunSpec, budget: Budget, mapping: Mapping[str, str], out: Path) -> Dict[str, Any]:
    """``local``: every site trains alone; ``pooled``: one model on the union of the training splits
    (for classification: the centralised reference of the FedEFM benchmark).

    Both use the task's engine (:func:`fedseg.engine.factory.build_engine`), the train_config of
    :func:`reference_config` and the schedule of the federated runs (``rounds`` calls of ``local_epochs``
    epochs); the final model is evaluated on each site's test split (per image).
    """
    import torch

    from fedseg.engine.factory import build_engine

    if budget.omp_threads not in (None, "", "default"):
        torch.set_num_threads(int(budget.omp_threads))
    task = federation_task(mapping)
    metrics, val_key = task_metrics(task), VAL_METRIC[task]
    resolved = reference_config(budget, spec.seed, mapping)
    cfg, rounds = resolved["train_config"], resolved["num_rounds"]
    engines = {site: build_engine(site, p, cfg) for site, p in mapping.items()}
    final, per_image, seconds, losses, val_curves = {}, {}, {}, {}, {}
    started = time.perf_counter()
    if spec.method == "local":
        for site, p in mapping.items():
            engine, model, secs, loss, val = _train(site, p, cfg, rounds, {site: engines[site]})
            summary, rows = engine.evaluate(model, "test", per_image=True)
            final[site], per_image[site] = {k: clean(summary.get(k)) for k in with_structures(metrics, list(summary), cfg)}, rows
            seconds[site], losses[site], val_curves[site] = secs, [loss[0], loss[-1]], val
        val_curve = [_mean([c[r] for c in val_curves.values()]) for r in range(rounds)]
    elif spec.method == "pooled":
        path = pooled_datalist(mapping, out / "data" / "pooled" / "datalist.json")
        _, model, secs, loss, val_curve = _train("pooled", str(path), cfg, rounds, engines)
        for site in mapping:
            summary, rows = engines[site].evaluate(model, "test", per_image=True)
            final[site], per_image[site] = {k: clean(summary.get(k)) for k in with_structures(metrics, list(summary), cfg)}, rows
        seconds, losses = {"pooled": secs}, {"pooled": [loss[0], loss[-1]]}
    else:
        raise ValueError(f"unknown reference {spec.method!r}; choose from {REFERENCES}")
    return {
        "kind": "reference", "label": spec.label, "method": spec.method, "seed": spec.seed, "variant_args": {},
        "task": task, "train_config": cfg, "num_rounds": rounds,
        "wall_s": time.perf_counter() - started, "train_seconds": seconds, "train_loss_first_last": losses,
        "val_metric": val_key, f"{val_key}_per_round": val_curve,
        "final": {"global": final}, "per_image": {"global": per_image},
    }
