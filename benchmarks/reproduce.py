"""Every table of the results page from one stored command: ``python benchmarks/reproduce.py TABLE [--run]``.

The registry below names each table: the run that makes its data (the exact commands, run from the repository
root; the last one writes the output, earlier ones prepare its data), the output it reads, and its renderer. A
table is one markdown table with a one-line caption above it: data, seeds, budget, machine, date and the code
version, all read from the output (``results.json`` of a ``fedseg bench`` run, or a benchmark script's JSON).

Usage:
    python benchmarks/reproduce.py --list                   # tables, their records and commands
    python benchmarks/reproduce.py fundus-accuracy          # render from its committed record (benchmarks/results)
    python benchmarks/reproduce.py fundus-accuracy --run    # run its commands (into --out-root), record, render
    python benchmarks/reproduce.py fundus-accuracy --record # record an output made earlier (or on a GPU machine)
    python benchmarks/reproduce.py --all                    # every table, and the figures (--figures DIR)
    python benchmarks/reproduce.py --check-page docs/benchmarks.md README.md   # the page equals its render?
    python benchmarks/reproduce.py --update-page docs/benchmarks.md README.md  # rewrite its table blocks
    python benchmarks/reproduce.py glance [--link docs/benchmarks.md]   # "Results at a glance"
    ... --records DIR      read records from DIR (an output root has the same layout, so it can be named too)
    ... --out-root DIR     where --run writes its outputs (default $FEDSEG_BENCH_OUT, else ./bench_out)
    ... --data-root DIR    the real data sets' parent folder for the import commands (default $FEDSEG_DATASETS)

Records (``benchmarks/records.py``): a run's tables need its ``results.json`` and per-run records only; those are
committed under ``benchmarks/results/`` with the output root written as ``{root}``. Workspaces, logs, generated
data, plots and weights stay in the output root, out of git.

Adding a table: a run in ``RUNS`` (output folder or file relative to the output root, and its commands, with
``{out}`` for that output and ``{root}`` for the output root) if its run is new, then one entry in ``TABLES``:
``{"run": RUN, "render": "accuracy" | "cost" | ..., "title": ...}`` (``"data"``: its row label in the glance table,
for accuracy tables of runs whose baseline is FedAvg; ``"metrics"``: extra accuracy columns such as ``hd95_mm`` or
``dice_fov@DRIVE``, one site's value of a metric only that site reports; ``"seeds"``: render only these seeds of a
bench, re-aggregated from its run records, which also accepts a bench whose command differs only in ``--seeds`` as
long as it ran them; ``"baseline"``: another of the bench's labels as the baseline of the paired tests, the bench
re-aggregated from its run records; ``"missing_ok"``: a multi-run table drawn from the runs that exist, naming the others;
``"paper"``: a column of published numbers).

A stored output made by another command than the registry's is refused (the registry or the output is stale):
fix the registry or re-run; ``--ignore-command`` renders it anyway and says so in the caption. The value of
``--out`` is not compared (an output made elsewhere, e.g. under /tmp on a GPU machine, and recorded is the same run),
nor the output root's own path (``{root}``); every other word is.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
if __name__ == "__main__":  # figures.py and page.py import this module by name: one copy, one set of error classes
    sys.modules.setdefault("reproduce", sys.modules[__name__])
from records import RECORDS_ROOT, ROOT_TOKEN, record_output, sanitise  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: what tables are drawn from: the committed run records
DEFAULT_ROOT = RECORDS_ROOT
#: where ``--run`` writes outputs (workspaces, logs: never in git; ``/bench_out/`` is in .gitignore)
OUT_ROOT = Path(os.environ.get("FEDSEG_BENCH_OUT") or REPO / "bench_out")
#: the folder holding the real data sets (retina_vessels/, nuclei_he/, ...) for the import commands
DATA_ROOT = os.environ.get("FEDSEG_DATASETS") or ""

# ------------------------------------------------------------------------------------------ registry
#: rounds of each real federation's server-step bench (its command and its tables' titles)
SERVER_STEP_ROUNDS = {"retina": 20, "nuclei": 10}
#: FedEvi's protocol ablation: one bench per local-protocol setting (name, methods, train_config sets)
PROTOCOL_BENCHES = (
    ("base", "fedavg fedevi fedevi_ref_surrogate=fedevi:uncertainty_grid=network,clamp_epistemic=false "
             "fedevi_assign=fedevi:accumulate=false", ""),
    ("optimiser", "fedavg fedevi", " --set adam_betas=[0.9,0.99] weight_decay=1e-5 lr_decay_per_round=0.99"),
    ("batch", "fedavg fedevi", " --set batch_size=8 drop_last=true"),
    ("augment", "fedavg fedevi", " --set augment_level=flip"),
    ("intensity", "fedavg fedevi", " --set intensity=image_max"),
    ("network", "fedavg fedevi", " --set network_variant=three_conv_nearest"),
    # the network's two parts apart: the reference layout with PyTorch's initialisation, ours with Kaiming fan-out
    ("architecture", "fedavg fedevi", " --set network_variant=three_conv_nearest network_init=pytorch"),
    ("init", "fedavg fedevi", " --set network_init=kaiming_fan_out"),
    # every difference at once: the paper protocol (FedAvg with the authors' Dice-only loss) at the default budget
    ("authors", "fedavg fedavg_dicece=fedavg:lambda_ce=1.0 fedevi",
     " --profile paper --rounds 10 --local-epochs 1 --set image_size=64"),
)
#: the ablation's rows: (bench, FedAvg label, FedEvi label, what differs from the suite default, metric, model)
PROTOCOL_ROWS = [
    ("base", "fedavg", "fedevi", "suite default", "dice", "global"),
    ("optimiser", "fedavg", "fedevi", "+ optimiser: Adam betas (0.9, 0.99), weight decay 1e-5, lr x 0.99 per round", "dice", "global"),
    ("batch", "fedavg", "fedevi", "+ batch 8, last incomplete batch dropped", "dice", "global"),
    ("augment", "fedavg", "fedevi", "+ augmentation: one flip along a random axis (p 0.5)", "dice", "global"),
    ("intensity", "fedavg", "fedevi", "+ intensity: each image / its maximum", "dice", "global"),
    ("network", "fedavg", "fedevi", "+ network: three-conv U-Net, nearest upsampling, Kaiming fan-out", "dice", "global"),
    ("architecture", "fedavg", "fedevi", "... its layout alone (PyTorch's initialisation)", "dice", "global"),
    ("init", "fedavg", "fedevi", "... its initialisation alone (Kaiming fan-out on the suite's U-Net)", "dice", "global"),
    ("base", "fedavg", "fedevi_ref_surrogate", "+ surrogate uncertainties on the network grid, epistemic unclamped", "dice", "global"),
    ("base", "fedavg", "fedevi_assign", "+ weights from each round's G / A alone (the repository's other main loop)", "dice", "global"),
    ("authors", "fedavg_dicece", "fedevi", "all of the above (the `paper` protocol), FedAvg with Dice + CE", "dice", "global"),
    ("authors", "fedavg", "fedevi", "all of the above, FedAvg with the authors' Dice-only loss", "dice", "global"),
    ("authors", "fedavg", "fedevi", "... scored after largest-component post-processing", "dice_lcc", "global"),
    ("authors", "fedavg", "fedevi", "... the best validation round's model", "dice", "global_best_val"),
    ("authors-30", "fedavg_dicece", "fedevi", "the `paper` protocol at 30 rounds, FedAvg with Dice + CE", "dice", "global"),
    ("authors-30", "fedavg", "fedevi", "the `paper` protocol at 30 rounds, FedAvg with the Dice-only loss", "dice", "global"),
]

#: the real federations read in place: the import command and the site datalists it writes
REAL_DATA = {
    "retina": ("fedseg data retina --src {data}/retina_vessels --out {root}/cost/retina_data",
               "{root}/cost/retina_data/site_datalists.json"),
    "nuclei": ("fedseg data nuclei --src {data}/nuclei_he --out {root}/cost/nuclei_data",
               "{root}/cost/nuclei_data/site_datalists.json"),
}


#: a bench of every method with and without the server step: the baselines, then each method plain and stepped
SERVER_STEP_METHODS = " ".join(
    ["fedavg", "fedevi", "fedavgm", "feddyn"]
    + [f"{m}+m={m}:server_optimizer=sgd-momentum" for m in ("fedevi", "graphfedseg", "fvac", "pathfl")] + ["fvac", "graphfedseg", "pathfl"])


def real_bench(federation: str, out: str, options: str) -> Dict[str, Any]:
    """A run of ``fedseg bench`` on a real federation at native resolution: import, then the bench with ``options``
    (methods, references, seeds, rounds), one local epoch and the 0.2 s task request interval."""
    import_data, datalists = REAL_DATA[federation]
    return {"out": out, "commands": [import_data, f"fedseg bench --site-datalists {datalists} {options} --local-epochs 1 "
                                                  "--task-request-interval 0.2 --out {out}"]}


#: run id -> output (folder or .json file, relative to the output root), commands; ``result``: the JSON file inside
#: an output folder (default ``results.json``)
RUNS: Dict[str, Dict[str, Any]] = {
    "fundus": {"out": "fundus", "commands": [
        "fedseg bench --family fundus --methods fedavg fedevi graphfedseg fvac pathfl fedavg_e5=fedavg:local_epochs=5 "
        "--references local pooled --seeds 0 1 2 --out {out}"]},
    # every method on the built-in polyp family (FedAvg's and FedEvi's runs are the protocol ablation's suite default);
    # FedAvg with FVAC's five local epochs tells FVAC's aggregation and losses from its extra local steps
    "polyp": {"out": "polyp", "commands": [
        "fedseg bench --family polyp --methods fedavg fedevi graphfedseg fvac pathfl fedavg_e5=fedavg:local_epochs=5 "
        "--references --seeds 0 1 2 --reuse {root}/fedevi_protocol/base --out {out}"]},
    # FedEvi's local protocol: FedAvg and FedEvi under the suite's default, then one difference from the authors'
    # protocol switched at a time, then all of them (the `paper` profile at the default budget), built-in polyp
    **{f"fedevi-protocol-{name}": {"out": f"fedevi_protocol/{name}", "commands": [
        f"fedseg bench --family polyp --references --seeds 0 1 2 --methods {methods}{sets} --out {{out}}"]}
       for name, methods, sets in PROTOCOL_BENCHES},
    # the suite default, the reference U-Net's layout and the authors' protocol on the real retina federation
    **{f"fedevi-protocol-retina-{name}": real_bench("retina", f"fedevi_protocol/retina_{name}",
                                                    f"--methods {methods} --references --seeds 0 1 2 --rounds 20{extra}")
       for name, methods, extra in (("base", "fedavg fedevi", ""),
                                    ("authors", "fedavg fedavg_dicece=fedavg:lambda_ce=1.0 fedevi", " --profile paper"),
                                    ("architecture", "fedavg fedevi",
                                     " --set network_variant=three_conv_nearest network_init=pytorch"))},
    # every method with and without the server step (FedAvgM's heavy ball, lr 1, momentum 0.6) against FedAvg and the
    # baselines with a server-side correction, real retina; FedAvg and FedEvi are the protocol bench's runs
    "retina-server-step": {"out": "retina_server_step", "commands": [
        REAL_DATA["retina"][0],
        f"fedseg bench --site-datalists {REAL_DATA['retina'][1]} --methods {SERVER_STEP_METHODS} --references "
        f"--seeds 0 1 2 --rounds {SERVER_STEP_ROUNDS['retina']} --local-epochs 1 --task-request-interval 0.2 "
        "--reuse {root}/fedevi_protocol/retina_base --out {out}"]},
    # the same on the real nuclei federation (MoNuSeg / TNBC at 40x, native resolution); every method run here.
    # 10 rounds, whole-tile validation only in the last: on 2 CPUs a run of 20 rounds took 6 min (33 runs: 3.3 h), a
    # third of it the sliding-window test of the 1000 px tiles, and each validation round 4x a training round
    "nuclei-server-step": {"out": "nuclei_server_step", "commands": [
        REAL_DATA["nuclei"][0],
        f"fedseg bench --site-datalists {REAL_DATA['nuclei'][1]} --methods {SERVER_STEP_METHODS} --references "
        f"--seeds 0 1 2 --rounds {SERVER_STEP_ROUNDS['nuclei']} --local-epochs 1 --task-request-interval 0.2 "
        f"--set validate_every={SERVER_STEP_ROUNDS['nuclei']} --out {{out}}"]},
    # the GPU check (benchmarks/gpu_check.py) on a CUDA machine: the CUDA tests and what one GPU does
    "gpu-check": {"out": "gpu_check", "result": "gpu_check.json", "commands": ["python benchmarks/gpu_check.py --out {out}"]},
    # a site at full size: CT-like volumes as large as a hospital's (generated into the output root), the data path's
    # memory and time within and beyond the cache, and fedseg infer on one whole volume
    "fullsize-ct": {"out": "fullsize_ct", "result": "fullsize_ct.json", "commands": [
        "python benchmarks/fullsize_ct.py all --data {root}/fullsize_ct_data --out {out}"]},
    # the check at three times the budget: does the authors' protocol train, and FedEvi gain, when sites take more steps?
    "fedevi-protocol-authors-30": {"out": "fedevi_protocol/authors_30", "commands": [
        "fedseg bench --family polyp --references --seeds 0 1 2 --methods fedavg fedavg_dicece=fedavg:lambda_ce=1.0 fedevi "
        "--profile paper --rounds 30 --local-epochs 1 --set image_size=64 --out {out}"]},
}

def server_step_tables(federation: str, data: str, metrics: List[str]) -> Dict[str, Dict[str, Any]]:
    """The four tables of a server-step bench on a real federation: accuracy against FedAvg (``data``: its glance
    label; ``metrics``: extra accuracy columns), the same runs against FedAvgM, the ranking, and the cost."""
    run, where, budget = f"{federation}-server-step", f"real {federation} federation", f"({SERVER_STEP_ROUNDS[federation]} rounds)"
    tables = {
        run: {"title": f"Each method with the server step, against FedAvg, FedAvgM and FedDyn, {where} at native "
                       "resolution " + budget, "render": "accuracy", "data": data,
              **({"metrics": metrics} if metrics else {})},
        f"{run}-vs-fedavgm": {"render": "accuracy", "baseline": "fedavgm",
                              "title": f"The same runs against FedAvgM, {where} {budget}"},
        f"{run}-ranking": {"render": "ranking", "baseline": "fedavg",
                           "title": f"Which approach to use on the {where} {budget}"},
        f"{run}-cost": {"render": "cost", "title": f"Cost of the server step on the {where} {budget}"},
    }
    return {table: {"run": run, **entry} for table, entry in tables.items()}


#: table id -> run(s), renderer, title (and renderer options)
TABLES: Dict[str, Dict[str, Any]] = {
    "fundus-accuracy": {"run": "fundus", "render": "accuracy", "data": "built-in fundus (rim, cup), 3 sites",
                        "title": "Accuracy on the built-in fundus family (optic disc rim and cup), 3 sites"},
    "fundus-cost": {"run": "fundus", "render": "cost", "title": "Cost on the built-in fundus family, 3 sites"},
    "polyp-accuracy": {"run": "polyp", "render": "accuracy", "data": "built-in polyp, 3 sites",
                       "title": "Accuracy on the built-in polyp family, 3 sites"},
    "polyp-cost": {"run": "polyp", "render": "cost", "title": "Cost on the built-in polyp family, 3 sites"},
    # the same runs against FedAvg with FVAC's five local epochs: is FVAC's lead its method or its local steps?
    **{f"{fam}-vs-local-steps": {"run": fam, "render": "accuracy", "baseline": "fedavg_e5",
                                 "title": f"The same runs against FedAvg with five local epochs (FVAC's), built-in {fam}"}
       for fam in ("polyp", "fundus")},
    "retina-accuracy": {"run": "fedevi-protocol-retina-base", "render": "accuracy", "metrics": ["dice_fov@DRIVE"],
                        "data": "real retina (DRIVE / STARE / CHASE_DB1), native resolution",
                        "title": "Accuracy on the real retina federation at native resolution (20 rounds)"},
    "retina-cost": {"run": "fedevi-protocol-retina-base", "render": "cost",
                    "title": "Cost on the real retina federation at native resolution (20 rounds)"},
    "fedevi-protocol": {"run": [f"fedevi-protocol-{b[0]}" for b in PROTOCOL_BENCHES] + ["fedevi-protocol-authors-30"],
                        "render": "protocol-ablation",
                        "rows": PROTOCOL_ROWS, "reference": ("base", "fedavg", "fedevi"),
                        "paper": "the authors' code on Kvasir-SEG + CVC-ClinicDB (128 px, 6 rounds x 1 epoch, one seed): "
                                 "FedEvi - FedAvg +0.040 (their FedAvg: Dice-only loss); FedEvi paper Table 1 "
                                 "(4 polyp sites, 200 rounds): +0.098",
                        "title": "What carries FedEvi's gain: FedAvg and FedEvi under the suite's local protocol, one "
                                 "difference from the authors' protocol at a time, and all of them (built-in polyp)"},
    "fedevi-protocol-retina": {
        "run": ["fedevi-protocol-retina-base", "fedevi-protocol-retina-authors", "fedevi-protocol-retina-architecture"],
        "render": "protocol-ablation", "reference": ("retina-base", "fedavg", "fedevi"),
        "rows": [("retina-base", "fedavg", "fedevi", "suite default", "dice", "global"),
                 ("retina-architecture", "fedavg", "fedevi", "+ the reference U-Net's layout (PyTorch's initialisation)",
                  "dice", "global"),
                 ("retina-authors", "fedavg_dicece", "fedevi", "the authors' protocol, FedAvg with Dice + CE", "dice", "global"),
                 ("retina-authors", "fedavg", "fedevi", "the authors' protocol, FedAvg with the authors' Dice-only loss",
                  "dice", "global"),
                 ("retina-authors", "fedavg", "fedevi", "... scored after largest-component post-processing", "dice_lcc",
                  "global"),
                 ("retina-authors", "fedavg", "fedevi", "... the best validation round's model", "dice", "global_best_val")],
        "title": "FedEvi against FedAvg under the suite's and the authors' local protocol, real retina federation "
                 "(native resolution, 20 rounds)"},
    "retina-layout-cost": {"run": "fedevi-protocol-retina-architecture", "render": "cost",
                           "title": "Cost with the reference U-Net's layout on the real retina federation (20 rounds)"},
    # the check the suite keeps: FedEvi's paper protocol for every method, FedEvi against FedAvg (built-in polyp)
    "fedevi-paper-polyp-accuracy": {"run": "fedevi-protocol-authors", "render": "accuracy", "metrics": ["dice_lcc"],
                                    "title": "FedEvi against FedAvg, both with the authors' local protocol "
                                             "(`--profile paper`), built-in polyp at the default budget"},
    "fedevi-paper-polyp-30-accuracy": {"run": "fedevi-protocol-authors-30", "render": "accuracy", "metrics": ["dice_lcc"],
                                       "title": "The same at 30 rounds: FedEvi against FedAvg with the authors' local "
                                                "protocol, built-in polyp"},
    # each method with and without the server step against the strongest baselines, one bench per real federation
    **{table: entry for fed, data, metrics in (
        ("retina", "real retina (DRIVE / STARE / CHASE_DB1), native resolution", ["dice_fov@DRIVE"]),
        ("nuclei", "real nuclei (MoNuSeg / TNBC), native resolution", []))
       for table, entry in server_step_tables(fed, data, metrics).items()},
    **{f"gpu-check-{part}": {"run": "gpu-check", "render": "gpu-check", "part": part, "title": title}
       for part, title in (("tests", "The CUDA tests on one GPU"),
                           ("engine", "Training throughput on one GPU: the engine against a plain PyTorch loop"),
                           ("simulator", "One FedAvg job of 4 sites sharing one GPU (NVFlare simulator, 2 rounds)"),
                           ("site-ranks", "A site as DDP ranks under torchrun on one GPU"),
                           ("networks-96", "The 3-D paper-profile networks at 96³ patches on one GPU"))},
    "fullsize-ct-loaders": {"run": "fullsize-ct", "render": "fullsize-ct", "part": "loaders",
                            "title": "A site at full size: training data within and beyond the memory cache"},
    "fullsize-ct-inference": {"run": "fullsize-ct", "render": "fullsize-ct", "part": "infer",
                              "title": "A site at full size: `fedseg infer` on one whole CT volume"},
    "glance": {"render": "glance", "title": "Results at a glance", "link": "docs/benchmarks.md",
               "from": ["polyp-accuracy", "fundus-accuracy", "retina-server-step", "nuclei-server-step"]},
}


# ------------------------------------------------------------------------------------------- errors
class ReproduceError(ValueError):
    """A bad table id, registry entry, stored output or failed command; the message names it."""


class MissingOutput(ReproduceError):
    """A table's output does not exist yet; the message gives the commands that make it."""


