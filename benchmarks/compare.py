"""Compare federated methods with local-only and pooled (centralised) references on one scenario.

Scenarios (``--scenario``):
    polyp, vessel  built-in synthetic federations (``generate_federation``; sites ``--sites``,
                   default site-1..site-3), generated under ``<out>/data``;
    retina         the real DRIVE / STARE / CHASE_DB1 benchmark as three sites (``import_retina``:
                   datalists under ``<out>/data`` point at the original files in ``--retina-root``;
                   no pixel is copied). DRIVE keeps its official test split (20 images); its official
                   training images are divided (seeded) into training/validation. STARE and CHASE_DB1
                   get a seeded split: test = max(1, round(0.2 n)), validation = max(1, round(0.1 n)),
                   training = the rest (CHASE_DB1 by subject, so both eyes of a child land in the same split). Images are resized on load to
                   ``--image-size`` by the bundle transforms.

Approaches:
    <method>   each FL method of ``--methods``: ``export_job(...)`` + ``nvflare simulator`` with
               threads == sites; results from ``report.json`` ``final.global`` (and
               ``final.personalized`` when the method has personalised models), i.e. the final
               global model on every site's test split;
    local      every site trains alone with the SAME engine (``SegEngine.train``), the same
               train_config and the same schedule: R calls of E local epochs (R*E epochs, Adam state
               kept across calls, the same per-round learning rate), then its final model is
               evaluated on its own test split;
    pooled     one model trained with the same engine on the union of all sites' training splits
               (R calls of E epochs over the union = the same number of epochs, ~K times the steps
               of one site), evaluated on each site's test split — the centralised upper reference.
All approaches use the final model (no checkpoint selection on validation).

Outputs in ``--out``: ``results.json`` and ``results.md`` (per-site and mean Dice / HD95 / ASSD, wall
time per round, each method's median round wall time relative to FedAvg's in the same run).

Usage:
    python benchmarks/compare.py --scenario polyp --methods fedavg --rounds 15 --local-epochs 1 \\
        --image-size 64 --out /tmp/fedseg_bench/compare_polyp
    python benchmarks/compare.py --scenario retina --retina-root /work/shared/data/retina_vessels \\
        --methods fedavg fedevi --rounds 20 --image-size 128 --out /tmp/fedseg_bench/compare_retina
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from framework_overhead import machine_info, patch_job, round_timings, run_simulator  # noqa: E402

METRICS = ("dice", "hd95", "assd")


def _clean(x: Any) -> Optional[float]:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _mean(values: List[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


# ------------------------------------------------------------------------------------------- data
def prepare_data(args: argparse.Namespace, out: Path) -> Dict[str, str]:
    """``{site: datalist path}`` for the scenario (also written to ``<out>/site_datalists.json``)."""
    data_dir = out / "data"
    if args.scenario == "retina":
        from fedseg.data.retina import import_retina

        paths = import_retina(args.retina_root, data_dir, seed=args.seed)
        if getattr(args, "participants", None):  # e.g. FVAC's DRIVE x3, STARE x1, CHASE_DB1 x1
            from fedseg.data.retina import participant_split

            counts = {k: int(v) for k, _, v in (item.partition("=") for item in args.participants.split(","))}
            paths = participant_split(paths, counts, data_dir / "participants", seed=args.seed)
    else:
        from fedseg.data.synthetic import generate_federation

        paths = generate_federation(args.scenario, args.sites, data_dir, seed=args.seed, profile=args.data_profile)
    mapping = {site: str(Path(p).resolve()) for site, p in paths.items()}
    (out / "site_datalists.json").write_text(json.dumps(mapping, indent=1))
    return mapping


def pooled_datalist(mapping: Dict[str, str], out: Path) -> Path:
    """A datalist whose splits are the unions of the sites' splits (absolute paths, nothing copied)."""
    from fedseg.data.datalist import load_datalist, write_json_atomic

    union: Dict[str, List[Dict[str, Any]]] = {"training": [], "validation": [], "test": []}
    for site, path in mapping.items():
        splits = load_datalist(path, check_files=False)
        for split, entries in splits.items():
            # image + label only: extra keys that only some sites have (e.g. retina "fov") break batch collation
            union[split] += [{"image": e["image"], "label": e["label"]} for e in entries]
    return write_json_atomic(out / "data" / "pooled" / "datalist.json",
                             {"name": "pooled", "sites": list(mapping), **union})


