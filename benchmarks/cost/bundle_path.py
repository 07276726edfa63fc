"""FedAvg's round on the bundle path (any MONAI bundle, ``BundleEngine``) against today's path (``SegEngine`` with the
suite's own bundles), on the same network and the same data, in one run.

    python benchmarks/cost/bundle_path.py --out OUT                       # 2-D and 3-D, 6 rounds, 2 repeats per path
    python benchmarks/cost/bundle_path.py --out OUT --cases 2d --rounds 4 --repeats 1 --profile-repeats 0

Cases (built-in data, FedAvg, default profile, NVFlare's simulator, one process per site):

* ``2d``: ``bundles/unet2d_seg`` on built-in polyp (default data profile, 3 sites), 64 px;
* ``3d``: ``bundles/volume_seg`` on built-in prostate3d (tiny data profile, 2 sites), 3-D patches of 32 x 32 x 16
  voxels (the tiny volumes are 26-32 voxels in-plane at its 2.5 mm target spacing: a 64-voxel patch would be mostly
  padding), 3 classes, the family's target spacing.

Paths ("arms") of each case, the same job settings otherwise (``fedseg run fedavg``'s; the commands are in the JSON):

* ``bundle``: ``--bundle bundles/<name> --site-overrides SITES.json`` (each site's ``dataset_dir``, the folder holding
  its ``datalist.json``): every site reads the bundle through MONAI's ``ConfigWorkflow`` (``fedseg.engine.bundle_engine``)
  and holds its training split on the device with the batch form of its random transforms, as today's engine does;
* ``bundle_cached``: the same with ``--set train#dataset#_target_=CacheDataset validate#dataset#_target_=CacheDataset``:
  the bundles' datasets are MONAI's plain ``Dataset`` (every image decoded and resampled again each epoch), which a
  user can switch to MONAI's ``CacheDataset`` (the deterministic transforms run once) without editing the bundle;
* ``today``: ``--site-datalists MAP.json``: the suite's own engine (device-resident batches augmented batch-wise);
* ``today_nonresident``: the same with ``--set resident_data=false`` (the per-sample loader): what the device-resident
  batches save.

The paths run interleaved (repeat 0 in the order above, repeat 1 reversed, ...) so that the machine's load falls on all
of them. Per path: every round's wall (the server's send -> aggregated), the slowest site's ``compute_time`` (its own
training + validation + packing), the mean over sites of ``val_dice`` / ``train_loss`` per round; medians over rounds
1.. (round 0 holds the site processes' start-up) of all repeats, and the ratios to today's path.

Then, in this process, where a site's round goes (``--profile-repeats``; 0 = off): site-1 of each case, one torch
thread, one local epoch and one validation at a time on each path's engine in turn, medians over the repeats after the
first; for volumes also the first model's validation Dice on the bundle path with its postprocessing as written
and with ``Invertd`` before the softmax, as today's engine inverts the scores (``fedseg.engine.volume.invert_to_scan``;
``volume_seg`` now does the same, so the two agree).

Writes ``OUT/bundle_path.json`` (machine, commands, every number) and prints its two tables
(``benchmarks/cost/render.py``).
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
from typing import Any, Dict, List, Optional, Sequence

from fedseg.processes import StopOnSignal

REPO = Path(__file__).resolve().parents[2]

#: the cases: bundle, built-in family, data profile, sites, the job's settings on both paths (``--set``), and the
#: fields of the datalists a volume job needs that the bundle path takes as config ids (today's path reads them from
#: the datalists; on the bundle path the bundle's own defaults would hold, so the user states them)
CASES: Dict[str, Dict[str, Any]] = {
    "2d": {"bundle": "unet2d_seg", "family": "polyp", "data_profile": "default", "sites": ["site-1", "site-2", "site-3"],
           # the default profile's size; the bundle's own default is 96 px
           "sets": {"image_size": 64}},
    "3d": {"bundle": "volume_seg", "family": "prostate3d", "data_profile": "tiny", "sites": ["site-1", "site-2"],
           "sets": {"patch_size": [32, 32, 16]}, "bundle_fields": ("num_classes", "target_spacing"),
           # today's engine draws the patches class by class for a label space of several classes
           # (fedseg.data.labels.resolve_patch_sampler); the bundle read alone keeps its default positive/negative crop
           "bundle_sets": {"patch_sampler": "classes"}},
}

ARMS = ("bundle", "bundle_cached", "today", "today_nonresident")

#: config ids that make a bundle cache its deterministic preprocessing (MONAI's CacheDataset), as a user can --set them
CACHE_SETS = {"train#dataset#_target_": "CacheDataset", "validate#dataset#_target_": "CacheDataset"}


def _set_words(sets: Dict[str, Any]) -> List[str]:
    return [f"{k}={json.dumps(v, separators=(',', ':')) if not isinstance(v, str) else v}" for k, v in sets.items()]


def prepare_case(name: str, case: Dict[str, Any], out: Path, rounds: int) -> Dict[str, Dict[str, Any]]:
    """Each path's exported job (``{arm: {"job", "command", "train_config"}}``) on the case's built-in data, written
    under ``out/<name>``; the options are those ``fedseg run`` derives from the same command line."""
    from fedseg.bundle import default_bundle_dir
    from fedseg.data.synthetic import generate_site_data
    from fedseg.recipes.export import export_job
    from fedseg.recipes.job_options import bundle_options, data_fields

    root = out / name
    root.mkdir(parents=True, exist_ok=True)
    datalists = {s: generate_site_data(case["family"], s, out / "data", profile=case["data_profile"]).resolve()
                 for s in case["sites"]}
    site_map = root / "site_datalists.json"
    site_map.write_text(json.dumps({s: str(p) for s, p in datalists.items()}, indent=1))
    # today's path: what `fedseg run --site-datalists` adds to the job (the datalists' spatial mode, label space, and
    # for volumes their geometry), then the --set keys
    today = {**data_fields({s: str(p) for s, p in datalists.items()}, None, dict(case["sets"]), None), **case["sets"]}
    # the bundle path: each site's dataset_dir (the folder of its datalist.json), and what the datalists declare that
    # the bundle's defaults do not hold
    bundle_sets = {**case["sets"], **{k: today[k] for k in case.get("bundle_fields", ())}, **case.get("bundle_sets", {})}
    overrides_file = root / "site_overrides.json"
    overrides_file.write_text(json.dumps({s: {"dataset_dir": str(p.parent)} for s, p in datalists.items()}, indent=1))
    bundle_dir = str(default_bundle_dir(case["bundle"]))

    def bundle_job(sets: Dict[str, Any]):
        train, script_args, _ = bundle_options(bundle_dir, str(overrides_file), sets)
        return train, script_args, ["--bundle", f"bundles/{case['bundle']}", "--site-overrides", str(overrides_file),
                                    "--set", *_set_words(sets)]

    datalist_args = f"--site_datalists {site_map}"
    jobs = {
        "bundle": bundle_job(bundle_sets),
        "bundle_cached": bundle_job({**bundle_sets, **CACHE_SETS}),
        "today": (today, datalist_args, ["--site-datalists", str(site_map), "--set", *_set_words(case["sets"])]),
        "today_nonresident": ({**today, "resident_data": False}, datalist_args,
                              ["--site-datalists", str(site_map), "--set", *_set_words(case["sets"]), "resident_data=false"]),
    }
    arms = {}
    for arm, (train, args, words) in jobs.items():
        job = export_job("fedavg", root / "jobs" / arm, "default", num_rounds=rounds, script_args=args,
                         min_clients=len(case["sites"]), **train)
        config = json.loads(next(job.rglob("config_fed_server.json")).read_text())
        arms[arm] = {"job": job, "command": " ".join(["fedseg", "run", "fedavg", *words, "--rounds", str(rounds)]),
                     "train_config": _train_config(config)}
    return arms


def _train_config(node: Any) -> Optional[Dict[str, Any]]:
    """The job's train_config as the server's config holds it (the first component argument of that name)."""
    if isinstance(node, dict):
        if isinstance(node.get("train_config"), dict):
            return node["train_config"]
        node = list(node.values())
    if isinstance(node, list):
        for value in node:
            found = _train_config(value)
            if found is not None:
                return found
    return None


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _max_abs_diff(a: Sequence[Optional[float]], b: Sequence[Optional[float]]) -> Optional[float]:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return max(abs(x - y) for x, y in pairs) if pairs else None


def run_arm(job: Path, workspace: Path, sites: Sequence[str], log: Path) -> Dict[str, Any]:
    """One simulator run of ``job``: per round its wall, the slowest site's compute, mean val_dice / train_loss."""
    from fedseg.bench.simulator import round_timings, run_simulator

    # one torch thread per site process, as `fedseg run` / `fedseg bench` give them
    res = run_simulator(job, workspace, list(sites), threads=len(sites), omp_threads="1", fedseg_threads="1", log_path=log)
    report = res["report"]
    timings = round_timings(report)
    row = {
        "simulator_command": res["command"], "total_wall_s": res["total_wall_s"],
        "round_walls": [t["wall"] for t in timings],
        "max_site_compute": [t.get("max_compute") for t in timings],
        "val_dice": [_mean([m.get("val_dice") for m in r["metrics"].values()]) for r in report["rounds"]],
        "train_loss": [_mean([m.get("train_loss") for m in r["metrics"].values()]) for r in report["rounds"]],
        "final_test_dice": _mean([v.get("dice") for v in ((report.get("final") or {}).get("global") or {}).values()]),
    }
    shutil.rmtree(workspace, ignore_errors=True)  # the numbers are in the JSON; the logs stay
    return row