# ---------------------------------------------------------------------------------------- registry
def check_registry(runs: Mapping[str, Mapping[str, Any]] = RUNS, tables: Mapping[str, Mapping[str, Any]] = TABLES) -> None:
    """Every table names known runs, a known renderer and a title; every run has an output and commands ending in
    the one that writes ``{out}``.

    Raises:
        ReproduceError: naming the table or run that is wrong.
    """
    for run_id, run in runs.items():
        if not run.get("out") or not run.get("commands"):
            raise ReproduceError(f"run {run_id!r}: needs 'out' and 'commands'")
        if "{out}" not in run["commands"][-1]:
            raise ReproduceError(f"run {run_id!r}: its last command must write the output ('{{out}}'): {run['commands'][-1]}")
    for table_id, table in tables.items():
        if table.get("render") not in RENDERERS:
            raise ReproduceError(f"table {table_id!r}: unknown renderer {table.get('render')!r}; known: {sorted(RENDERERS)}")
        if not table.get("title"):
            raise ReproduceError(f"table {table_id!r}: needs a 'title'")
        if table["render"] == "glance":
            bad = [t for t in table.get("from", []) if t not in tables or tables[t].get("render") != "accuracy"]
            if bad or not table.get("from"):
                raise ReproduceError(f"table {table_id!r}: 'from' must list accuracy tables, got {table.get('from')} (bad: {bad})")
            continue
        unknown = [r for r in run_ids(table) if r not in runs]
        if unknown or not run_ids(table):
            raise ReproduceError(f"table {table_id!r}: unknown run(s) {unknown or table.get('run')}; known: {sorted(runs)}")