def data_summary(mapping: Dict[str, str]) -> Dict[str, Dict[str, Any]]:
    from fedseg.data.datalist import load_datalist

    out = {}
    for site, path in mapping.items():
        splits = load_datalist(path, check_files=False)
        raw = json.loads(Path(path).read_text())
        out[site] = {s: len(v) for s, v in splits.items()}
        if raw.get("split_rule"):
            out[site]["split_rule"] = raw["split_rule"]
    return out


# ------------------------------------------------------------------------------------- references
def train_config(args: argparse.Namespace) -> Dict[str, Any]:
    from fedseg.config import resolve_profile

    overrides = {"image_size": args.image_size, "local_epochs": args.local_epochs, "seed": args.seed}
    if args.scenario != "retina":
        overrides["data_family"] = args.scenario
    return resolve_profile(args.profile, None, args.rounds, **overrides)["train_config"]


def train_reference(name: str, datalist: str, cfg: Dict[str, Any], rounds: int):
    """R calls of ``engine.train`` (E epochs each) on one datalist; returns (engine, model, seconds)."""
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import ClientObjective, RoundContext

    engine = SegEngine(name, datalist, cfg)
    model = engine.build_network()
    objective = ClientObjective()
    started = time.perf_counter()
    losses = []
    for r in range(rounds):
        ctx = RoundContext(site=name, round=r, total_rounds=rounds, train_config=cfg)
        losses.append(engine.train(model, objective, ctx)["train_loss"])
    return engine, model, time.perf_counter() - started, losses


def evaluate_on_sites(model, mapping: Dict[str, str], cfg: Dict[str, Any], engines: Dict[str, Any]) -> Dict[str, Dict[str, Optional[float]]]:
    from fedseg.engine.engine import SegEngine

    out = {}
    for site, path in mapping.items():
        if site not in engines:
            engines[site] = SegEngine(site, path, cfg)
        metrics = engines[site].evaluate(model, "test")
        out[site] = {k: _clean(metrics.get(k)) for k in METRICS}
    return out


def run_local(mapping: Dict[str, str], cfg: Dict[str, Any], rounds: int) -> Dict[str, Any]:
    per_site, seconds, losses = {}, {}, {}
    for site, path in mapping.items():
        engine, model, secs, loss = train_reference(site, path, cfg, rounds)
        metrics = engine.evaluate(model, "test")
        per_site[site] = {k: _clean(metrics.get(k)) for k in METRICS}
        seconds[site], losses[site] = secs, loss
        print(f"    local {site}: dice {per_site[site]['dice']:.3f} ({secs:.1f}s)", flush=True)
    return {"final": per_site, "train_seconds": seconds, "total_train_seconds": sum(seconds.values()),
            "train_loss_first_last": {s: [l[0], l[-1]] for s, l in losses.items()}}


def run_pooled(mapping: Dict[str, str], cfg: Dict[str, Any], rounds: int, out: Path) -> Dict[str, Any]:
    path = pooled_datalist(mapping, out)
    _, model, secs, losses = train_reference("pooled", str(path), cfg, rounds)
    per_site = evaluate_on_sites(model, mapping, cfg, {})
    print(f"    pooled: mean dice {_mean([m['dice'] for m in per_site.values()]):.3f} ({secs:.1f}s)", flush=True)
    return {"final": per_site, "total_train_seconds": secs, "train_loss_first_last": [losses[0], losses[-1]]}


# ----------------------------------------------------------------------------------------- methods
def parse_variant(spec: str) -> Tuple[str, str, Dict[str, Any]]:
    """``fedavg`` or ``LABEL=METHOD:key=value,key=value`` (an ablation row) -> (label, method, recipe kwargs).

    Values are read as JSON where possible (numbers, true/false, null), else kept as strings, e.g.
    ``graph_only=graphfedseg:gamma=0,lam=0`` or ``fvac_beta0.5=fvac:beta=0.5``.
    """
    label, _, rest = spec.partition("=") if "=" in spec.split(":")[0] else (spec.split(":")[0], "", spec)
    method, _, options = (rest or spec).partition(":")
    kwargs: Dict[str, Any] = {}
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return label or method, method, kwargs


