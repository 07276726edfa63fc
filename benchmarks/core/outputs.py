"""A run's stored output: where it is, whether the registry's command made it, reading it (over some of its seeds or
against another baseline), recording it, and running the commands that make it.

A stored output made by another command than the registry's is refused (the registry or the output is stale): fix
the registry or re-run; ``ignore_command`` reads it anyway and marks it. The value of ``--out`` is not compared (an
output made elsewhere, e.g. under /tmp on a GPU machine, and recorded is the same run), nor the output root's own
path (``{root}``); every other word is.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from benchmarks.core.records import RECORDS_ROOT, REPO, ROOT_TOKEN, record_output, sanitise
from benchmarks.core.registry import MissingOutput, ReproduceError, commands, output_path, result_path

#: what tables are drawn from: the committed run records
DEFAULT_ROOT = RECORDS_ROOT
#: where ``--run`` writes outputs (workspaces, logs: never in git; ``/bench_out/`` is in .gitignore)
OUT_ROOT = Path(os.environ.get("FEDSEG_BENCH_OUT") or REPO / "bench_out")


def record_run(run_id: str, out_root: Path, records_root: Path, runs: Mapping[str, Mapping[str, Any]]) -> List[Path]:
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


def run_records(results: Mapping[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    """``(text, record)`` of every stored run record of a bench (``runs/<id>.json`` in its output folder).

    Raises:
        ReproduceError: a run record the bench lists is missing.
    """
    folder = Path(results["_output_dir"]) / "runs"
    ids = list(results["runs"]) if results.get("runs") else sorted(p.stem for p in folder.glob("*.json"))
    out = []
    for run_id in ids:
        path = folder / f"{run_id}.json"
        if not path.is_file():
            raise ReproduceError(f"the bench's run record {path} is missing")
        text = path.read_text()
        out.append((text, json.loads(text)))
    return out


def _rebuild(results: Mapping[str, Any], texts: List[str], records: List[Dict[str, Any]], seeds: Sequence[int],
             baseline: Optional[str], folders: Sequence[Path]) -> Dict[str, Any]:
    """``results`` aggregated again (:func:`fedseg.bench.report.build_results`) from ``records``, with its header."""
    from fedseg.bench.bench import run_code_versions
    from fedseg.bench.report import build_results

    header = {k: results[k] for k in HEADER_FIELDS if k in results}
    where: Dict[str, str] = {}  # each run's record: in the first folder that holds it
    for folder in folders:
        for r in records:
            if r["id"] not in where and (Path(folder) / "runs" / f"{r['id']}.json").is_file():
                where[r["id"]] = str(Path(folder) / "runs" / f"{r['id']}.json")
    header.update(seeds=sorted(int(s) for s in seeds), run_code_versions=run_code_versions(records),
                  runs={r["id"]: where.get(r["id"], r["id"]) for r in records})
    sites, baseline = list(results["sites"]), baseline or results.get("baseline")
    key = hashlib.sha256(json.dumps([texts, sites, header, baseline], sort_keys=True).encode()).hexdigest()
    if key not in _REBUILT:
        _REBUILT[key] = build_results(records, sites, header, baseline=baseline)
    rebuilt = copy.deepcopy(_REBUILT[key])
    rebuilt.update({k: v for k, v in results.items() if k.startswith("_")}, _seeds_of=[int(s) for s in results.get("seeds") or []])
    return rebuilt


def select_seeds(results: Dict[str, Any], seeds: Sequence[int], baseline: Optional[str] = None) -> Dict[str, Any]:
    """``results`` rebuilt from the bench's stored run records of ``seeds`` only (``runs/<id>.json`` in its output
    folder): the same aggregation (:func:`fedseg.bench.report.build_results`) over fewer seeds, and with ``baseline``
    against another of the bench's labels than its own baseline. ``_seeds_of`` keeps the bench's own seeds for the
    caption.

    Raises:
        ReproduceError: a seed the bench did not run, or a run record missing.
    """
    ran = [int(s) for s in results.get("seeds") or []]
    missing = [s for s in seeds if int(s) not in ran]
    if missing:
        raise ReproduceError(f"seed(s) {missing} not in the bench's seeds {ran}")
    stored = run_records(results)
    chosen = [r for _, r in stored if int(r["seed"]) in {int(s) for s in seeds}]
    return _rebuild(results, [t for t, _ in stored], chosen, seeds, baseline, [Path(results["_output_dir"])])


def merge_benches(results: Dict[str, Any], others: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """One bench of ``results``' runs and every approach of ``others`` it lacks, aggregated together against its
    baseline (paired tests, ranking, timings): benches that reused its baseline runs (``fedseg bench --reuse``), so
    that an approach of another bench is compared on the same images with the same FedAvg runs.

    Raises:
        ReproduceError: another bench without the baseline, or whose run of some approach and seed differs from this
            bench's (not the same runs), or a run record missing.
    """
    base = results.get("baseline")
    stored = run_records(results)
    records = [r for _, r in stored]
    texts = [t for t, _ in stored]
    held = {(r["label"], int(r["seed"])): r for r in records}
    for other in others:
        theirs = run_records(other)
        if not any(r["label"] == base for _, r in theirs):
            raise ReproduceError(f"{other['_output_dir']} has no {base!r} runs to pair with")
        for text, r in theirs:
            key = (r["label"], int(r["seed"]))
            if key in held:
                if held[key].get("final") != r.get("final") or held[key].get("per_image") != r.get("per_image"):
                    raise ReproduceError(f"{other['_output_dir']}: its {r['label']!r} run of seed {r['seed']} is not "
                                         f"the one of {results['_output_dir']} (benches merged must share their runs: --reuse)")
                continue
            if int(r["seed"]) in {int(s) for s in results.get("seeds") or []}:
                held[key] = r
                records.append(r)
                texts.append(text)
    folders = [Path(results["_output_dir"])] + [Path(o["_output_dir"]) for o in others]
    return _rebuild(results, texts, records, results.get("seeds") or [], base, folders)


def load_output(run_id: str, root: Path, runs: Mapping[str, Mapping[str, Any]], ignore_command: bool = False,
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


def run_commands(run_id: str, root: Path, runs: Mapping[str, Mapping[str, Any]]) -> None:
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
