"""Compare federated methods with local-only and pooled references on one scenario — a thin caller of
``fedseg bench`` (the comparison logic lives in ``fedseg.bench``; see ``fedseg bench --help``).

Scenarios (``--scenario``):
    polyp, vessel, nuclei  built-in synthetic federations (sites ``--sites``, default site-1..site-3),
                   generated under ``<out>/data`` (``fedseg bench --family``);
    retina         the real DRIVE / STARE / CHASE_DB1 benchmark as three sites (``import_retina``:
                   datalists under ``<out>/data`` point at the original files in ``--retina-root``; no pixel
                   is copied; optional ``--participants`` split), passed as ``fedseg bench --site-datalists``.

Every other option maps onto ``fedseg bench`` (``--methods`` accepts ablation rows
``LABEL=METHOD:key=value,...``; ``--seeds`` several training seeds). Outputs in ``--out``: ``results.json``,
``results.md``, ``plots/``, one ``runs/<run>.json`` per (method or reference, seed) — re-running the same
command resumes.

Usage:
    python benchmarks/accuracy/compare.py --scenario polyp --methods fedavg --rounds 15 --local-epochs 1 \\
        --image-size 64 --out /tmp/fedseg_bench/compare_polyp
    python benchmarks/accuracy/compare.py --scenario retina --retina-root $FEDSEG_DATASETS/retina_vessels \\
        --methods fedavg fedevi --rounds 20 --image-size 128 --out /tmp/fedseg_bench/compare_retina
equivalent to
    fedseg bench --family polyp --methods fedavg --rounds 15 --local-epochs 1 --image-size 64 \\
        --out /tmp/fedseg_bench/compare_polyp
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Dict, List


def bench_argv(args: argparse.Namespace, out: Path) -> List[str]:
    """The ``fedseg bench`` arguments equivalent to this script's ``args`` (imports retina data first)."""
    argv = ["bench", "--out", str(out)]
    if args.scenario == "retina":
        from fedseg.data.importers.retina import import_retina, participant_split

        if not args.retina_root:
            raise SystemExit("compare.py: --scenario retina needs --retina-root DIR (or FEDSEG_DATASETS set)")
        data_dir = out / "data"
        paths = import_retina(args.retina_root, data_dir, seed=args.seed)
        if args.participants:  # e.g. FVAC's DRIVE x3, STARE x1, CHASE_DB1 x1
            counts = {k: int(v) for k, _, v in (item.partition("=") for item in args.participants.split(","))}
            paths = participant_split(paths, counts, data_dir / "participants", seed=args.seed)
        site_map = data_dir / "retina_site_datalists.json"
        site_map.write_text(json.dumps({s: str(Path(p).resolve()) for s, p in paths.items()}, indent=1))
        argv += ["--site-datalists", str(site_map)]
    else:
        argv += ["--family", args.scenario, "--sites", *args.sites, "--data-profile", args.data_profile]
    argv += ["--methods", *args.methods, "--references", *args.references,
             "--seeds", *[str(s) for s in (args.seeds or [args.seed])], "--profile", args.profile,
             "--rounds", str(args.rounds), "--local-epochs", str(args.local_epochs), "--image-size", str(args.image_size),
             "--task-check-period", str(args.task_check_period), "--omp-threads", str(args.omp_threads)]
    if args.task_request_interval is not None:
        argv += ["--task-request-interval", str(args.task_request_interval)]
    return argv


def main(argv=None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=["fedavg"],
                        help="methods or ablation rows LABEL=METHOD:key=value,... (fedseg.bench.runs.parse_variant)")
    parser.add_argument("--scenario", choices=["polyp", "vessel", "nuclei", "retina"], default="polyp")
    data_root = os.environ.get("FEDSEG_DATASETS")
    parser.add_argument("--retina-root", default=os.path.join(data_root, "retina_vessels") if data_root else None,
                        help="the retina_vessels folder (default $FEDSEG_DATASETS/retina_vessels); retina only")
    parser.add_argument("--participants", default=None,
                        help="retina only: split domains among participants, e.g. DRIVE=3,STARE=1,CHASE_DB1=1")
    parser.add_argument("--sites", nargs="+", default=["site-1", "site-2", "site-3"], help="synthetic scenarios only")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="retina split seed, and the training seed unless --seeds")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="training seeds (default: --seed)")
    parser.add_argument("--profile", default="default", help="training profile (fedseg.config)")
    parser.add_argument("--data-profile", default="default", help="synthetic data profile (image count / source size)")
    parser.add_argument("--references", nargs="*", default=["local", "pooled"], choices=["local", "pooled"])
    parser.add_argument("--task-check-period", type=float, default=0.5, help="controller task_check_period (s)")
    parser.add_argument("--task-request-interval", type=float, default=None,
                        help="NVFlare server task_request_interval (s); default: the recipe's")
    parser.add_argument("--omp-threads", default="1", help="OMP_NUM_THREADS for the simulator ('default' = unset)")
    parser.add_argument("--out", default=None, help="output folder (default /tmp/fedseg_bench/compare_<scenario>)")
    args = parser.parse_args(argv)

    from fedseg.cli import main as fedseg_main

    out = Path(args.out or f"/tmp/fedseg_bench/compare_{args.scenario}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    fedseg_main(bench_argv(args, out))
    return json.loads((out / "results.json").read_text())


if __name__ == "__main__":
    main()