def _median_task_times(rounds: List[Dict[str, Any]]) -> Dict[str, float]:
    """Median over rounds of ``report.json``'s per-round ``task_times`` (absent in older reports)."""
    names = sorted({t for r in rounds for t in (r.get("task_times") or {})})
    return {t: statistics.median([r["task_times"][t] for r in rounds if t in (r.get("task_times") or {})]) for t in names}


def run_method(spec: str, args: argparse.Namespace, mapping: Dict[str, str], out: Path) -> Dict[str, Any]:
    from fedseg.cli import export_job

    label, method, variant_args = parse_variant(spec)
    sites = list(mapping)
    overrides = {"image_size": args.image_size, "local_epochs": args.local_epochs, "seed": args.seed, **variant_args}
    if args.scenario != "retina":
        overrides["data_family"] = args.scenario
    job = export_job(
        method, out / "jobs" / label, args.profile, num_rounds=args.rounds,
        script_args=f"--site_datalists {out / 'site_datalists.json'}", min_clients=len(sites),
        task_check_period=args.task_check_period, **overrides,
    )
    patch_job(job, args.task_request_interval)
    res = run_simulator(job, out / "workspaces" / label, sites, threads=len(sites), omp_threads=args.omp_threads,
                        log_path=out / "logs" / f"{label}.log")
    report = res["report"]
    timings = round_timings(report)
    walls = [r["wall"] for r in timings]
    entry: Dict[str, Any] = {
        "method": method,
        "variant_args": variant_args,
        "command": res["command"],
        "report_path": res["report_path"],
        "job_total_seconds": res["total_wall_s"],
        "median_round_wall": statistics.median(walls[1:] if len(walls) > 1 else walls),
        "median_round_max_compute": statistics.median(
            [r["max_compute"] for r in timings[1:] if "max_compute" in r] or [float("nan")]),
        "round_walls": walls,
        # per task (train, and a method's extra task such as evaluate_surrogate): sending to last answer
        "median_task_times": _median_task_times(report["rounds"][1:] or report["rounds"]),
        "val_dice_per_round": [
            _mean([_clean(m.get("val_dice")) for m in r["metrics"].values()]) for r in report["rounds"]
        ],
    }
    for which in ("global", "personalized"):
        final = (report.get("final") or {}).get(which)
        if final:
            entry[which] = {s: {k: _clean(final[s].get(k)) for k in METRICS} for s in sites if s in final}
    g = entry.get("global", {})
    print(f"    {label}: mean dice {_mean([m['dice'] for m in g.values()]):.3f}, round wall "
          f"{entry['median_round_wall']:.2f}s, job {res['total_wall_s']:.1f}s", flush=True)
    return entry


# ----------------------------------------------------------------------------------------- report
def _cell(m: Dict[str, Optional[float]]) -> str:
    f = lambda v, d: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    return f"{f(m.get('dice'), 3)} / {f(m.get('hd95'), 2)} / {f(m.get('assd'), 2)}"


