"""What homomorphic aggregation costs: each arm's round, server CPU and payload with CKKS-encrypted models against the
same job in the clear, and how far apart the two runs' models and Dice end, in one run.

    python benchmarks/cost/he_cost.py --out OUT                       # every arm, 3 rounds, 2 runs per mode
    python benchmarks/cost/he_cost.py --out OUT --arms fedavg-2d --rounds 3 --repeats 1 --no-one-round-check

Arms (NVFlare's simulator, one process per site, one torch thread each, the default training profile, the built-in
data generated once into ``OUT/data`` and read by both modes through ``--site-datalists``):

* ``fedavg-2d``, ``fedevi-2d``: FedAvg and FedEvi on built-in polyp (default data profile, 3 sites): the 2-D U-Net
  users run;
* ``fedavg-3d``: FedAvg on built-in prostate3d (default data profile, 3 sites, 3-D patches, 3 classes): the 3-D U-Net
  of a volume job (``fedseg.config.VOLUME_DEFAULTS``).

Modes of each arm: ``plain`` (``fedseg run METHOD ...``) and ``he`` (the same with ``--he``: the sites encrypt every
floating-point entry they send, the server sums ciphertexts; ``fedseg.fl.homomorphic``), one key pair written by
NVFlare's HEBuilder into ``OUT/he_keys`` for every HE job. The modes run interleaved (plain, he in repeat 0; he,
plain in repeat 1; ...) so that the machine's load falls on both. Per mode: medians over rounds 1.. of every repeat
(round 0 holds the site processes' start-up) of the round wall, the server process's CPU seconds in the round
(``server_cpu_time``), the bytes the sites sent up and the server sent down (all sites); the final global model's
test Dice per site (first repeat); then the ratios HE / plain. Accuracy: the largest |plain - HE| over every
floating-point entry of the final global model (the plaintext server's ``FL_global_model.pt`` against the model each
HE site decrypted, ``fedseg_outputs/<site>/global_model.pt``), every run with the same seed:

* after one round (a plain and an HE run of one round each; ``--no-one-round-check`` skips them): the sites train
  identically from the same initial model, so one CKKS aggregation alone separates the two, within its bound
  ``fedseg.fl.homomorphic.CKKS_ABS_TOL`` x max(1, max |x|);
* after ``--rounds`` rounds (the first run of each mode): later rounds train from global models already that far
  apart, beside the difference between two runs of the same mode.

Writes ``OUT/he_cost.json`` (machine, commands, every number) and prints its table (``benchmarks/cost/render.py``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fedseg.processes import StopOnSignal

if __name__ == "__main__":  # run as a script: the repository root on the path, for the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.cost.bundle_path import _mean, _set_words, _train_config  # noqa: E402

#: the arms: method, built-in family, data profile, sites, the job's settings (``--set``)
ARMS: Dict[str, Dict[str, Any]] = {
    "fedavg-2d": {"method": "fedavg", "family": "polyp", "data_profile": "default",
                  "sites": ["site-1", "site-2", "site-3"], "sets": {}},
    "fedevi-2d": {"method": "fedevi", "family": "polyp", "data_profile": "default",
                  "sites": ["site-1", "site-2", "site-3"], "sets": {}},
    # a volume job's 3-D U-Net and 64 x 64 x 16-voxel patches (fedseg.config.VOLUME_DEFAULTS) on 16-24 volumes per site
    "fedavg-3d": {"method": "fedavg", "family": "prostate3d", "data_profile": "default",
                  "sites": ["site-1", "site-2", "site-3"], "sets": {"spatial_mode": "patch"}},
}

MODES = ("plain", "he")


def prepare_arm(name: str, arm: Dict[str, Any], out: Path, rounds: int, keys: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Each mode's exported job of ``rounds`` rounds (``{mode: {"job", "command", "train_config"}}``) on the arm's
    built-in data, written under ``out/<name>``; the options are those ``fedseg run`` derives from the same command
    line."""
    from fedseg.data.synthetic import generate_site_data
    from fedseg.recipes.export import export_job
    from fedseg.recipes.job_options import data_fields

    root = out / name
    root.mkdir(parents=True, exist_ok=True)
    datalists = {s: str(generate_site_data(arm["family"], s, out / "data" / arm["data_profile"],
                                           profile=arm["data_profile"]).resolve()) for s in arm["sites"]}
    site_map = root / "site_datalists.json"
    site_map.write_text(json.dumps(datalists, indent=1))
    train = {**data_fields(datalists, None, dict(arm["sets"]), None), **arm["sets"]}
    words = ["--site-datalists", str(site_map)] + (["--set", *_set_words(arm["sets"])] if arm["sets"] else [])
    jobs = {}
    for mode in MODES:
        job = export_job(arm["method"], root / f"jobs_{rounds}_rounds" / mode, "default", num_rounds=rounds,
                         script_args=f"--site_datalists {site_map}", min_clients=len(arm["sites"]), **train,
                         **(keys if mode == "he" else {}))
        config = json.loads(next(job.rglob("config_fed_server.json")).read_text())
        jobs[mode] = {"job": job, "train_config": _train_config(config),
                      "command": " ".join(["fedseg", "run", arm["method"], *words, "--rounds", str(rounds),
                                           *(["--he"] if mode == "he" else [])])}
    if jobs["plain"]["train_config"] != jobs["he"]["train_config"]:  # the modes must train the same way
        raise RuntimeError(f"{name}: the plain and the HE job train differently")
    return jobs