def summarise(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One path over its repeats: medians over rounds 1.. of every repeat; its curves from the first repeat, and how far
    the other repeats' curves are from it (the runs are seeded: the same job gives the same numbers)."""
    walls = [w for r in runs for w in r["round_walls"][1:]]
    compute = [c for r in runs for c in r["max_site_compute"][1:] if c is not None]
    return {"median_round_s": statistics.median(walls), "rounds_used": len(walls),
            "median_round_per_repeat_s": [statistics.median(r["round_walls"][1:]) for r in runs],
            "median_max_site_compute_s": statistics.median(compute) if compute else None,
            "median_round0_s": statistics.median(r["round_walls"][0] for r in runs),
            "val_dice": runs[0]["val_dice"], "train_loss": runs[0]["train_loss"],
            "final_test_dice": runs[0]["final_test_dice"],
            "repeats_max_diff": {key: max((_max_abs_diff(r[key], runs[0][key]) or 0.0 for r in runs[1:]), default=0.0)
                                 for key in ("val_dice", "train_loss")}}


def site_profile(case: Dict[str, Any], arms: Dict[str, Dict[str, Any]], out: Path, repeats: int) -> Dict[str, Any]:
    """Site-1 of ``case`` in this process: median seconds of one local epoch and of one validation per path's engine
    (interleaved, one torch thread, the first repeat left out), and each engine's train_loss / val_dice per repeat."""
    import torch

    from fedseg.engine.factory import build_engine
    from fedseg.objectives.base import ClientObjective, RoundContext

    torch.set_num_threads(1)  # as each simulated site has it
    site = case["sites"][0]
    datalist = json.loads((out / "site_datalists.json").read_text())[site]

    def engine(arm: str):
        cfg = json.loads(json.dumps(arms[arm]["train_config"]))
        if arm.startswith("bundle"):  # what the site adds: its dataset_dir, the bundle's writers in its workspace
            cfg["bundle_overrides"] = {**(cfg.get("bundle_overrides") or {}), "dataset_dir": str(Path(datalist).parent)}
            cfg["bundle_writers_dir"] = str(out / "profile_writers")
            return build_engine(site, None, cfg)
        return build_engine(site, datalist, cfg)

    engines = {arm: engine(arm) for arm in ARMS}
    models = {k: e.build_network() for k, e in engines.items()}
    rows = {k: {"train_s": [], "validation_s": [], "train_loss": [], "val_dice": []} for k in engines}
    extra: Dict[str, Any] = {}
    if engines["bundle"].volumes:  # where 3-D validation Dice parts: the order of softmax and Invertd
        from monai.transforms import Activationsd, AsDiscreted, Compose, Invertd

        bundle = engines["bundle"]
        as_written = bundle.validation_metrics(models["bundle"])["val_dice"]
        kept = bundle.postprocessing
        bundle.postprocessing = Compose([
            Invertd(keys="pred", transform=bundle.val_dataset.transform, orig_keys="image", nearest_interp=False, to_tensor=True),
            Activationsd(keys="pred", softmax=True),
            AsDiscreted(keys=["pred", "label"], argmax=[True, False], to_onehot=bundle.num_classes)])
        inverted_first = bundle.validation_metrics(models["bundle"])["val_dice"]
        bundle.postprocessing = kept
        extra["initial_val_dice"] = {
            "bundle_postprocessing_as_written": as_written, "bundle_invertd_before_softmax": inverted_first,
            "today_nonresident": engines["today_nonresident"].validation_metrics(models["today_nonresident"])["val_dice"]}
    for rep in range(repeats):
        for name, eng in engines.items():
            ctx = RoundContext(site, rep, repeats, train_config=eng.train_config)
            t0 = time.perf_counter()
            loss = eng.train(models[name], ClientObjective(), ctx)["train_loss"]
            t1 = time.perf_counter()
            dice = eng.validation_metrics(models[name])["val_dice"]
            t2 = time.perf_counter()
            row = rows[name]
            row["train_s"].append(t1 - t0), row["validation_s"].append(t2 - t1)
            row["train_loss"].append(loss), row["val_dice"].append(dice)
    medians = {}
    for name, r in rows.items():
        train, validation = (statistics.median(r[k][1:] or r[k]) for k in ("train_s", "validation_s"))
        medians[name] = {"train_s": train, "validation_s": validation, "site_round_s": train + validation}
    return {"site": site, "repeats": repeats, "torch_threads": 1, "medians": medians, "per_repeat": rows, **extra}


@StopOnSignal("bundle_path")  # SIGTERM / Ctrl-C end the runs it started too
def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    from fedseg.bench.bench import code_version
    from fedseg.bench.simulator import load_average, machine_info

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="runs per path (interleaved, order reversed each repeat)")
    parser.add_argument("--profile-repeats", type=int, default=6,
                        help="in-process epochs per engine of the site profile (0 = none)")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 0 is left out of the medians)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = machine_info()  # the load before the runs (this machine may be shared)
    record: Dict[str, Any] = {
        "benchmark": "bundle_path", "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/cost/bundle_path.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine, "code_version": code_version(), "method": "fedavg", "rounds": args.rounds,
        "repeats": args.repeats, "cases": {},
    }
    for name in args.cases:
        case = CASES[name]
        arms = prepare_case(name, case, out, args.rounds)
        runs: Dict[str, List[Dict[str, Any]]] = {arm: [] for arm in ARMS}
        for rep in range(args.repeats):
            for arm in (ARMS if rep % 2 == 0 else tuple(reversed(ARMS))):
                print(f"[{_dt.datetime.now():%H:%M:%S}] {name} {arm} repeat {rep}: {arms[arm]['command']}", flush=True)
                load = load_average()  # the machine's load as this run starts (it may be shared)
                row = run_arm(arms[arm]["job"], out / name / "ws" / f"{arm}_r{rep}", case["sites"],
                              out / name / "logs" / f"{arm}_r{rep}.log")
                runs[arm].append({"repeat": rep, "loadavg_at_start": load, **row})
                print(f"    rounds {' '.join(f'{w:.2f}' for w in row['round_walls'])} s; val_dice "
                      f"{' '.join(f'{d:.4f}' for d in row['val_dice'])}", flush=True)
        summary = {arm: summarise(runs[arm]) for arm in ARMS}
        today, bundle = summary["today"]["median_round_s"], summary["bundle"]
        for arm, row in summary.items():
            row["ratio_to_today"] = row["median_round_s"] / today
            # where the curves part: every path against the bundle path's, round by round
            row["diff_from_bundle"] = {key: _max_abs_diff(row[key], bundle[key]) for key in ("val_dice", "train_loss")}
        record["cases"][name] = {
            "bundle": f"bundles/{case['bundle']}", "family": case["family"], "data_profile": case["data_profile"],
            "sites": case["sites"], "sets": case["sets"],
            "commands": {arm: arms[arm]["command"] for arm in ARMS},
            # each path's job as exported (on the bundle path only bundle_overrides and the schedule reach the sites'
            # training: the bundle's own config holds the rest)
            "train_config": {arm: arms[arm]["train_config"] for arm in ARMS},
            "arms": summary, "runs": runs,
            "ratio_bundle_over_today": bundle["median_round_s"] / today,
            "ratio_bundle_over_today_nonresident": bundle["median_round_s"] / summary["today_nonresident"]["median_round_s"],
        }
        if args.profile_repeats:
            print(f"[{_dt.datetime.now():%H:%M:%S}] {name}: site profile in process", flush=True)
            record["cases"][name]["site_profile"] = site_profile(case, arms, out / name, args.profile_repeats)
    record["wall_time_s"] = time.perf_counter() - started
    # the bundles' folders as the repository names them (the record holds no machine path outside --out)
    text = json.dumps(record, indent=1, default=str).replace(str(REPO / "bundles") + "/", "bundles/")
    (out / "bundle_path.json").write_text(text)
    print(render(json.loads(text)))
    return record


def render(record: Dict[str, Any]) -> str:
    """The record as Markdown tables (the cost page's renderers: ``benchmarks/cost/render.py``)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from benchmarks.cost.render import bundle_path_rows, bundle_path_site_rows

    return "\n".join(bundle_path_rows(record) + [""] + bundle_path_site_rows(record)[0])


if __name__ == "__main__":
    main()