def markdown(results: Dict[str, Any]) -> str:
    sites = results["sites"]
    lines = [
        f"Scenario **{results['scenario']}**, sites {', '.join(sites)}; {results['rounds']} rounds x "
        f"{results['local_epochs']} local epoch(s), image size {results['image_size']}, seed {results['seed']}. "
        "Cells: Dice / HD95 / ASSD (pixels, at the training resolution) on each site's test split; mean = unweighted "
        "mean over sites.",
        "",
        "| approach | " + " | ".join(sites) + " | mean |",
        "|---" * (len(sites) + 2) + "|",
    ]
    rows = []
    for method, entry in results["methods"].items():
        rows.append((f"{method} (global)", entry.get("global", {})))
        if entry.get("personalized"):
            rows.append((f"{method} (personalised)", entry["personalized"]))
    for ref, entry in results["references"].items():
        rows.append(({"local": "local-only", "pooled": "pooled (centralised)"}.get(ref, ref), entry["final"]))
    for name, per_site in rows:
        mean = {k: _mean([per_site.get(s, {}).get(k) for s in sites]) for k in METRICS}
        lines.append(f"| {name} | " + " | ".join(_cell(per_site.get(s, {})) for s in sites) + f" | {_cell(mean)} |")
    lines += ["", "| approach | median round wall (s) | relative to FedAvg | median max site compute / round (s) | "
              "mean val Dice round 1 -> last | total (s) | median time per task (s) |", "|---|---|---|---|---|---|---|"]
    base = results["methods"].get("fedavg", {}).get("median_round_wall")
    for method, entry in results["methods"].items():
        rel = f"{entry['median_round_wall'] / base:.2f}x" if base else "-"
        vd = entry["val_dice_per_round"]
        lines.append(f"| {method} | {entry['median_round_wall']:.2f} | {rel} | {entry['median_round_max_compute']:.2f} | "
                     f"{vd[0]:.3f} -> {vd[-1]:.3f} | {entry['job_total_seconds']:.1f} (simulator job) | "
                     + ", ".join(f"{t} {v:.2f}" for t, v in entry.get("median_task_times", {}).items()) + " |")
    for ref, entry in results["references"].items():
        lines.append(f"| {ref} | - | - | - | - | {entry['total_train_seconds']:.1f} (training, in-process, sequential) | - |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=["fedavg"],
                        help="methods or ablation rows LABEL=METHOD:key=value,... (see parse_variant)")
    parser.add_argument("--scenario", choices=["polyp", "vessel", "retina"], default="polyp")
    parser.add_argument("--retina-root", default=os.environ.get("FEDSEG_RETINA_ROOT", "/work/shared/data/retina_vessels"))
    parser.add_argument("--participants", default=None,
                        help="retina only: split domains among participants, e.g. DRIVE=3,STARE=1,CHASE_DB1=1 "
                             "(fedseg.data.retina.participant_split after import_retina)")
    parser.add_argument("--sites", nargs="+", default=["site-1", "site-2", "site-3"], help="synthetic scenarios only")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="default", help="training profile (fedseg.config)")
    parser.add_argument("--data-profile", default="default", help="synthetic data profile (image count / source size)")
    parser.add_argument("--references", nargs="*", default=["local", "pooled"], choices=["local", "pooled"])
    parser.add_argument("--task-check-period", type=float, default=0.5, help="controller task_check_period (s)")
    parser.add_argument("--task-request-interval", type=float, default=None,
                        help="NVFlare server task_request_interval (s); default: NVFlare's (2 s)")
    parser.add_argument("--omp-threads", default="1", help="OMP_NUM_THREADS for the simulator ('default' = unset)")
    parser.add_argument("--out", default=None, help="output folder (default /tmp/fedseg_bench/compare_<scenario>)")
    args = parser.parse_args(argv)

    out = Path(args.out or f"/tmp/fedseg_bench/compare_{args.scenario}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    mapping = prepare_data(args, out)
    cfg = train_config(args)
    results: Dict[str, Any] = {
        "benchmark": "compare",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python " + " ".join([sys.argv[0]] + (list(argv) if argv is not None else sys.argv[1:])),
        "machine": machine_info(),
        "scenario": args.scenario, "sites": list(mapping), "rounds": args.rounds, "local_epochs": args.local_epochs,
        "image_size": args.image_size, "seed": args.seed, "profile": args.profile, "train_config": cfg,
        "job_settings": {"task_check_period": args.task_check_period, "task_request_interval": args.task_request_interval,
                         "omp_threads": args.omp_threads, "simulator_threads": len(mapping)},
        "data": data_summary(mapping),
        "methods": {}, "references": {},
    }
    save = lambda: (out / "results.json").write_text(json.dumps(results, indent=1))  # noqa: E731 - partial results survive a failure
    for spec in args.methods:
        label = parse_variant(spec)[0]
        print(f"[{_dt.datetime.now():%H:%M:%S}] {label} ...", flush=True)
        results["methods"][label] = run_method(spec, args, mapping, out)
        save()
    if args.references:
        import torch

        if args.omp_threads not in (None, "", "default"):
            torch.set_num_threads(int(args.omp_threads))
        results["references_torch_threads"] = torch.get_num_threads()
    if "local" in args.references:
        print(f"[{_dt.datetime.now():%H:%M:%S}] local-only ...", flush=True)
        results["references"]["local"] = run_local(mapping, cfg, args.rounds)
        save()
    if "pooled" in args.references:
        print(f"[{_dt.datetime.now():%H:%M:%S}] pooled ...", flush=True)
        results["references"]["pooled"] = run_pooled(mapping, cfg, args.rounds, out)

    save()
    md = markdown(results)
    (out / "results.md").write_text(md)
    print("\n" + md)
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}")
    return results


if __name__ == "__main__":
    main()