def final_global_model(workspace: Path, sites: Sequence[str], mode: str) -> Dict[str, Any]:
    """The final global model's floating-point entries (``{site or "server": {name: tensor}}``): the plaintext
    server's stored model, or under HE every site's decrypted copy (the server holds ciphertexts only)."""
    import torch

    if mode == "plain":
        paths = {"server": workspace / "server" / "simulate_job" / "app_server" / "FL_global_model.pt"}
    else:
        paths = {s: workspace / s / "fedseg_outputs" / s / "global_model.pt" for s in sites}
    models = {}
    for who, path in paths.items():
        if not path.is_file():
            raise RuntimeError(f"{mode} run: no final global model at {path}")
        state = torch.load(path, map_location="cpu", weights_only=True)["model"]
        models[who] = {k: v.detach().double() for k, v in state.items() if torch.is_floating_point(v)}
    return models


def max_abs_diff(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    """Largest |a - b| over the floating-point entries both models hold (they must hold the same names)."""
    if set(a) != set(b):
        raise RuntimeError(f"the models hold different entries: {sorted(set(a) ^ set(b))[:5]}")
    return max(float((a[k] - b[k]).abs().max()) if a[k].numel() else 0.0 for k in a)


def interleaved(modes: Sequence[str], repeats: int) -> List[Tuple[int, str]]:
    """``(repeat, mode)`` in run order: the modes in order in even repeats, reversed in odd ones."""
    return [(rep, mode) for rep in range(repeats) for mode in (modes if rep % 2 == 0 else tuple(reversed(modes)))]


def run_mode(job: Path, workspace: Path, sites: Sequence[str], log: Path, mode: str) -> Dict[str, Any]:
    """One simulator run of ``job``: the machine's load as it starts, per round its wall, server CPU, bytes up /
    down; the final test Dice per site; and the final global model (``"model"``: in memory only, not written to the
    record). Prints its rounds."""
    from fedseg.bench.simulator import load_average, round_timings, run_simulator

    load = load_average()  # the machine may be shared
    res = run_simulator(job, workspace, list(sites), threads=len(sites), omp_threads="1", fedseg_threads="1", log_path=log)
    report = res["report"]
    timings = round_timings(report)
    row = {
        "loadavg_at_start": load, "simulator_command": res["command"], "total_wall_s": res["total_wall_s"],
        "round_walls": [t["wall"] for t in timings],
        "server_cpu": [r.get("server_cpu_time") for r in report["rounds"]],
        "bytes_up": [t["bytes_up"] for t in timings], "bytes_down": [t["bytes_down"] for t in timings],
        "val_dice": [_mean([m.get("val_dice") for m in r["metrics"].values()]) for r in report["rounds"]],
        "final_test_dice": {s: v.get("dice") for s, v in ((report.get("final") or {}).get("global") or {}).items()},
        "model": final_global_model(workspace, sites, mode),
    }
    shutil.rmtree(workspace, ignore_errors=True)  # the numbers are in the JSON; the logs stay
    print(f"    rounds {' '.join(f'{w:.2f}' for w in row['round_walls'])} s; server CPU "
          f"{' '.join(f'{c or 0:.2f}' for c in row['server_cpu'])} s; up "
          f"{' '.join(f'{b / 1e6:.1f}' for b in row['bytes_up'])} MB", flush=True)
    return row


def _later(runs: List[Dict[str, Any]], key: str) -> List[float]:
    return [float(v) for r in runs for v in r[key][1:] if v is not None]


def summarise(runs: List[Dict[str, Any]], num_sites: int) -> Dict[str, Any]:
    """One mode over its repeats: medians over rounds 1.. of every repeat; the Dice of the first repeat."""
    cpu = _later(runs, "server_cpu")
    up, down = statistics.median(_later(runs, "bytes_up")), statistics.median(_later(runs, "bytes_down"))
    return {"median_round_s": statistics.median(_later(runs, "round_walls")), "rounds_used": len(_later(runs, "round_walls")),
            "median_round0_s": statistics.median(r["round_walls"][0] for r in runs),
            "median_server_cpu_s": statistics.median(cpu) if cpu else None,
            "bytes_up_per_round": up, "bytes_down_per_round": down,
            "bytes_up_per_site_round": up / num_sites, "bytes_down_per_site_round": down / num_sites,
            "val_dice": runs[0]["val_dice"], "final_test_dice": runs[0]["final_test_dice"]}


def plain_he_diff(plain: Dict[str, Any], he: Dict[str, Any]) -> Dict[str, Any]:
    """A plaintext run's final global model against an HE run's (first entries of ``run_mode``'s ``"model"``): the
    largest |plain - HE| over the HE sites' decrypted copies, the CKKS bound of one aggregation of the plaintext model
    (``CKKS_ABS_TOL`` x max(1, max |x|)), and how far the HE sites' copies are from each other."""
    from fedseg.fl.homomorphic import CKKS_ABS_TOL

    server, decrypted = plain["model"]["server"], he["model"]
    largest = max(float(v.abs().max()) for v in server.values() if v.numel())
    first = next(iter(decrypted.values()))
    dice_plain, dice_he = plain["final_test_dice"], he["final_test_dice"]
    return {"float_values": sum(v.numel() for v in server.values()),
            "max_abs_diff_global_model": max(max_abs_diff(server, m) for m in decrypted.values()),
            "max_abs_global_model": largest, "ckks_abs_tol": CKKS_ABS_TOL,
            "ckks_bound_one_aggregation": CKKS_ABS_TOL * max(1.0, largest),
            "he_sites_max_abs_diff": max(max_abs_diff(first, m) for m in decrypted.values()),
            "max_abs_diff_final_test_dice": max(abs(dice_plain[s] - dice_he[s]) for s in dice_plain)}


def accuracy(runs: Dict[str, List[Dict[str, Any]]], one_round: Optional[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """How far the HE run's final global model and Dice are from the plaintext run's (first repeats), the differences
    between repeats of the same mode, and (``one_round``: a plain and an HE run of one round) the same after a single
    aggregation of identically trained site models, where only CKKS stands between the two."""
    result = plain_he_diff(runs["plain"][0], runs["he"][0])
    if one_round is not None:
        result["one_round"] = plain_he_diff(one_round["plain"], one_round["he"])
    for mode in MODES:  # what the same job gives twice: the floor the plain - HE difference is read against
        if len(runs[mode]) > 1:
            first = runs[mode][0]["model"]
            result[f"{mode}_repeats_max_abs_diff"] = max(
                max_abs_diff(next(iter(first.values())), next(iter(r["model"].values()))) for r in runs[mode][1:])
    return result


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-one-round-check", dest="one_round_check", action="store_false",
                        help="skip the plain and HE runs of one round (the models after a single aggregation)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode (interleaved, order reversed each repeat)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 0 is left out of the medians)")
    return args


@StopOnSignal("he_cost")  # SIGTERM / Ctrl-C end the runs it started too
def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    from fedseg.bench.bench import code_version
    from fedseg.bench.simulator import machine_info
    from fedseg.fl.homomorphic import provision_contexts

    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = machine_info()  # the load before the runs (this machine may be shared)
    server_key, site_key = provision_contexts(out / "he_keys")
    keys = {"he": True, "he_server_context": str(server_key), "he_site_context": str(site_key)}
    record: Dict[str, Any] = {
        "benchmark": "he_cost", "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/cost/he_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine, "code_version": code_version(), "rounds": args.rounds, "repeats": args.repeats, "arms": {},
    }
    for name in args.arms:
        arm = ARMS[name]
        jobs = prepare_arm(name, arm, out, args.rounds, keys)
        check_jobs = prepare_arm(name, arm, out, 1, keys) if args.one_round_check else None
        runs: Dict[str, List[Dict[str, Any]]] = {mode: [] for mode in MODES}
        for rep, mode in interleaved(MODES, args.repeats):
            print(f"[{_dt.datetime.now():%H:%M:%S}] {name} {mode} repeat {rep}: {jobs[mode]['command']}", flush=True)
            runs[mode].append({"repeat": rep, **run_mode(jobs[mode]["job"], out / name / "ws" / f"{mode}_r{rep}",
                                                         arm["sites"], out / name / "logs" / f"{mode}_r{rep}.log", mode)})
        one_round = None
        if check_jobs is not None:  # one aggregation of identically trained models: CKKS alone between the modes
            one_round = {}
            for mode in MODES:
                print(f"[{_dt.datetime.now():%H:%M:%S}] {name} {mode}, one round: {check_jobs[mode]['command']}", flush=True)
                one_round[mode] = run_mode(check_jobs[mode]["job"], out / name / "ws" / f"{mode}_one_round", arm["sites"],
                                           out / name / "logs" / f"{mode}_one_round.log", mode)
        summary = {mode: summarise(runs[mode], len(arm["sites"])) for mode in MODES}
        plain, he = summary["plain"], summary["he"]
        ratio = {key: (he[key] / plain[key] if he[key] is not None and plain[key] else None)
                 for key in ("median_round_s", "median_server_cpu_s", "bytes_up_per_round", "bytes_down_per_round")}
        check = accuracy(runs, one_round)
        for r in [r for mode_runs in runs.values() for r in mode_runs] + list((one_round or {}).values()):
            del r["model"]
        record["arms"][name] = {
            "method": arm["method"], "family": arm["family"], "data_profile": arm["data_profile"], "sites": arm["sites"],
            "sets": arm["sets"], "commands": {mode: jobs[mode]["command"] for mode in MODES},
            # both modes' jobs hold the same train_config: HE is the controller's and the sites' option, not training's
            "train_config": jobs["plain"]["train_config"],
            "parameters": check["float_values"], "modes": summary, "ratio_he_over_plain": ratio, "accuracy": check,
            "runs": runs, "one_round_runs": one_round,
            **({"one_round_commands": {mode: check_jobs[mode]["command"] for mode in MODES}} if check_jobs else {}),
        }
    record["wall_time_s"] = time.perf_counter() - started
    (out / "he_cost.json").write_text(json.dumps(record, indent=1, default=str))
    print(render(record))
    return record


def render(record: Dict[str, Any]) -> str:
    """The record as the cost page draws it (:func:`benchmarks.cost.render.he_cost_rows`)."""
    from benchmarks.cost.render import he_cost_rows

    return "\n".join(he_cost_rows(record))


if __name__ == "__main__":
    main()