def run_ids(table: Mapping[str, Any]) -> List[str]:
    run = table.get("run") or []
    return [run] if isinstance(run, str) else list(run)


def get_table(table_id: str, tables: Mapping[str, Mapping[str, Any]] = TABLES) -> Mapping[str, Any]:
    if table_id not in tables:
        raise ReproduceError(f"unknown table {table_id!r}; known tables: {', '.join(sorted(tables))} (see --list)")
    return tables[table_id]


def output_path(run: Mapping[str, Any], root: Path) -> Path:
    """The run's output under ``root`` (what ``{out}`` stands for)."""
    return Path(root) / run["out"]


def result_path(run: Mapping[str, Any], root: Path) -> Path:
    """The JSON a table reads: ``out`` itself when it is a .json file, else ``out/<result or results.json>``."""
    out = output_path(run, root)
    if run.get("result"):
        return out / run["result"]
    return out if out.suffix == ".json" else out / "results.json"


def commands(run: Mapping[str, Any], root: Path, data_root: Optional[str] = None) -> List[str]:
    """The run's commands with ``{out}``, ``{root}`` and ``{data}`` (the real data sets' folder: ``data_root``, else
    ``$FEDSEG_DATASETS``, else left as ``{data}`` for the reader to fill in) filled in."""
    data = data_root or DATA_ROOT or "{data}"
    return [c.format(out=output_path(run, root), root=Path(root), data=data) for c in run["commands"]]


def record_run(run_id: str, out_root: Path, records_root: Path = Path(DEFAULT_ROOT),
               runs: Mapping[str, Mapping[str, Any]] = RUNS) -> List[Path]:
    """Record run ``run_id``'s output from ``out_root`` into ``records_root`` (:func:`records.record_output`).

    Raises:
        MissingOutput: the output does not exist under ``out_root``.
        ReproduceError: it cannot be recorded (the message says why).
    """
    run = runs[run_id]
    path = result_path(run, out_root)
    if not path.is_file():
        raise MissingOutput(f"run {run_id!r}: no output at {path} to record; make it with --run")
    try:
        return record_output(path, out_root, records_root)
    except ValueError as e:
        raise ReproduceError(f"run {run_id!r}: {e}") from None


def _normalise(command: str) -> List[str]:
    """A command's words without the interpreter: ``python -m fedseg bench`` / ``python benchmarks/x.py`` ->
    ``fedseg bench`` / ``benchmarks/x.py`` (``fedseg bench`` records ``fedseg ...``, scripts their ``sys.argv``);
    the value of ``--out`` (``--out X`` or ``--out=X``) becomes ``{out}``: where a run wrote is not what it ran."""
    words = shlex.split(command)
    if words and Path(words[0]).name.startswith("python"):
        words = words[1:]
        if words[:1] == ["-m"]:
            words = words[1:]
    out = []
    for word in words:
        if out and out[-1] == "--out":
            word = "{out}"
        elif word.startswith("--out="):
            out += ["--out", "{out}"]
            continue
        out.append(word)
    return out


def stored_command_matches(stored: Optional[str], expected: str) -> bool:
    return stored is not None and _normalise(stored) == _normalise(expected)


def _without_seeds(words: List[str]) -> List[str]:
    """Normalised command words with ``--seeds`` and its values left out."""
    out, in_seeds = [], False
    for word in words:
        if word == "--seeds":
            in_seeds = True
            continue
        if in_seeds and word.isdigit():
            continue
        in_seeds = False
        out.append(word)
    return out


def same_but_seeds(stored: Optional[str], expected: str) -> bool:
    """``stored`` is ``expected`` but for the ``--seeds`` values (and ``--out``'s): a bench of other seeds in the
    same output, e.g. the first seed of a three-seed bench still running, or all three of a one-seed table's bench."""
    return stored is not None and _without_seeds(_normalise(stored)) == _without_seeds(_normalise(expected))


#: the fields of a bench's ``results.json`` that describe how it ran (not aggregated from the runs)
HEADER_FIELDS = ("benchmark", "date", "command", "code_version", "machine", "budget", "spatial", "site_datalists", "data")


#: :func:`select_seeds`' aggregations by the digest of everything they are computed from (run records, sites, header,
#: baseline): a page check renders one bench in several tables, each of its paired tests is computed once per process
_REBUILT: Dict[str, Dict[str, Any]] = {}


def select_seeds(results: Dict[str, Any], seeds: Sequence[int], baseline: Optional[str] = None) -> Dict[str, Any]:
    """``results`` rebuilt from the bench's stored run records of ``seeds`` only (``runs/<id>.json`` in its output
    folder): the same aggregation (:func:`fedseg.bench.report.build_results`) over fewer seeds, and with ``baseline``
    against another of the bench's labels than its own baseline. ``_seeds_of`` keeps the bench's own seeds for the
    caption.

    Raises:
        ReproduceError: a seed the bench did not run, or a run record missing.
    """
    from fedseg.bench.bench import run_code_versions
    from fedseg.bench.report import build_results

    ran = [int(s) for s in results.get("seeds") or []]
    missing = [s for s in seeds if int(s) not in ran]
    if missing:
        raise ReproduceError(f"seed(s) {missing} not in the bench's seeds {ran}")
    folder = Path(results["_output_dir"]) / "runs"
    ids = list(results["runs"]) if results.get("runs") else sorted(p.stem for p in folder.glob("*.json"))
    records, texts = [], []
    for run_id in ids:
        path = folder / f"{run_id}.json"
        if not path.is_file():
            raise ReproduceError(f"the bench's run record {path} is missing")
        texts.append(path.read_text())
        record = json.loads(texts[-1])
        if int(record["seed"]) in {int(s) for s in seeds}:
            records.append(record)
    header = {k: results[k] for k in HEADER_FIELDS if k in results}
    header.update(seeds=sorted(int(s) for s in seeds), run_code_versions=run_code_versions(records),
                  runs={r["id"]: str(folder / f"{r['id']}.json") for r in records})
    sites, baseline = list(results["sites"]), baseline or results.get("baseline")
    key = hashlib.sha256(json.dumps([texts, sites, header, baseline], sort_keys=True).encode()).hexdigest()
    if key not in _REBUILT:
        _REBUILT[key] = build_results(records, sites, header, baseline=baseline)
    rebuilt = copy.deepcopy(_REBUILT[key])
    rebuilt.update({k: v for k, v in results.items() if k.startswith("_")}, _seeds_of=ran)
    return rebuilt



# ------------------------------------------------------------------------------------------ loading
def load_output(run_id: str, root: Path, runs: Mapping[str, Mapping[str, Any]] = RUNS, ignore_command: bool = False,
                seeds: Optional[Sequence[int]] = None, baseline: Optional[str] = None) -> Dict[str, Any]:
    """The stored JSON of run ``run_id`` under ``root``; with ``seeds``, a bench's results over those seeds only
    (:func:`select_seeds`), from a bench whose command is the registry's but for its ``--seeds``, as long as it ran
    every one of ``seeds``; with ``baseline``, re-aggregated with that label as the baseline of the paired tests.

    Raises:
        MissingOutput: it does not exist (the message gives the commands, and the finished runs of a bench in progress).
        ReproduceError: it is not readable JSON, or (unless ``ignore_command``) was made by another command than the
            registry's — its ``_command_differs`` field then holds the stored command.
    """
    run = runs[run_id]
    path = result_path(run, root)
    if not path.is_file():
        finished = sorted((output_path(run, root) / "runs").glob("*.json")) if output_path(run, root).is_dir() else []
        progress = f" ({len(finished)} finished runs in {output_path(run, root) / 'runs'}: in progress?)" if finished else ""
        raise MissingOutput(f"run {run_id!r}: no record at {path}{progress}; make it with --run, which runs:\n"
                            + "\n".join(f"  {c}" for c in commands(run, OUT_ROOT)))
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReproduceError(f"run {run_id!r}: {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ReproduceError(f"run {run_id!r}: {path} holds a {type(data).__name__}, not a JSON object")
    # the command as recorded: the output root's path written as {root} (a record) or still absolute (an output)
    data["command"] = sanitise(data.get("command"), str(Path(root).resolve())) if data.get("command") else None
    cmds = commands(run, Path(ROOT_TOKEN))
    seeds_only = seeds is not None and same_but_seeds(data.get("command"), cmds[-1]) and {int(x) for x in seeds} <= {
        int(x) for x in data.get("seeds") or []}
    if not stored_command_matches(data.get("command"), cmds[-1]) and not seeds_only:
        if not ignore_command:
            raise ReproduceError(f"run {run_id!r}: {path} was made by\n  {data.get('command')}\nbut the registry says\n"
                                 f"  {cmds[-1]}\nfix the registry or re-run (--run); --ignore-command renders it anyway")
        data["_command_differs"] = data.get("command")
    data["_output_dir"] = str(output_path(run, root))  # where the bench's per-run records are
    if baseline is not None:  # every seed of the bench, tested against another label
        return select_seeds(data, seeds if seeds is not None else data.get("seeds") or [], baseline)
    return select_seeds(data, seeds) if seeds is not None else data


def run_commands(run_id: str, root: Path, runs: Mapping[str, Mapping[str, Any]] = RUNS) -> None:
    """Run ``run_id``'s commands in order from the repository root (``python`` = this interpreter).

    Raises:
        ReproduceError: a command failed (its exit status is named).
    """
    for command in commands(runs[run_id], root):
        words = shlex.split(command)
        if words[0] == "python":
            words[0] = sys.executable
        print(f"$ {command}", file=sys.stderr, flush=True)
        rc = subprocess.run(words, cwd=REPO).returncode
        if rc != 0:
            raise ReproduceError(f"run {run_id!r}: `{command}` exited with status {rc}")


# ---------------------------------------------------------------------------------------- renderers
def _remake(table_id: str) -> str:
    return f"Re-make: `python benchmarks/reproduce.py {table_id} --run`."


def _stale(results: Mapping[str, Any]) -> str:
    """What the caption must add: an output made by another command, or a table of some of a bench's seeds."""
    text = (f" NOTE: made by `{results['_command_differs']}`, not by the registry's command."
            if results.get("_command_differs") else "")
    if results.get("_seeds_of") is not None and list(results["_seeds_of"]) != list(results.get("seeds") or []):
        text += (f" Seed(s) {', '.join(map(str, results['seeds']))} of a bench that ran seed(s) "
                 f"{', '.join(map(str, results['_seeds_of']))} (re-aggregated from its run records).")
    return text


def render_accuracy(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    from fedseg.bench.tables import accuracy_note, accuracy_table, caption

    results = outputs[0]
    lines = accuracy_table(results, table.get("metrics", ()))
    note = f"{accuracy_note(results)} {_remake(table_id)}{_stale(results)}"
    if table.get("paper"):
        lines = with_paper_column(lines, results, table["paper"])
        note += f" Paper column: {table['paper']['note']}"
    return [caption(results, table["title"], note), "", *lines]


def with_paper_column(lines: List[str], results: Mapping[str, Any], paper: Mapping[str, Any]) -> List[str]:
    """``lines`` of :func:`fedseg.bench.tables.accuracy_table` (one row per ``results["approaches"]`` entry, in order)
    with a last column: ``paper["values"][label]`` (a published number, typed into the registry with its source) on
    the first row of each label, blank elsewhere."""
    head, rule, *rows = lines
    entries = list(results.get("approaches", {}).values())
    if len(rows) != len(entries):
        raise ReproduceError(f"{len(rows)} table rows for {len(entries)} approaches: cannot add the paper column")
    out = [f"{head} {paper['title']} |", f"{rule}---|"]
    seen = set()
    for row, entry in zip(rows, entries):
        label = entry["label"]
        out.append(f"{row} {'' if label in seen else paper['values'].get(label, '')} |")
        seen.add(label)
    return out


def render_cost(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    from fedseg.bench.tables import caption, cost_note, cost_table

    results = outputs[0]
    return [caption(results, table["title"], f"{cost_note(results)} {_remake(table_id)}{_stale(results)}"), "",
            *cost_table(results)]


def _other_runs(table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]]) -> str:
    """`` Other runs: `id`: date, code ...`` for the runs after the first of a multi-run table (their budget where it
    differs from the first's), or ``""``."""
    from fedseg.bench.tables import budget_text, code_text

    first = budget_text(outputs[0]) if outputs[0].get("budget") else ""
    parts = []
    for run_id, o in zip(run_ids(table)[1:], outputs[1:]):
        budget = budget_text(o) if o.get("budget") else ""
        parts.append(f"`{run_id}`: " + (f"budget: {budget}; " if budget != first else "")
                     + f"{str(o.get('date', ''))[:16].replace('T', ' ')}; {code_text(o)}")
    return f" Other runs: {'; '.join(parts)}." if parts else ""


def render_overview(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """Rows = runs (one per data set), columns = every approach any run has: the mean test score over sites (Dice or
    accuracy; mean ± std over seeds). The caption is the first run's; the others' budget, date and code follow."""
    from fedseg.bench.runs import task_metrics
    from fedseg.bench.tables import approach_title, caption, data_text, seed_cell
    from fedseg.fl.report import metric_header

    names: Dict[str, str] = {}
    for results in outputs:
        for key, entry in results["approaches"].items():
            names.setdefault(approach_title(entry), key)
    lines = ["| data | sites | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for results, run_id in zip(outputs, run_ids(table)):
        metric = task_metrics(results.get("task", "segmentation"))[0]
        by_title = {approach_title(e): e for e in results["approaches"].values()}
        cells = [seed_cell(by_title[n]["summary"]["mean"][metric], 3) if n in by_title else "-" for n in names]
        lines.append(f"| `{run_id}` (mean {metric_header(metric)}) | {data_text(results)} | " + " | ".join(cells) + " |")
    note = ("Cells: unweighted mean over sites of each site's test mean (mean ± std over seeds where there are several)."
            + _other_runs(table, outputs) + f" {_remake(table_id)}" + "".join(_stale(o) for o in outputs))
    return [caption(outputs[0], table["title"], note), "", *lines]


def render_multiclass_cost(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/multiclass_cost.py``'s JSON: one row per label space and their ratio; the in-process interleaved
    engine timings in the last two columns."""
    from fedseg.bench.tables import caption

    data = outputs[0]
    costs, ratio, engine = data["costs"], data["ratio_c3_over_c2"], data.get("interleaved_engine") or {}
    lines = ["| label space | median round wall (s) | median site compute (s) | peak site memory (MB) | "
             "upload per site per round (MB) | mean test Dice | local epoch, in process (s) | test evaluation, in process (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, c in costs.items():
        e = engine.get(name) or {}
        lines.append(f"| {name} | {c['median_round_wall_s']:.2f} | {c['median_site_compute_s']:.2f} | "
                     f"{c['peak_site_memory_mb']:.0f} | {c['upload_mb_per_site_round']:.3f} | {c['mean_test_dice']:.3f} | "
                     + (f"{e['train']:.2f} | {e['evaluate']:.2f} |" if e else "- | - |"))
    r, er = ratio, engine.get("ratio") or {}
    lines.append(f"| ratio C=3 / C=2 | {r['median_round_wall_s']:.2f}x | {r['median_site_compute_s']:.2f}x | "
                 f"{r['peak_site_memory_mb']:.2f}x | {r['upload_mb_per_site_round']:.4f}x | | "
                 + (f"{er['train']:.2f}x | {er['evaluate']:.2f}x |" if er else "- | - |"))
    note = ("One FedAvg bench per label space (first round left out of the medians); mean test Dice = the mean over the "
            "foreground classes (C=3: rim, cup; C=2: disc), so the two are not comparable; in-process columns: median over "
            f"{engine.get('repeats', '?')} interleaved repeats on site {engine.get('site', '?')}, "
            f"{engine.get('threads', '?')} torch thread. {_remake(table_id)}{_stale(data)}")
    return [caption(data, table["title"], note), "", *lines]


def render_engine_throughput(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/engine_throughput.py``'s JSON (one or several runs): per run and data mode, median images/s of
    the engine and of the plain loop, their ratio, the A/A control ratio and CPU seconds per call."""
    from fedseg.bench.tables import caption

    lines = ["| family | spatial mode | patch | batch | data | engine img/s | plain img/s | engine / plain | "
             "A/A control / plain | CPU s per call engine / plain |", "|---|---|---|---|---|---|---|---|---|---|"]
    for data in outputs:
        s = data["settings"]
        for r in data["results"]:
            e, p = r["paths"]["engine"], r["paths"]["plain"]
            control = "-" if r.get("control_ratio_images_per_s") is None else f"{r['control_ratio_images_per_s']:.2f}"
            patch = "×".join(map(str, r["patch"])) if r.get("patch") else f"{s.get('image_size')} px"
            lines.append(f"| {s['family']} | {s.get('spatial_mode') or '-'} | {patch} | {s['batch_size']} | {r['mode']} | "
                         f"{e['median_images_per_s']:.2f} | {p['median_images_per_s']:.2f} | {r['ratio_images_per_s']:.2f} | "
                         f"{control} | {e['median_cpu_s']:.2f} / {p['median_cpu_s']:.2f} |")
    first = outputs[0]["settings"]
    epochs = f"{first['epochs_per_call']} epoch" + ("" if first["epochs_per_call"] == 1 else "s")
    note = (f"Median over {first['repeats']} interleaved timed calls of {epochs} each "
            "(after one warm-up call); memory = batches held in memory (the training loop only), loader = the engine's "
            "real DataLoader; A/A control = a second identical plain loop (the noise floor)."
            + _other_runs(table, outputs) + f" {_remake(table_id)}" + "".join(_stale(o) for o in outputs))
    return [caption(outputs[0], table["title"], note), "", *lines]


def render_glance(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]],
                  root: Path = Path(DEFAULT_ROOT), tables: Mapping[str, Mapping[str, Any]] = TABLES,
                  runs: Mapping[str, Mapping[str, Any]] = RUNS, link: Optional[str] = None,
                  ignore_command: bool = False) -> List[str]:
    """"Results at a glance": the rows of every listed accuracy table whose output exists (:func:`glance_rows`)."""
    from fedseg.bench.tables import glance_rows, glance_table

    from fedseg.bench.tables import recommendation_text

    rows, used, missing, uses = [], [], [], []
    for source in table["from"]:
        src = tables[source]
        try:
            results = load_output(run_ids(src)[0], root, runs, ignore_command)
        except MissingOutput:
            missing.append(source)
            continue
        timing_from = None
        if src.get("round_time_from"):  # the source's round times are not a cost measurement: another table's are
            timing_table = src["round_time_from"]
            timing_from = (load_output(run_ids(tables[timing_table])[0], root, runs, ignore_command), timing_table)
        try:
            rows += glance_rows(results, src.get("data") or src["title"], source, link, timing_from)
        except ValueError as e:  # a source whose baseline is not FedAvg
            raise ReproduceError(str(e)) from None
        try:  # ranked by this code's rule from the bench's run records (a stored ranking may be an older rule's)
            ranked = load_output(run_ids(src)[0], root, runs, ignore_command, baseline=results.get("baseline"))
        except (ReproduceError, ValueError):  # no run records: the bench's own ranking, if it has one
            ranked = results if results.get("ranking") else None
        if ranked is not None:
            uses.append("- " + recommendation_text(ranked, src.get("data") or src["title"]))
        used.append(f"`{source}` ({str(results.get('date', ''))[:10]})")
    if not rows:
        raise MissingOutput(f"table {table_id!r}: none of its source tables has an output yet: {', '.join(table['from'])}")
    note = ("Each row from its source table's own `fedseg bench` run (sources: " + ", ".join(used) + "): the method's "
            "test Dice (mean over sites, mean ± std over seeds) with FedAvg's of the same run in brackets; Δ = mean "
            "per-image difference to FedAvg (Wilcoxon p); round time = median round wall over FedAvg's in the same run, "
            "or in the cost run the cell names."
            + (f" Not yet run: {', '.join(missing)}." if missing else "")
            + f" Re-make: `python benchmarks/reproduce.py {table_id}`.")
    # before the table: a page block is its caption lines up to the end of the first markdown table (benchmarks/page.py)
    use_lines = ["Which to use, on each federation at its table's budget: the highest mean Dice, and whether it beats "
                 "every other approach by the rule (ahead in every seed, beyond the spread, paired p < 0.05) or which "
                 "approaches the rule cannot separate from it:", "", *uses, ""]
    return [f"**{table['title']}.** {note}", "", *(use_lines if uses else []), *glance_table(rows)]


def render_ranking(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """Which approach to use on a bench's federation by the page's rule (``fedseg.bench.ranking``): the approaches by
    mean Dice, the leader against each, the verdict; the caption says which to use. The table's entry sets
    ``baseline`` so that the bench is re-aggregated from its run records (the ranking needs the per-image scores)."""
    from fedseg.bench.tables import caption, ranking_table, recommendation_text

    results = outputs[0]
    if not results.get("ranking"):
        raise ReproduceError(f"table {table_id!r}: no ranking (set the table's 'baseline'; a segmentation bench of two "
                             "or more federated approaches)")
    note = (recommendation_text(results, "On this federation, at this budget") + ". The rule: ahead in every seed, the "
            "mean per-seed difference beyond its std, paired per-image Wilcoxon p < 0.05; an approach the leader does "
            "not beat by it is level with it (a difference the rule cannot confirm: the cost table says what each "
            f"round costs). References (local, pooled) are not ranked. {_remake(table_id)}{_stale(results)}")
    return [caption(results, table["title"], note), "", *ranking_table(results)]


#: the tables a GPU check can be drawn as (``TABLES[...]["part"]``)
GPU_CHECK_PARTS = ("tests", "engine", "simulator", "site-ranks", "networks-96")


def render_gpu_check(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/gpu_check.py``'s JSON, one of its parts (``table["part"]``): ``tests`` (each CUDA test and its
    outcome), ``engine`` (engine vs plain loop, 2-D images and 3-D patches), ``simulator`` (the FedAvg rounds),
    ``site-ranks`` (a site as N DDP ranks) or ``networks-96`` (the 3-D paper-profile networks at 96^3)."""
    from fedseg.bench.tables import caption

    data = outputs[0]
    steps, device = data.get("steps") or {}, data.get("device") or {}
    part = table.get("part")
    if part not in GPU_CHECK_PARTS:
        raise ReproduceError(f"table {table_id!r}: 'part' must be one of {', '.join(GPU_CHECK_PARTS)}, got {part!r}")

    def result(step: str) -> Any:
        if step not in steps:
            raise ReproduceError(f"table {table_id!r}: the GPU check has no step {step!r} (steps: {sorted(steps)})")
        if not steps[step].get("ok"):
            raise ReproduceError(f"table {table_id!r}: step {step!r} of the GPU check failed: {steps[step].get('error')}")
        return steps[step]["result"]

    if part == "tests":
        res = result("cuda_tests")
        counts = res["counts"]
        lines = ["| test | outcome | seconds |", "|---|---|---|"]
        lines += [f"| `{c['test'].split('::')[-1]}` | {c['outcome']} | {c['seconds']:.1f} |" for c in res["cases"]]
        note = (f"`{' '.join(['pytest'] + res['command'].split(' pytest ', 1)[-1].split())}`: " if " pytest " in res["command"] else "")
        note += ", ".join(f"{n} {k}" for k, n in counts.items()) + f" ({steps['cuda_tests'].get('seconds', 0):.0f} s)."
    elif part == "engine":
        lines = ["| input | precision | engine per s | plain per s | engine / plain | peak GPU memory (MiB) |",
                 "|---|---|---|---|---|---|"]
        for r in result("engine_throughput"):
            lines.append(f"| {r['image_size']} px image | {r['precision']} | {r['engine_images_per_s']:.1f} img | "
                         f"{r['plain_images_per_s']:.1f} img | {r['ratio_engine_to_plain']:.2f} | {r['peak_gpu_memory_mib']} |")
        for r in (steps.get("engine_throughput_3d") or {}).get("result") or []:
            lines.append(f"| {'×'.join(map(str, r['patch']))} voxel patch | {r['precision']} | "
                         f"{r['engine_volumes_per_s']:.1f} vol ({r['engine_mvoxels_per_s']:.1f} Mvoxel) | "
                         f"{r['plain_volumes_per_s']:.1f} vol | {r['ratio_engine_to_plain']:.2f} | {r['peak_gpu_memory_mib']} |")
        note = ("Training throughput on in-memory batches, same model, loss, optimiser and batches for both loops; "
                "float16 = autocast with a gradient scaler.")
    elif part == "site-ranks":
        res = result("site_ranks")
        lines = ["| ranks | backend | whole job (s) | round wall (s) | site compute (s) | train loss | steps | test Dice |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in res["runs"]:
            lines.append(f"| {r['ranks']} | {r['backend']} | {r['job_total_s']:.1f} | {r['per_round'][0]['wall']:.2f} | "
                         f"{r['site_compute_s']:.2f} | {r['train_loss']:.4f} | {r['steps']:g} | {r['test_dice']:.3f} |")
        note = (f"One FedAvg round, one site, profile `{res['profile']}`, the site's Client API script under `torchrun` "
                f"(`site_executor=\"client_api_torchrun\"`); {res['gpus']} GPU(s) on the machine.")
    elif part == "networks-96":
        res = result("volume_networks_96")
        lines = ["| network | parameters (M) | patch × batch | precision | step (s) | Mvoxel/s | peak GPU memory (MiB) |",
                 "|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r['network']} | {r['parameters_m']} | {'×'.join(map(str, r['patch']))} × {r['batch']} | "
                         f"{r['precision']} | {r['step_s']:.3f} | {r['mvoxels_per_s']:.1f} | {r['peak_gpu_memory_mib']} |")
        note = ("The volume `paper` profile's networks on random in-memory patches (no data loading): DiceCE loss, "
                "Adam, median training step after a warm-up; float16 = autocast with a gradient scaler.")
    else:
        res = result("simulator_round")
        lines = ["| round | wall (s) | max site compute (s) | sum site compute (s) | overhead = wall - max (s) | "
                 "upload, all sites (MB) |", "|---|---|---|---|---|---|"]
        for r in res["per_round"]:
            lines.append(f"| {r['round']} | {r['wall']:.2f} | {r['max_compute']:.2f} | {r['sum_compute']:.2f} | "
                         f"{r['overhead']:.2f} | {r['bytes_up'] / 1e6:.1f} |")
        note = (f"`{res['command']}`; profile `{res['profile']}`, {res['sites']} sites ({res['sites_on_cuda']} on CUDA), "
                f"whole job {res['job_total_s']:.1f} s, final mean Dice {res['final_mean_dice']:.3f}; round 0 includes "
                "each site's set-up (engine, data cache, CUDA context).")
    machine = {**device, "device": f"{device.get('device', '?')}, {device.get('gpu_memory_gib', '?')} GiB, "
                                   f"CUDA {device.get('cuda_version', '?')}"}
    head = {"date": data.get("date"), "machine": machine, **({"code_version": data["code_version"]}
                                                             if "code_version" in data else {})}
    return [caption(head, table["title"], f"{note} Re-make: `python benchmarks/reproduce.py {table_id} --run` "
                                          f"(on a CUDA machine).{_stale(data)}"), "", *lines]


def render_fullsize_ct(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/fullsize_ct.py``'s JSON, one part (``table["part"]``): ``loaders`` (one row per data-path
    configuration: decoded size against RAM, peak memory against the stated bound, epoch times, cache hit rate) or
    ``infer`` (``fedseg infer`` on one full-size volume: seconds, peak memory, the mask's geometry)."""
    from fedseg.bench.tables import caption

    data = outputs[0]
    vol, part = data["volumes"], table.get("part")
    size = "×".join(map(str, vol["shape"]))
    spacing = "×".join(f"{v:g}" for v in vol["spacing"])
    target = "×".join(f"{v:g}" for v in vol["target_spacing"])
    head = (f"CT-like volumes of {size} voxels, int16 HU at {spacing} mm ({vol['raw_mb']:.0f} MB decoded, "
            f"{vol['file_mb']:.0f} MB .nii.gz), resampled to {target} mm")
    if part == "loaders":
        loaders = data["loaders"]
        lines = ["| data | volumes | decoded / RAM (GB) | held in memory | workers | peak RSS, training process (MB) | "
                 "peak PSS, site's processes (MB) | stated bound, process / all (MB) | within | first epoch (s) | "
                 "later epochs (s) | data time (s) | cache hit rate |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in loaders["rows"]:
            later = "-" if r["steady_epoch_s"] is None else f"{r['steady_epoch_s']:.0f}"
            lines.append(f"| {r['configuration']} | {r['volumes']} | {r['decoded_mb'] / 1024:.2f} / {loaders['ram_mb'] / 1024:.0f} | "
                         f"{r['cached_in_memory']} ({r['cache_mb']:.0f} MB) | {r['num_workers']} | {r['peak_rss_mb']} | "
                         f"{r['peak_tree_pss_mb']} | {r['bound_main_mb']} / {r['bound_tree_mb']} | "
                         f"{'yes' if r['within_bound'] else 'NO'} | {r['first_epoch_s']:.0f} | {later} | {r['data_s']:.0f} | "
                         f"{r['hit_rate']:.2f} |")
        net = data["network"]
        d = loaders["decode"]
        note = (f"{head}; cache_max_mb {loaders['cache_max_mb']} (holds the first 3 training items, image + label in "
                f"float32 on the resampled grid); {data['epochs']} epochs, one `SegEngine.train` call each, a fresh process "
                f"per row. The network is small on purpose (3-D U-Net {net['channels']}, {'×'.join(map(str, net['patch_size']))} "
                f"patches, batch {net['batch_size']} × {net['patch_samples']}): the rows differ only in the data path. "
                f"Decoding one volume takes {d['decode_s']:.0f} s and {d['decode_peak_mb']} MB at peak. Data time = seconds spent "
                "in the dataset over the run (all processes); hit rate = item accesses served from the memory or disk cache. "
                "Bound: the peak of the same site with its data within the budget (first row: process, cache and the "
                "larger of one decode and one training iteration) plus one volume being decoded; each worker adds a "
                f"process of the same base size decoding one volume plus its prefetched batches ({loaders['prefetch_mb']:.0f} MB).")
    elif part == "infer":
        r = data["infer"]
        lines = ["| volume | window | device / output assembled on | seconds | peak RSS (MB) | peak GPU memory (MiB) | "
                 "mask in the input's shape / affine |", "|---|---|---|---|---|---|---|"]
        lines.append(f"| {'×'.join(map(str, r['shape']))} at {'×'.join(f'{v:g}' for v in r['spacing'])} mm | "
                     f"{'×'.join(map(str, r['window']))} × {r['sw_batch_size']} | {r['device']} / {r['stitch_device']} | "
                     f"{r['seconds']:.0f} | {r['peak_rss_mb']} | {r['peak_gpu_mib'] if r['peak_gpu_mib'] is not None else '-'} | "
                     f"{'yes' if r['mask_shape_ok'] else 'NO'} / {'yes' if r['mask_affine_ok'] else 'NO'} |")
        note = (f"{head}; `fedseg infer --stitch-device {r['stitch_device']}` (sliding window, windows on the network's "
                "device, the scores assembled on the CPU), the network of the loader table with its initial weights "
                "(memory and time do not depend on them); seconds and peak RSS of the whole call (reading, resampling, "
                "windows, inverting to the input's grid, writing the mask) in a fresh process.")
    else:
        raise ReproduceError(f"table {table_id!r}: 'part' must be loaders or infer, got {part!r}")
    return [caption(data, table["title"], f"{note} {_remake(table_id)}{_stale(data)}"), "", *lines]


def render_pairs(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """One row per ``pairs`` entry ``[A, B]`` of a bench run (two settings of one method): each one's Dice (mean over
    sites, mean ± std over seeds), the paired difference A − B per test image (same seed; pooled over seeds and
    sites; Wilcoxon) for every metric in ``metrics``, and A's median round wall over B's, both from the same bench."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cost_table import load_runs, median_round_wall, per_image
    from fedseg.bench.stats import compare, summarise_seeds
    from fedseg.bench.tables import approach_title, caption, column_header

    results = outputs[0]
    runs = load_runs(Path(results["_output_dir"]))
    sites = list(results["sites"])
    metrics = list(table.get("metrics", ["dice"]))

    def seeds_cell(label: str, metric: str) -> str:
        final = {r["seed"]: r["final"]["global"] for r in runs[label]}
        having = [x for x in sites if all(f.get(x, {}).get(metric) is not None for f in final.values())]  # DRIVE's FOV
        if not having:
            return "-"
        s = summarise_seeds(final, having, metrics=(metric,))["mean"][metric]
        return f"{s['mean']:.3f} ± {s['std']:.3f}" + ("" if having == sites else f" ({', '.join(having)})")

    def p_text(v: Optional[float]) -> str:
        return "-" if v is None else (f"{v:.3f}" if v >= 1e-3 else f"{v:.1e}")

    names = [column_header(results, m) for m in metrics]  # "Dice FOV", as the accuracy tables name it
    head = ["method (A vs B)"] + [f"{h}: A | {h}: B | Δ {h} A − B (Wilcoxon p, pairs)" for h in names] + [
        "round wall A / B"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * (1 + 3 * len(metrics) + 1)]
    for a, b in table["pairs"]:
        cells = [f"{approach_title(results['approaches'][a])} vs {approach_title(results['approaches'][b])}"]
        for metric in metrics:
            t = compare(per_image(runs[a]), per_image(runs[b]), sites, metrics=(metric,))[metric]["all"]
            diff = "-" if t["mean_diff"] is None else f"{t['mean_diff']:+.4f}"
            cells += [seeds_cell(a, metric), seeds_cell(b, metric), f"{diff} ({p_text(t['wilcoxon_p'])}, {t['n']})"]
        cells.append(f"{median_round_wall(runs[a]) / median_round_wall(runs[b]):.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    seeds = sorted({r["seed"] for records in runs.values() for r in records})
    note = (f"A and B: two settings of one method in the same bench (seeds {', '.join(map(str, seeds))}); cells: mean "
            f"over sites, mean ± std over seeds; Δ: mean per-image difference, same seed, pooled over seeds and sites, "
            f"two-sided Wilcoxon signed-rank. {_remake(table_id)}{_stale(results)}")
    return [caption(results, table["title"], note), "", *lines]


def render_budget(table_id: str, table: Mapping[str, Any], outputs: Sequence[Optional[Dict[str, Any]]], **_) -> List[str]:
    """The budget curve: one column per bench (same federation and settings, more rounds), one row per approach of
    ``labels`` (each model: global, personalised): Dice (mean over sites; mean ± std over seeds where several) and
    the paired per-image difference to the baseline's global model of the same bench (Wilcoxon p). A bench with no
    output yet (``missing_ok``) is named in the note, not drawn."""
    from fedseg.bench.report import format_p
    from fedseg.bench.tables import approach_title, baseline_title, caption, code_text, column_spread, paired_test, seed_cell

    present = [(r, o) for r, o in zip(run_ids(table), outputs) if o is not None]
    absent = [r for r, o in zip(run_ids(table), outputs) if o is None]
    labels = table.get("labels")
    names: List[str] = []
    for _, o in present:
        names += [n for n, e in o["approaches"].items() if n not in names and (labels is None or e["label"] in labels)]
    if labels is not None:  # the registry's order, global model before personalised
        names.sort(key=lambda n: next(list(labels).index(o["approaches"][n]["label"]) for _, o in present
                                      if n in o["approaches"]))

    def rounds(o: Mapping[str, Any]) -> str:
        return str((o.get("budget") or {}).get("rounds") or "profile default")

    head = ["approach"] + [f"{rounds(o)} rounds: Dice (Δ vs {baseline_title(o)}, Wilcoxon p)" for _, o in present]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name in names:
        title, cells = None, []
        for _, o in present:
            entry = o["approaches"].get(name)
            if entry is None:
                cells.append("-")
                continue
            title = title or approach_title(entry)
            dice = seed_cell(column_spread(entry, "dice"), 3)
            test = paired_test((o.get("comparisons") or {}).get(name), "dice")
            if name == o.get("baseline") or not test or test.get("mean_diff") is None:
                cells.append(dice)
            else:
                cells.append(f"{dice} ({test['mean_diff']:+.3f}, {format_p(test.get('wilcoxon_p'))})")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    columns = "; ".join(f"{rounds(o)} rounds: `{r}` ({str(o.get('date', ''))[:16].replace('T', ' ')}, {code_text(o)})"
                        for r, o in present)
    note = (f"One bench per column, each with the first's settings but its rounds: {columns}."
            + (f" Not run yet: {', '.join(f'`{r}`' for r in absent)}." if absent else "")
            + f" {_remake(table_id)}{_stale(present[0][1])}")
    first = dict(present[0][1])  # the caption's budget names every column's rounds
    every = " / ".join(rounds(o) for _, o in present)
    first["approaches"] = {k: {**e, "num_rounds": every} for k, e in first["approaches"].items()}
    return [caption(first, table["title"], note), "", *lines]


def bench_name(run_id: str) -> str:
    """A protocol bench's short name: ``fedevi-protocol-retina-base`` -> ``retina-base``."""
    return run_id[len("fedevi-protocol-"):] if run_id.startswith("fedevi-protocol-") else run_id


def render_protocol_ablation(table_id: str, table: Mapping[str, Any], outputs: Sequence[Optional[Dict[str, Any]]],
                             **_) -> List[str]:
    """One row per ``rows`` entry ``(bench, baseline label, method label, setting, metric, model)``: the baseline's and
    the method's score (mean over sites, mean ± std over seeds), the method − baseline difference per seed (mean ±
    std, seeds ahead) and per test image (pooled over seeds and sites, Wilcoxon), and each one's paired difference
    to the ``reference`` row's runs (the same images and seeds in another bench: what the setting does to each
    method). Benches with no output yet are named in the note (``missing_ok``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cost_table import load_runs
    from fedseg.bench.report import format_p, format_seed_difference
    from fedseg.bench.stats import compare, seed_differences, summarise_seeds
    from fedseg.bench.tables import caption, column_header

    benches = {bench_name(r): o for r, o in zip(run_ids(table), outputs)}
    present = {name: o for name, o in benches.items() if o is not None}
    runs = {name: load_runs(Path(o["_output_dir"])) for name, o in present.items()}
    first = next(iter(present.values()))
    sites = list(first["sites"])

    def per_image(records, model):
        return {r["seed"]: r["per_image"].get(model, {}) for r in records}

    def finals(records, model):
        return {r["seed"]: r["final"].get(model, {}) for r in records}

    def score(records, metric, model) -> str:
        s = summarise_seeds(finals(records, model), sites, metrics=(metric,))["mean"][metric]
        return "-" if s.get("mean") is None else f"{s['mean']:.3f} ± {s['std']:.3f}"

    def paired(a, b, metric, model_a, model_b="global") -> str:
        t = compare(per_image(a, model_a), per_image(b, model_b), sites, metrics=(metric,))[metric]["all"]
        return "-" if t.get("mean_diff") is None else f"{t['mean_diff']:+.3f} ({format_p(t.get('wilcoxon_p'))})"

    ref_bench, ref_base, ref_method = table["reference"]
    name = table.get("method_name", "FedEvi")
    head = [f"local protocol (FedAvg / {name} trained alike)", "score", "FedAvg", name,
            f"{name} − FedAvg per seed", f"{name} − FedAvg per image (Wilcoxon p)",
            "FedAvg vs suite default (p)", f"{name} vs suite default (p)"]
    published = table.get("published")  # (column header, {row index: published number})
    if published:
        head.append(published[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    labels = {"global": "", "global_best_val": ", best val round", "local": ", local models",
              "personalized": ", personalised"}
    for index, row in enumerate(table["rows"]):
        # a 7th entry: the baseline's model where it differs from the method's (a personalised model against the
        # baseline's global model)
        bench, base, method, setting, metric, model = row[:6]
        base_model = row[6] if len(row) > 6 else model
        if bench not in runs or base not in runs[bench] or method not in runs[bench]:
            continue
        a, b = runs[bench][method], runs[bench][base]
        per_seed = seed_differences(finals(a, model), finals(b, base_model), sites, metric)
        label = column_header(first, metric) + labels[model] + (f" vs {labels[base_model][2:] or 'global'}"
                                                                 if base_model != model else "")
        cells = [setting, label, score(b, metric, base_model), score(a, metric, model), format_seed_difference(per_seed),
                 paired(a, b, metric, model, base_model)]
        same_reading = metric == "dice" and model == "global" and (bench, base, method) != tuple(table["reference"])
        if same_reading and ref_bench in runs:
            cells += [paired(b, runs[ref_bench][ref_base], "dice", "global") if (bench, base) != (ref_bench, ref_base) else "",
                      paired(a, runs[ref_bench][ref_method], "dice", "global") if (bench, method) != (ref_bench, ref_method) else ""]
        else:
            cells += ["", ""]
        if published:
            cells.append(published[1].get(index, ""))
        lines.append("| " + " | ".join(cells) + " |")
    absent = [f"`{bench}`" for bench, o in benches.items() if o is None]
    dates = sorted(str(o.get("date", ""))[:16].replace("T", " ") for o in present.values())
    note = ("One bench per setting (the same federation, seeds, rounds and epochs; the caption's budget is the first "
            "bench's, each bench's command is in the registry: `python benchmarks/reproduce.py --list`); in each, FedAvg "
            f"and {name} train with the same local protocol. Score cells: mean over sites, mean ± std over seeds. Per seed: each seed's mean over "
            f"sites, {name} minus FedAvg (seeds ahead). Per image: mean per-image difference, same seed, pooled over seeds "
            "and sites, two-sided Wilcoxon. 'vs suite default': the same method's per-image difference to its run under the "
            f"suite default (first row). Benches dated {dates[0]} to {dates[-1]}."
            + (f" Not run yet: {', '.join(absent)}." if absent else "")
            + (f" Published: {table['paper']}." if table.get("paper") else "") + f" {_remake(table_id)}{_stale(first)}")
    return [caption(first, table["title"], note), "", *lines]


RENDERERS: Dict[str, Callable[..., List[str]]] = {
    "protocol-ablation": render_protocol_ablation,
    "pairs": render_pairs, "budget": render_budget,
    "accuracy": render_accuracy, "cost": render_cost, "overview": render_overview,
    "multiclass-cost": render_multiclass_cost, "engine-throughput": render_engine_throughput,
    "gpu-check": render_gpu_check, "glance": render_glance, "ranking": render_ranking,
    "fullsize-ct": render_fullsize_ct,
}


# ------------------------------------------------------------------- GraphFedSeg's local protocol (its authors' code)
#: GraphFedSeg's `paper` profile is its authors' code (docs/methods.md, GraphFedSeg); its method differences, one at a
#: time under the suite's local protocol (variants of GraphFedSeg in the base bench; alpha 1/0.7 written out)
GFS_AUTHORS_METHOD = {
    "gfs_term": "regulariser=top_k",
    "gfs_uncertainty": "uncertainty_pass=training_batches,prior=samples_over_uncertainty,gamma=0,uncertainty_loss_weight=0.4",
    "gfs_previous": "graph_in_aggregation=previous,initial_graph=uniform_others",
    "gfs_graph": "graph_in_aggregation=previous,initial_graph=uniform_others,similarity=update_global,"
                 "alpha=1.4285714285714286,similarity_snap=0.9",
}
GFS_AUTHORS_METHOD["gfs_authors"] = ",".join(GFS_AUTHORS_METHOD[k] for k in ("gfs_term", "gfs_uncertainty", "gfs_graph"))
#: the suite's GraphFedSeg spelt out (a bench under the `paper` profile gives GraphFedSeg the authors' options;
#: alpha 0.08 K for the 3 built-in sites, a snap above every cosine)
GFS_SUITE_METHOD = ("alpha=0.24,gamma=0.4,similarity=update,similarity_snap=1.0,prior=samples,graph_in_aggregation=current,"
                    "initial_graph=uniform,regulariser=paper,uncertainty_pass=after_training,uncertainty_loss_weight=0")
#: its local-protocol differences, one bench each (FedAvg and GraphFedSeg trained alike), then all of them. Not benched
#: alone: the flip, the per-image maximum (FedEvi's ablation: no effect on FedAvg at this budget, +0.005 / +0.001) and
#: dropping the last incomplete batch of 4 (at most 3 of a site's ~20 images an epoch); they are in the `authors` bench
GFS_PROTOCOL_BENCHES = (
    ("base", "fedavg graphfedseg " + " ".join(f"{k}=graphfedseg:{v}" for k, v in GFS_AUTHORS_METHOD.items()), ""),
    ("network", "fedavg graphfedseg", " --set network_variant=three_conv_nearest"),
    ("optimiser", "fedavg graphfedseg", " --set learning_rate=5e-4 adam_betas=[0.9,0.99] weight_decay=1e-5"),
    ("loss", "fedavg graphfedseg", " --set seg_loss=logit_dice lambda_ce=0.0"),
    ("authors", f"fedavg fedavg_dicece=fedavg:seg_loss=dice_ce,lambda_ce=1.0 graphfedseg gfs_suite=graphfedseg:{GFS_SUITE_METHOD}",
     " --profile paper --protocol graphfedseg --rounds 10 --local-epochs 1 --set image_size=64"),
)
GFS_ROWS = [(f"graphfedseg-protocol-{row[0]}", *row[1:]) for row in (
    ("base", "fedavg", "graphfedseg", "suite default", "dice", "global"),
    ("base", "fedavg", "gfs_term", "+ similarity term: 0.01 (1 - weighted cosine to the top-3 graph entries, itself included)", "dice", "global"),
    ("base", "fedavg", "gfs_uncertainty", "+ uncertainty: U = mean vacuity over the training batches, p ∝ n / U, no U penalty", "dice", "global"),
    ("base", "fedavg", "gfs_previous", "+ aggregation with last round's graph (initial 1/(K-1) off the diagonal)", "dice", "global"),
    ("base", "fedavg", "gfs_graph", "... and cosines against the new global model, alpha 1/0.7, cosines > 0.9 as 1", "dice", "global"),
    ("base", "fedavg", "gfs_authors", "the authors' method (all four), the suite's protocol", "dice", "global"),
    ("base", "fedavg", "graphfedseg", "the suite's GraphFedSeg, personalised models", "dice", "personalized", "global"),
    ("base", "fedavg", "gfs_graph", "... with the authors' graph (W ≈ I: each site's own last model)", "dice", "personalized",
     "global"),
    ("base", "fedavg", "gfs_authors", "the authors' method, personalised models", "dice", "personalized", "global"),
    ("network", "fedavg", "graphfedseg", "+ network: three-conv U-Net, nearest upsampling, Kaiming fan-out", "dice", "global"),
    ("optimiser", "fedavg", "graphfedseg", "+ optimiser: Adam lr 5e-4, betas (0.9, 0.99), weight decay 1e-5", "dice", "global"),
    ("loss", "fedavg", "graphfedseg", "+ loss: Dice on the raw logits, both classes", "dice", "global"),
    ("authors", "fedavg", "graphfedseg", "the authors' code (`paper` profile: their protocol and method)", "dice", "global"),
    ("authors", "fedavg_dicece", "graphfedseg", "... against FedAvg with the suite's Dice + CE loss", "dice", "global"),
    ("authors", "fedavg", "gfs_suite", "the suite's GraphFedSeg under the authors' protocol", "dice", "global"),
    ("authors", "fedavg", "graphfedseg", "the authors' code, each site's local model", "dice", "local"),
    ("authors", "fedavg", "graphfedseg", "the authors' code, local models after largest-component post-processing", "dice_lcc", "local"),
    ("authors", "fedavg", "graphfedseg", "the authors' code's local models against FedAvg's global model", "dice", "local", "global"),
    ("authors", "fedavg", "fedavg", "(FedAvg's own local models against its global model, in the GraphFedSeg column)", "dice",
     "local", "global"),
)]
RUNS.update({
    **{f"graphfedseg-protocol-{name}": {"out": f"graphfedseg_protocol/{name}", "commands": [
        f"fedseg bench --family polyp --references --seeds 0 1 2 --methods {methods}{sets} --out {{out}}"]}
       for name, methods, sets in GFS_PROTOCOL_BENCHES},
    # the authors' code on the real retina federation; its suite default is the server-step bench's FedAvg and GraphFedSeg
    "graphfedseg-protocol-retina-authors": real_bench(
        "retina", "graphfedseg_protocol/retina_authors",
        "--methods fedavg graphfedseg --references --seeds 0 1 2 --rounds 20 --profile paper --protocol graphfedseg "
        "--simulator-timeout 14400"),
})
#: published numbers beside the rows they match (row index in GFS_ROWS): the paper's, and the independent side-by-side
#: on Kvasir-SEG + CVC-ClinicDB (128 px, seed 0, one local epoch, the same lists for both codes)
GFS_PUBLISHED = ("published / real polyp", {
    0: "paper: FedAvg 82.99 → GraphFedSeg 87.10 Dice (4 polyp sites, 250 rounds, 384 px)",
    12: "Kvasir-SEG + CVC-ClinicDB, 128 px: this suite's FedAvg under this profile 0.779 (30 rounds)",
    16: "the authors' code there: their local models 0.695 / 0.483 (Kvasir / ClinicDB test, round 17 of 30)",
})
# FedEvi's weights round by round: the suite's federated run against the authors' round loop on the same data
RUNS["fedevi-weights-trace"] = {"out": "fedevi_weights_trace", "result": "fedevi_weights_trace.json", "commands": [
    "python benchmarks/fedevi_weights_trace.py --out {out} --seeds 0 1 2 --rounds 30 --loop-seeds 0"]}
#: the rounds the trace table shows
TRACE_ROUNDS = (1, 2, 5, 10, 20, 30)


def render_fedevi_weights_trace(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """One row per round of :data:`TRACE_ROUNDS`: G, A and beta of each site (``first / second``) in the suite's run and
    in the authors' loop with the same seed, then the suite's A and first-site beta over all its seeds (mean ± std)."""
    import numpy as np

    data = outputs[0]
    sites = list(data["sites"])
    suite, loop = data["runs"]["suite"], data["runs"]["loop"]
    paired = sorted(set(suite) & set(loop), key=int)
    seed = paired[0] if paired else None

    def pair(trace, key, r):
        return " / ".join(f"{trace[key][r - 1][s]:.3f}" for s in sites)

    def spread(values):
        return f"{np.mean(values):.3f} ± {np.std(values):.3f}"

    head = ["round", f"suite seed {seed}: G", "A", "beta", f"authors' loop seed {seed}: G", "A", "beta",
            f"suite, {len(suite)} seeds: A {sites[0]}", f"A {sites[1]}", f"beta {sites[0]}"]
    published = table.get("published")  # (column headers, {round: cells}): numbers of real runs
    if published:
        head += list(published[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in [r for r in TRACE_ROUNDS if r <= data["rounds"]]:
        cells = [str(r)]
        for trace in (suite.get(seed), loop.get(seed)):
            cells += [pair(trace, k, r) for k in ("G", "A", "beta")] if trace else ["-"] * 3
        cells += [spread([suite[x]["A"][r - 1][s] for x in suite]) for s in sites]
        cells.append(spread([suite[x]["beta"][r - 1][sites[0]] for x in suite]))
        if published:
            cells += list(published[1].get(r, [""] * len(published[0])))
        lines.append("| " + " | ".join(cells) + " |")
    gaps = {k: max(abs(suite[seed][k][r][s] - loop[seed][k][r][s]) for r in range(data["rounds"]) for s in sites)
            for k in ("G", "A", "beta")} if seed is not None else {}
    n = ", ".join(f"{s} {data['sites'][s]['n_train']}" for s in sites)
    cfg = data["train_config"]
    note = (f"Two built-in polyp sites (training images: {n}), FedEvi's `paper` profile at {data['image_size']} px, "
            f"{cfg['local_epochs']} local epoch, batch {cfg['batch_size']}, {data['rounds']} rounds; cells `{sites[0]} / {sites[1]}`. "
            f"Largest difference suite − loop over every round and site, seed {seed}: "
            + ", ".join(f"{k} {v:.1e}" for k, v in gaps.items())
            + f". Machine: {data['machine'].get('cpu_count', '?')} CPUs; {str(data.get('date', ''))[:16].replace('T', ' ')}; "
            f"code {data['code_version'].get('commit')}{'+dirty' if data['code_version'].get('dirty') else ''}. {_remake(table_id)}")
    return [f"**{table['title']}.** {note}", "", *lines]


RENDERERS["fedevi-weights-trace"] = render_fedevi_weights_trace
TABLES.update({
    "fedevi-weights-trace": {"run": "fedevi-weights-trace", "render": "fedevi-weights-trace",
                             # the independent side-by-side on Kvasir-SEG / CVC-ClinicDB (128 px, seed 0, 1 local epoch)
                             "published": (("Kvasir / ClinicDB, authors' code: u_dis", "u_data", "weights",
                                            "this suite (`paper`): G", "A", "beta"),
                                           {1: ("0.058 / 0.057", "0.246 / 0.239", "", "0.033 / 0.033", "0.215 / 0.203", ""),
                                            10: ("0.024 / 0.017", "0.193 / 0.112", "0.48 / 0.52", "0.016 / 0.014",
                                                 "0.166 / 0.092", ""),
                                            30: ("0.011 / 0.007", "0.095 / 0.068", "0.48 / 0.52", "0.011 / 0.010",
                                                 "0.170 / 0.061", "0.37 / 0.63")}),
                             "title": "FedEvi's G, A and weights round by round: the suite's federated run and the "
                                      "authors' round loop on the same data"},
    "graphfedseg-protocol": {
        "run": [f"graphfedseg-protocol-{b[0]}" for b in GFS_PROTOCOL_BENCHES], "render": "protocol-ablation",
        "rows": GFS_ROWS, "reference": ("graphfedseg-protocol-base", "fedavg", "graphfedseg"), "method_name": "GraphFedSeg",
        "published": GFS_PUBLISHED,
        "title": "What moves GraphFedSeg against FedAvg: the suite's GraphFedSeg and local protocol, one difference from the "
                 "authors' code at a time, and all of them (built-in polyp)"},
    "graphfedseg-protocol-retina": {
        "run": ["retina-server-step", "graphfedseg-protocol-retina-authors"], "render": "protocol-ablation",
        "reference": ("retina-server-step", "fedavg", "graphfedseg"), "method_name": "GraphFedSeg", "missing_ok": True,
        "rows": [("retina-server-step", "fedavg", "graphfedseg", "suite default", "dice", "global"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "graphfedseg",
                  "the authors' code (`paper` profile: their protocol and method)", "dice", "global"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "graphfedseg", "... each site's local model", "dice", "local"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "graphfedseg",
                  "... local models after largest-component post-processing", "dice_lcc", "local"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "graphfedseg",
                  "... GraphFedSeg's local models against FedAvg's global model", "dice", "local", "global"),
                 ("graphfedseg-protocol-retina-authors", "fedavg", "fedavg",
                  "(FedAvg's own local models against its global model, in the GraphFedSeg column)", "dice", "local",
                  "global")],
        "title": "GraphFedSeg against FedAvg under the suite's default and the authors' code, real retina federation "
                 "(native resolution, 20 rounds)"},
})

def render(table_id: str, root: Path = Path(DEFAULT_ROOT), run: bool = False, link: Optional[str] = None,
           ignore_command: bool = False, runs: Mapping[str, Mapping[str, Any]] = RUNS,
           tables: Mapping[str, Mapping[str, Any]] = TABLES, out_root: Optional[Path] = None,
           record: bool = False) -> str:
    """The markdown of table ``table_id``: a comment naming it, the caption, a blank line, the table.

    Args:
        table_id: a key of ``tables``.
        root: the records root the registry's outputs are read from.
        run: run the table's commands first into ``out_root`` (a ``fedseg bench`` resumes: finished runs are
            skipped), then record them into ``root``.
        out_root: where ``run`` writes and ``record`` reads outputs (default :data:`OUT_ROOT`).
        record: record the table's outputs from ``out_root`` into ``root`` first (made earlier, or elsewhere).
        link: the results page, for the glance table's links to its source tables.
        ignore_command: render an output made by another command than the registry's (the caption says so).

    Raises:
        ReproduceError: unknown table, bad registry entry, failed command, unreadable or stale output;
            :class:`MissingOutput` where the output does not exist.
    """
    table = get_table(table_id, tables)
    check_registry(runs, {table_id: table, **{t: tables[t] for t in table.get("from", []) if t in tables}})
    sources = [tables[t] for t in table.get("from", [])] if table["render"] == "glance" else [table]
    out_root = Path(out_root or OUT_ROOT)
    for run_id in dict.fromkeys(r for src in sources for r in run_ids(src)) if run or record else ():
        if run:
            run_commands(run_id, out_root, runs)
        try:
            record_run(run_id, out_root, root, runs)
        except MissingOutput:
            if not table.get("missing_ok"):
                raise
    if table["render"] == "glance":
        lines = render_glance(table_id, table, [], root=root, tables=tables, runs=runs, link=link or table.get("link"),
                              ignore_command=ignore_command)
    else:
        outputs = []
        for run_id in run_ids(table):
            try:
                outputs.append(load_output(run_id, root, runs, ignore_command, seeds=table.get("seeds"),
                                           baseline=table.get("baseline")))
            except MissingOutput:
                if not table.get("missing_ok"):
                    raise
                outputs.append(None)  # a point of a curve not run yet: the renderer says so
        if not any(o is not None for o in outputs):
            raise MissingOutput(f"table {table_id!r}: none of its runs has an output yet: "
                                + ", ".join(str(result_path(runs[r], root)) for r in run_ids(table)))
        lines = RENDERERS[table["render"]](table_id, table, outputs)
    return "\n".join([f"<!-- python benchmarks/reproduce.py {table_id} -->", *lines]) + "\n"


def listing(root: Path = Path(DEFAULT_ROOT), runs: Mapping[str, Mapping[str, Any]] = RUNS,
            tables: Mapping[str, Mapping[str, Any]] = TABLES, out_root: Optional[Path] = None) -> str:
    """Every table: id, title, renderer, whether its record exists under ``root``, and the commands ``--run`` runs
    (outputs under ``out_root``)."""
    out = []
    for table_id, table in tables.items():
        out.append(f"{table_id}: {table['title']} [{table['render']}]")
        if table["render"] == "glance":
            out.append(f"  from: {', '.join(table['from'])}")
            continue
        for run_id in run_ids(table):
            path = result_path(runs[run_id], root)
            out.append(f"  run {run_id}: {path} ({'recorded' if path.is_file() else 'no record'})")
            out += [f"    {c}" for c in commands(runs[run_id], Path(out_root or OUT_ROOT))]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------- main
def main(argv: Optional[Sequence[str]] = None, runs: Mapping[str, Mapping[str, Any]] = RUNS,
         tables: Mapping[str, Mapping[str, Any]] = TABLES) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", metavar="TABLE", help="table ids (see --list); 'glance' for the overview")
    parser.add_argument("--run", action="store_true", help="run the tables' commands first (fedseg bench resumes)")
    parser.add_argument("--list", action="store_true", help="list the tables with their outputs and commands")
    parser.add_argument("--all", action="store_true", help="render every table whose output exists")
    parser.add_argument("--records", default=str(DEFAULT_ROOT),
                        help="where the run records are read from (default: the repository's benchmarks/results)")
    parser.add_argument("--out-root", default=None,
                        help="where --run writes outputs and --record reads them (default $FEDSEG_BENCH_OUT, else ./bench_out)")
    parser.add_argument("--data-root", default=None,
                        help="the folder holding the real data sets, for the import commands (default $FEDSEG_DATASETS)")
    parser.add_argument("--record", action="store_true",
                        help="record the tables' outputs from --out-root into --records, then render")
    parser.add_argument("--check-page", nargs="+", metavar="PAGE", default=None,
                        help="check that every table and figure on these pages equals its render from the records")
    parser.add_argument("--update-page", nargs="+", metavar="PAGE", default=None,
                        help="rewrite every table block of these pages with its render from the records")
    parser.add_argument("--figures", default=None, metavar="DIR",
                        help="with --all: also write every figure into DIR (the page's figures: docs/figures)")
    parser.add_argument("--link", default=None, help="results page the glance table links its sources to, e.g. docs/benchmarks.md")
    parser.add_argument("--ignore-command", action="store_true",
                        help="render outputs made by another command than the registry's (the caption says so)")
    args = parser.parse_args(argv)
    root = Path(args.records)
    out_root = Path(args.out_root) if args.out_root else OUT_ROOT
    global DATA_ROOT
    DATA_ROOT = args.data_root or DATA_ROOT
    try:
        check_registry(runs, tables)
    except ReproduceError as e:
        print(f"reproduce.py: bad registry: {e}", file=sys.stderr)
        return 2
    if args.list:
        sys.stdout.write(listing(root, runs, tables, out_root))
        return 0
    if args.check_page:
        from page import check_pages

        problems = check_pages([Path(p) for p in args.check_page], root, runs, tables)
        for problem in problems:
            print(f"reproduce.py: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if args.update_page:
        from page import update_page

        for page in args.update_page:
            print(f"{page}: {', '.join(update_page(Path(page), root, runs, tables)) or 'no table blocks'}", file=sys.stderr)
        return 0
    if not args.tables and not args.all:
        parser.error("name a TABLE, or use --all, --list, --check-page or --update-page")
    if args.all and (args.run or args.record):
        parser.error("--all renders the records only; name the tables to --run or --record")
    failed = 0
    if args.figures:
        from figures import FIGURES, write_figure

        for figure_id in FIGURES:
            try:
                print(write_figure(figure_id, Path(args.figures), root, runs), file=sys.stderr)
            except ReproduceError as e:
                print(f"reproduce.py: figure {figure_id}: {e}", file=sys.stderr)
                failed += 1
    ids = list(tables) if args.all else args.tables
    blocks = []
    for table_id in ids:
        try:
            blocks.append(render(table_id, root, run=args.run, link=args.link, ignore_command=args.ignore_command,
                                 runs=runs, tables=tables, out_root=out_root, record=args.record))
        except MissingOutput as e:
            print(f"reproduce.py: {table_id}: {e}", file=sys.stderr)
            failed += 0 if args.all else 1  # --all renders what exists
        except ReproduceError as e:
            print(f"reproduce.py: {table_id}: {e}", file=sys.stderr)
            failed += 1
    sys.stdout.write("\n".join(blocks))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
