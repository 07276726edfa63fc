"""``fedseg`` command line: data, job export, simulator runs, method comparison, run summaries, inference.

    fedseg data synth   --family polyp --sites site-1 site-2 site-3 --out DIR
    fedseg data retina  [--src DIR] --out DIR           --src defaults to $FEDSEG_DATASETS/retina_vessels
    fedseg data nuclei  [--src DIR] --out DIR --layout source|organ        ($FEDSEG_DATASETS/nuclei_he)
    fedseg data odoc    [--src DIR] --out DIR [--task fundus|prostate]     ($FEDSEG_DATASETS/odoc_prostate_samples)
    fedseg data dca1    [--src DIR] --out DIR [--sites DCA1]               ($FEDSEG_DATASETS/xray_angio)
    fedseg data foundation --out DIR [--retina DIR --nuclei DIR --arcade DIR] --unseen 1.0 --sites 3
    fedseg export       [--method fedavg | --all] [--profile default] [--out jobs] [--checkpoint-dir ABS] [--task-timeout S]
                        [--task-request-interval S] [--family F] [--labels-from DATALIST] [--set key=value ...]
    fedseg run METHOD   [-n 3] [-w WORKSPACE] [--profile default] [--rounds R] [--site-datalists FILE]
                        [--seed S] [--set key=value ...]
    fedseg bench        --out DIR (--site-datalists FILE | --family polyp --sites ...) --methods fedavg fedevi ...
                        [--references local pooled] [--seeds 0 1 2] [--rounds R] [--local-epochs E] [--set key=value ...]
    fedseg summarise    WORKSPACE_OR_REPORT
    fedseg stats        (--site-datalists FILE | --family polyp -n 3) [--out DIR] [--split training] [--min-count 10]
    fedseg infer        --checkpoint CKPT --input DIR --output DIR [--bundle bundles/unetr_seg] [--largest-component]
                        [--stitch-device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from fedseg.processes import StopOnSignal
from fedseg.recipes.export import export_job

#: built-in synthetic families (== fedseg.data.synthetic.FAMILIES, checked by a test; kept literal so that
#: building the parser does not import numpy/scipy)
FAMILY_CHOICES = ("polyp", "vessel", "nuclei", "xray", "fundus")
#: built-in volume families (== fedseg.data.synthetic.volumes.VOLUME_FAMILIES)
VOLUME_FAMILY_CHOICES = ("prostate3d",)


def _src_help(folder: str) -> str:
    """``--src`` help of a real-data importer (the importer resolves the default: fedseg.data.importers.sources)."""
    return f"folder with manifest.csv (default: $FEDSEG_DATASETS/{folder}; FEDSEG_DATASETS is the folder holding {folder}/)"


def find_reports(path: os.PathLike) -> List[Path]:
    """``path`` itself if it is a report, else every ``report.json`` below it (newest last)."""
    path = Path(path)
    if path.is_file():
        return [path]
    return sorted(path.rglob("report.json"), key=lambda p: p.stat().st_mtime)


def _cmd_data(args: argparse.Namespace) -> None:
    try:
        if args.data_cmd == "check":
            _check_data(args)
            return
        _import_data(args)
    except ValueError as e:  # DatalistError (naming the file) or a bad option value
        raise SystemExit(f"fedseg data {args.data_cmd}: {e}") from None


def _check_data(args: argparse.Namespace) -> None:
    """``fedseg data check DATALIST``: every problem with the datalist and its files, or a one-line OK."""
    from fedseg.data.checks import check_datalist

    for path in args.datalists:
        out = check_datalist(path, allow_external_paths=True if args.allow_external_paths else None, decode=not args.headers_only)
        counts = ", ".join(f"{s} {n}" for s, n in out["counts"].items())
        print(f"OK {out['datalist']}: {counts}; {out['files']} files checked; label space {out['label_space'].describe()}")


def _import_data(args: argparse.Namespace) -> None:
    if args.data_cmd == "synth" and args.layout != "datalist":
        from fedseg.data.synthetic.layouts import write_layout_federation

        if args.participants:  # participants are datalists over shared files; a bundle layout is one folder per site
            raise ValueError("--participants needs --layout datalist")
        # each site folder also gets a datalist of its files, so the folders serve --site-datalists as well
        paths = write_layout_federation(args.family, args.sites, args.out, layout=args.layout, seed=args.seed,
                                        profile=args.profile)
        print(f"site -> bundle overrides: {Path(args.out) / 'site_overrides.json'} "
              "(pass it to `fedseg run --bundle DIR --site-overrides`)")
    elif args.data_cmd == "synth":
        from fedseg.data.synthetic import generate_federation

        paths = generate_federation(args.family, args.sites, args.out, seed=args.seed, profile=args.profile)
    elif args.data_cmd == "nuclei":
        from fedseg.data.importers.nuclei import import_nuclei

        paths = import_nuclei(
            args.src, args.out, layout=args.layout, seed=args.seed, val_fraction=args.val_fraction,
            test_fraction=args.test_fraction, organs=args.organs, min_images=args.min_images, log=print,
        )
    elif args.data_cmd == "odoc":
        from fedseg.data.importers.odoc import import_odoc

        paths = import_odoc(args.src, args.out, task=args.task, sites=args.sites, seed=args.seed,
                            val_fraction=args.val_fraction, log=print)
    elif args.data_cmd == "dca1":
        from fedseg.data.importers.xray_angio import import_dca1

        paths = import_dca1(
            args.src, args.out, sites=args.sites, seed=args.seed, val_fraction=args.val_fraction,
            test_fraction=args.test_fraction,
        )
    elif args.data_cmd == "foundation":
        from fedseg.data.importers.foundation import build_foundation

        if args.sites < 1:
            raise ValueError(f"--sites must be at least 1, got {args.sites}")
        paths = build_foundation(
            args.out, [f"silo-{k + 1}" for k in range(args.sites)], unseen=args.unseen, seed=args.seed,
            retina=args.retina, nuclei=args.nuclei, arcade=args.arcade, xray_scanners=args.xray_scanners,
            profile=args.profile, n_per_class=args.n_per_class, log=print,
        )
        print(f"label space and assignment: {Path(args.out) / 'label_space.json'}")
    else:
        from fedseg.data.importers.retina import DEFAULT_RESCALE, import_retina

        rescale = dict(DEFAULT_RESCALE)
        if args.rescale is not None:
            rescale = {k: float(v) for k, _, v in (item.partition("=") for item in args.rescale.split(",") if item)}
        paths = import_retina(args.src, args.out, seed=args.seed, rescale=rescale)
    if getattr(args, "participants", None):
        from fedseg.data.importers.retina import participant_split

        counts = dict((k, int(v)) for k, v in (item.split("=") for item in args.participants.split(",")))
        paths = participant_split(paths, counts, Path(args.out) / "participants", seed=args.seed)
    mapping = {site: str(Path(p).resolve()) for site, p in paths.items()}
    index = Path(args.out) / "site_datalists.json"
    index.write_text(json.dumps(mapping, indent=1))
    for site, p in mapping.items():
        print(f"{site}: {p}")
    print(f"site -> datalist map: {index} (pass it to `fedseg run --site-datalists`)")


def _cmd_export(args: argparse.Namespace) -> None:
    from fedseg.recipes import available_methods

    methods = available_methods() if args.all else [args.method]
    job_options = {}
    if args.checkpoint_dir:
        if not os.path.isabs(args.checkpoint_dir):
            raise SystemExit(f"fedseg export: --checkpoint-dir must be an absolute path on the server, got {args.checkpoint_dir!r}")
        job_options["checkpoint_dir"] = args.checkpoint_dir
    if args.task_timeout is not None:
        if args.task_timeout < 0:
            raise SystemExit(f"fedseg export: --task-timeout must be >= 0 seconds, got {args.task_timeout}")
        job_options["task_timeout"] = args.task_timeout
    if args.task_request_interval is not None:
        job_options["task_request_interval"] = args.task_request_interval
    if args.server_optimizer != "none":
        job_options.update(server_optimizer=args.server_optimizer, server_lr=args.server_lr,
                           server_momentum=args.server_momentum)
    if args.bundle:
        overrides, script_args, _ = _bundle_sets(args, "export")
        if script_args:
            job_options["script_args"] = script_args
    else:
        overrides = _train_sets(args.set)
    if args.family:
        overrides["data_family"] = args.family
    if args.labels_from:
        # the job's label space as a datalist declares it (only its top-level fields are read: the operator exporting
        # a job for real sites may hold a template rather than the sites' data); every site checks its own against it
        from fedseg.data.datalist import DatalistError
        from fedseg.data.checks import federation_label_config

        from fedseg.data.volumes import federation_volume_config

        source = {"--labels-from": str(Path(args.labels_from).resolve())}
        try:  # and, for volumes, the volume settings (spacing, modality, channels) it declares
            fields = {**federation_label_config(source, explicit=overrides), **federation_volume_config(source, explicit=overrides)}
        except (DatalistError, ValueError) as e:
            raise SystemExit(f"fedseg export: {e}") from None
        overrides.update({k: v for k, v in fields.items() if overrides.get(k) is None})
    elif args.family:
        overrides.update(_preflight(None, args.family, overrides, "export", _profile_data(args.profile)))
    job_options.update(overrides)
    for method in methods:
        try:
            print(f"exported {method} -> {export_job(method, args.out, args.profile, **job_options)}")
        except ValueError as e:
            raise SystemExit(f"fedseg export: {e}") from e


def _train_sets(items: Optional[List[str]]) -> dict:
    """``--set key=value`` items as train_config overrides; exits with a clear message on an unknown key."""
    from fedseg.bench.runs import parse_sets

    try:
        return parse_sets(items)
    except ValueError as e:
        raise SystemExit(f"fedseg: {e}") from None


def _cmd_run(args: argparse.Namespace) -> None:
    if args.bundle:
        return _run_bundle(args)
    sets = _train_sets(args.set)  # before anything is exported or started
    workspace = Path(args.workspace or Path("workspaces") / args.method).resolve()
    overrides = dict(sets)
    if args.family:
        overrides["data_family"] = args.family
    if args.image_size:
        overrides["image_size"] = args.image_size
    if args.local_epochs:
        overrides["local_epochs"] = args.local_epochs
    if args.seed is not None:
        overrides["seed"] = args.seed
    script_args = f"--site_datalists {Path(args.site_datalists).resolve()}" if args.site_datalists else ""
    sites = None
    mapping = None
    if args.site_datalists:
        src = Path(args.site_datalists).resolve()
        mapping = {s: str((src.parent / p).resolve()) for s, p in json.loads(src.read_text()).items()}
        sites = sorted(mapping)
        if "spatial_mode" not in overrides:
            from fedseg.data.datalist import common_spatial_mode

            mode = common_spatial_mode(mapping.values())
            if mode:  # recorded in the job's train_config, so the checkpoint says how to run the model
                overrides["spatial_mode"] = mode
    overrides.update(_preflight(mapping, overrides.get("data_family"), overrides, "run", _profile_data(args.profile)))
    with tempfile.TemporaryDirectory(prefix="fedseg_job_") as tmp:
        from fedseg.fl.homomorphic import simulator_he_options

        try:
            job = export_job(
                args.method, tmp, args.profile, num_rounds=args.rounds, script_args=script_args,
                min_clients=min(len(sites) if sites else args.n_clients, args.n_clients), **overrides,
                **(simulator_he_options(Path(tmp), args.he_layers) if args.he else {}),
            )
        except ValueError as e:  # e.g. a method that refuses homomorphic aggregation: one line
            raise SystemExit(f"fedseg run: {e}") from None
        rc = _simulate(job, workspace, sites, args.n_clients)
    if rc != 0:
        sys.exit(rc)
    reports = find_reports(workspace)
    if not reports:
        sys.exit(f"simulator finished but wrote no report.json under {workspace}")
    _print_summary(reports[-1])


def _simulate(job: os.PathLike, workspace: Path, sites: Optional[List[str]], n_clients: int) -> int:
    """``nvflare simulator`` on ``job`` in ``workspace`` (its allow list written first: jobs carry no code) with the
    named ``sites``, else ``n_clients`` sites; its exit status."""
    from fedseg.fl.component_policy import prepare_simulator_workspace

    prepare_simulator_workspace(workspace)
    cmd = ["nvflare", "simulator", str(job), "-w", str(workspace), "-t", str(len(sites) if sites else n_clients)]
    cmd += ["-c", ",".join(sites)] if sites else ["-n", str(n_clients)]
    print(" ".join(cmd), flush=True)
    # several site processes share this machine: one torch thread each unless told otherwise
    env = {**os.environ}
    env.setdefault("FEDSEG_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", env["FEDSEG_NUM_THREADS"])
    return subprocess.call(cmd, env=env)


def _bundle_sets(args: argparse.Namespace, command: str) -> tuple:
    """``--bundle DIR --site-overrides FILE --set ID=VALUE``: ``(train overrides, sites' script arguments, sites)``,
    checked before anything starts (``fedseg.recipes.job_options.bundle_options``); exits with one line."""
    from fedseg.bench.runs import parse_assignments
    from fedseg.recipes.job_options import bundle_options

    try:
        return bundle_options(args.bundle, getattr(args, "site_overrides", None), parse_assignments(args.set))
    except (ValueError, KeyError) as e:
        raise SystemExit(f"fedseg {command}: {e}") from None


def _run_bundle(args: argparse.Namespace) -> None:
    """``fedseg run METHOD --bundle DIR``: the method on a user's MONAI bundle in NVFlare's simulator; the sites are
    ``--site-overrides``' keys (else ``-n``). A run that fails leaves no report a retry or ``fedseg summarise`` would
    take for a finished one: an earlier run's ``report.json`` in the workspace is removed first, and only a finished
    job writes one."""
    overrides, script_args, sites = _bundle_sets(args, "run")
    for key, value in (("local_epochs", args.local_epochs), ("seed", args.seed)):
        if value is not None:
            overrides[key] = value
    workspace = Path(args.workspace or Path("workspaces") / args.method).resolve()
    n_sites = len(sites) if sites else args.n_clients
    with tempfile.TemporaryDirectory(prefix="fedseg_job_") as tmp:
        try:
            job = export_job(args.method, tmp, args.profile, num_rounds=args.rounds, script_args=script_args,
                             min_clients=n_sites, **overrides)
        except ValueError as e:
            raise SystemExit(f"fedseg run: {e}") from None
        for stale in find_reports(workspace) if workspace.is_dir() else []:
            stale.unlink()  # an earlier run's report would pass for this run's if this one fails
        rc = _simulate(job, workspace, sites, n_sites)
    reports = find_reports(workspace)
    if rc != 0 or not reports:
        sys.exit(f"fedseg run: the simulator {'failed (exit ' + str(rc) + ')' if rc else 'wrote no report.json'}; the sites' "
                 f"logs under {workspace} say why")
    _print_summary(reports[-1])


def _preflight(mapping: Optional[dict], family: Optional[str], overrides: dict, command: str,
               data_profile: Optional[str] = None) -> dict:
    """Check every site's datalist (or the built-in family) before a job starts; the label-space (and, for volumes,
    volume) ``train_config`` fields the job needs (``fedseg.recipes.job_options.federation_fields``). Exits with every
    problem named."""
    from fedseg.data.datalist import DatalistError
    from fedseg.recipes.job_options import federation_fields

    try:
        return federation_fields(mapping, family, overrides, data_profile)
    except (DatalistError, ValueError) as e:
        raise SystemExit(f"fedseg {command}: {e}") from None


def _profile_data(profile: str) -> Optional[str]:
    """The built-in data profile a training profile generates (``tiny`` -> ``tiny``, else ``default``)."""
    from fedseg.recipes.job_options import profile_data

    return profile_data(profile)


def _print_rows(headers: List[str], rows: List[List[str]]) -> None:
    """A final table on the terminal: the site column, then right-aligned values (``*`` marks dropped)."""
    print(f"{headers[0]:<14}" + "".join(f"{h:>19}" for h in headers[1:]))
    for row in rows:
        print(f"{row[0].strip('*'):<14}" + "".join(f"{c:>19}" for c in row[1:]))


def _print_summary(report_path: Path) -> None:
    from fedseg.fl.report import final_tables, summarise, validation_metric
    from fedseg.plots.report_plots import plot_report

    data = json.loads(Path(report_path).read_text())
    out = Path(report_path).parent
    figures = plot_report(data, out / "plots", validation_metric(data))
    (out / "summary.md").write_text(summarise(data, figures, base=out))
    for table in final_tables(data):
        print(f"\n{data['method']} — {table.title} (test split)")
        _print_rows(table.headers, table.rows)
        if table.structure_rows:
            print(f"\nper class and region ({table.which} model)")
            _print_rows(table.structure_headers, table.structure_rows)
    print(f"\nreport:  {report_path}\nsummary: {out / 'summary.md'}\nplots:   {out / 'plots'}")
    models = model_checkpoints(data, out)
    if models["global"] is None and (data.get("config") or {}).get("he"):
        # homomorphic aggregation: the server holds ciphertexts; the sites decrypted the final model they evaluated
        print(f"global model: encrypted on the server ({out / 'FL_global_model.he.pt'}); each site keeps the decrypted "
              "one in <site workspace>/fedseg_outputs/<site>/global_model.pt")
        for path in sorted(out.parents[1].glob("*/fedseg_outputs/*/global_model.pt")):  # the simulator's sites
            print(f"  {path}")
    elif models["global"] is None:
        print("global model: no FL_global_model.pt in this run directory (copied report?)")
    else:
        print(f"global model: {models['global']}")
    if (data.get("final") or {}).get("best_val_checkpoint"):
        print(f"best validation round's model: {out / data['final']['best_val_checkpoint']}")
    for site, path in models["personalized"].items():
        print(f"personalised model of {site}: {path}")
    task = (data.get("config") or {}).get("train_config", {}).get("task")
    if models["global"] is not None and task != "classification":
        bundle = (data.get("config") or {}).get("train_config", {}).get("bundle")
        from fedseg.bundle import is_bundle_path

        extra = f" --bundle {bundle}" if is_bundle_path(bundle) else f" --bundle bundles/{bundle}" if bundle else ""
        print(f"segment new scans with it:\n  fedseg infer --checkpoint {models['global']} --input NEW_SCANS/ --output MASKS/{extra}")


def model_checkpoints(data: dict, run_dir: Path) -> dict:
    """Where a run's models are: ``{"global": path or None, "personalized": {site: path}}``.

    NVFlare's persistor writes the global model into the server app's folder (``<run dir>/app_server/
    FL_global_model.pt``: ``WS/server/simulate_job/app_server/`` in the simulator); the controller writes the
    personalised models next to the report (``report.json``'s ``final.personalized_checkpoints``, relative paths).
    """
    run_dir = Path(run_dir)
    expected = run_dir / "app_server" / "FL_global_model.pt"
    found = [expected] if expected.is_file() else sorted(run_dir.rglob("FL_global_model.pt"))
    personalized = ((data.get("final") or {}).get("personalized_checkpoints") or {})
    return {"global": found[0] if found else None,
            "personalized": {site: run_dir / rel for site, rel in sorted(personalized.items())}}


def _cmd_bench(args: argparse.Namespace) -> None:
    from fedseg.bench.bench import run_bench
    from fedseg.bench.runs import Budget

    if args.bundle:  # a user's bundle: its sites are --site-overrides' keys; methods only
        if not args.site_overrides:
            raise SystemExit("fedseg bench: --bundle needs --site-overrides FILE (site -> {config id: value})")
        if args.site_datalists or args.family:
            raise SystemExit("fedseg bench: --bundle reads its data from the bundle; drop --site-datalists / --family")
        sets, _, _ = _bundle_sets(args, "bench")
        if args.references == ["local", "pooled"]:  # the default: references train on datalists
            args.references = []
    else:
        sets = _train_sets(args.set)
    if args.image_size:
        sets["image_size"] = args.image_size
    if not args.bundle and not args.site_datalists and not args.family:
        args.family = "polyp"
    if not args.bundle and (args.site_datalists or args.family != "xray_foundation"):
        from fedseg.bench.bench import read_site_datalists

        mapping = read_site_datalists(args.site_datalists) if args.site_datalists else None
        sets.update(_preflight(mapping, args.family, sets, "bench", args.data_profile))
    try:
        protocol = None
        if args.profile == "paper" or args.protocol:
            # the local recipe belongs to the comparison: every method of the bench trains with one protocol
            from fedseg.bench.runs import parse_variant
            from fedseg.recipes import comparison_protocol

            protocol = comparison_protocol([parse_variant(m)[1] for m in args.methods], args.protocol)
            print(f"fedseg bench: every method trains with the local protocol of {protocol}'s paper profile")
        budget = Budget(profile=args.profile, rounds=args.rounds, local_epochs=args.local_epochs, sets=sets,
                        task_check_period=args.task_check_period, task_request_interval=args.task_request_interval,
                        omp_threads=args.omp_threads, protocol=protocol, task_timeout=args.task_timeout)
        run_bench(args.out, methods=args.methods, references=args.references, seeds=args.seeds,
                  site_datalists=args.site_datalists, family=args.family, sites=args.sites,
                  data_profile=args.data_profile, data_seed=args.data_seed, budget=budget,
                  command="fedseg " + " ".join(args.argv or []), baseline=args.baseline, refresh=args.refresh,
                  reuse=args.reuse, parallel=args.parallel, simulator_timeout=args.simulator_timeout,
                  site_overrides=str(Path(args.site_overrides).resolve()) if args.bundle else None,
                  site_statistics=args.site_stats)
    except ValueError as e:
        raise SystemExit(f"fedseg bench: {e}") from None


def _cmd_stats(args: argparse.Namespace) -> None:
    """``fedseg stats``: NVFlare's federated statistics of every site's images and labels in its simulator, then the
    per-site table and the site distances (``stats.json``, ``stats.md`` under ``--out``)."""
    from fedseg.data.datalist import DatalistError
    from fedseg.fl.fed_statistics import run_fedstats
    from fedseg.fl.site_statistics import family_intensity_range

    if args.export_job:
        _stats_export(args)
        return
    if args.bundle:
        _stats_bundle(args)
        return
    out = Path(args.out).resolve()
    try:
        if args.site_datalists:
            src = Path(args.site_datalists).resolve()
            mapping = {s: str((src.parent / p).resolve()) for s, p in json.loads(src.read_text()).items()}
        else:
            from fedseg.data.synthetic import generate_federation

            sites = [f"site-{k + 1}" for k in range(args.n_clients)]
            mapping = {s: str(p) for s, p in generate_federation(args.family, sites, out / "data", seed=args.data_seed,
                                                                  profile=args.data_profile).items()}
        value_range = _stats_intensity_range(args.intensity_range, args.site_datalists and mapping,
                                             family_intensity_range(args.family))
        report = run_fedstats(
            mapping, out, header=_stats_header(args, mapping), split=args.split, intensity_bins=args.intensity_bins,
            intensity_range=value_range,
            fraction_bins=args.fraction_bins, min_count=args.min_count, max_bins_percent=args.max_bins_percent,
            data_family=args.family or "polyp", min_sites=args.min_sites, site_wait=args.site_wait,
        )
    except (DatalistError, ValueError, KeyError, RuntimeError, OSError) as e:
        raise SystemExit(f"fedseg stats: {e}") from None
    _stats_print(report, out)


def _stats_print(report: dict, out: Path) -> None:
    """``stats.md``, then one line: the sites the statistics are of, those that sent nothing, where the report is."""
    print((out / "stats.md").read_text())
    dropped = f" ({', '.join(report['dropped_sites'])} sent nothing)" if report["dropped_sites"] else ""
    print(f"statistics of {', '.join(report['sites'])}{dropped}: {out / 'stats.json'}, {out / 'stats.md'}")


def _stats_bundle(args: argparse.Namespace) -> None:
    """``fedseg stats --bundle DIR --site-overrides FILE``: the statistics of each site's training images after the
    bundle's own preprocessing (what its network sees); the sites are the file's keys, checked first as ``fedseg run
    --bundle`` checks them (every id the bundle's, every site with training images)."""
    from fedseg.data.datalist import DatalistError
    from fedseg.fl.fed_statistics import run_bundle_fedstats

    if not args.site_overrides:
        raise SystemExit("fedseg stats: --bundle needs --site-overrides FILE ({site: {config id: value}}; its keys "
                         "are the sites)")
    if args.split != "training":
        raise SystemExit(f"fedseg stats: --bundle describes the bundle's training items, not --split {args.split}")
    train, _, _ = _bundle_sets(args, "stats")
    if set(train) - {"bundle", "bundle_overrides"}:
        raise SystemExit(f"fedseg stats: --set {', '.join(sorted(set(train) - {'bundle', 'bundle_overrides'}))}: not "
                         "a config id of the bundle (train_config keys do not change its images)")
    out = Path(args.out).resolve()
    try:
        value_range = _stats_intensity_range(args.intensity_range, None, None)
        header = _stats_header(args, json.loads(Path(args.site_overrides).read_text()))  # each site's overrides
        report = run_bundle_fedstats(
            train["bundle"], args.site_overrides, out, bundle_overrides=train["bundle_overrides"], header=header,
            intensity_bins=args.intensity_bins, intensity_range=value_range, fraction_bins=args.fraction_bins,
            min_count=args.min_count, max_bins_percent=args.max_bins_percent, min_sites=args.min_sites,
            site_wait=args.site_wait)
    except (DatalistError, ValueError, KeyError, RuntimeError, OSError) as e:
        raise SystemExit(f"fedseg stats: {e}") from None
    _stats_print(report, out)


def _stats_export(args: argparse.Namespace) -> None:
    """``fedseg stats --export-job DIR``: the statistics job for any sites (their own datalists, else built-in data
    of ``--family``) as ``DIR/fedstats``, and stop (``jobs/fedstats`` is ``fedseg stats --export-job jobs``)."""
    from fedseg.fl.fed_statistics import export_fedstats_job
    from fedseg.fl.site_statistics import family_intensity_range

    if args.site_datalists:
        raise SystemExit("fedseg stats: --export-job writes a job for any sites; each site names its datalist itself "
                         "(FEDSEG_DATALIST or local/fedseg_site.json), not --site-datalists")
    try:
        value_range = _stats_intensity_range(args.intensity_range, None, family_intensity_range(args.family))
        job = export_fedstats_job(
            args.export_job, family=args.family, split=args.split, intensity_bins=args.intensity_bins,
            intensity_range=value_range, fraction_bins=args.fraction_bins, min_count=args.min_count,
            max_bins_percent=args.max_bins_percent, min_sites=args.min_sites, site_wait=args.site_wait)
    except (ValueError, OSError) as e:
        raise SystemExit(f"fedseg stats: {e}") from None
    print(f"wrote {job}")


def _stats_header(args: argparse.Namespace, mapping: dict) -> dict:
    """What ``stats.json`` records of its making: the command, date, code version, machine and images per split."""
    import datetime as _dt

    from fedseg.bench.bench import code_version, data_summary
    from fedseg.bench.simulator import machine_info

    return {"benchmark": "fedseg stats", "command": "fedseg " + " ".join(args.argv or []),
            "date": _dt.datetime.now().isoformat(timespec="seconds"), "code_version": code_version(),
            "machine": machine_info(), "data": data_summary(mapping)}


def _stats_intensity_range(given: Optional[List[str]], mapping: Optional[dict], family_range) -> Optional[tuple]:
    """``--intensity-range LOW HIGH`` as floats, ``auto`` as None (the sites' noisy min/max); unset: None for volumes
    (no fixed intensity scale), else the built-in family's range (8-bit: 0 256)."""
    if given == ["auto"]:
        return None
    if given:
        if len(given) != 2:
            raise ValueError(f"--intensity-range takes LOW HIGH or auto, got {' '.join(given)}")
        low, high = (float(v) for v in given)
        if not low < high:
            raise ValueError(f"--intensity-range needs LOW < HIGH, got {low} {high}")
        return low, high
    if mapping:
        from fedseg.fl.fed_statistics import default_intensity_range

        return default_intensity_range(mapping)
    return family_range


def _cmd_summarise(args: argparse.Namespace) -> None:
    reports = find_reports(args.path)
    if not reports:
        from fedseg.fl.component_policy import refused_components_hint

        hint = refused_components_hint(args.path)
        sys.exit(f"no report.json found under {args.path}" + (f"\n{hint}" if hint else ""))
    for report in reports if args.all else reports[-1:]:
        _print_summary(report)


def _cmd_infer(args: argparse.Namespace) -> None:
    from fedseg.inference import run_inference

    if _user_bundle_checkpoint(args):  # a user's bundle: its own inference.json, through MONAI's ConfigWorkflow
        from fedseg.bench.runs import parse_assignments
        from fedseg.inference import run_bundle_inference

        try:
            sets = parse_assignments(args.set)
            written = run_bundle_inference(args.checkpoint, args.output, bundle_dir=args.bundle, input_dir=args.input,
                                           overrides={**(json.loads(args.overrides) if args.overrides else {}), **sets})
        except ValueError as e:  # BundleError is one
            raise SystemExit(f"fedseg infer: {e}") from None
        print(f"wrote {len(written)} files to {args.output}")
        return

    from fedseg.data.labels import LabelSpaceError, parse_label_values_option

    overrides = json.loads(args.overrides) if args.overrides else None
    try:
        label_values = parse_label_values_option(args.label_values)
    except LabelSpaceError as e:
        raise SystemExit(f"fedseg infer: {e}") from None
    written = run_inference(
        args.checkpoint, args.output, input_dir=args.input, datalist=args.datalist, split=args.split, overrides=overrides,
        bundle_dir=args.bundle, label_values=label_values, class_indices=args.class_indices,
        largest_component=args.largest_component, stitch_device=args.stitch_device,
    )
    print(f"wrote {len(written)} masks to {args.output}")


def _user_bundle_checkpoint(args: argparse.Namespace) -> bool:
    """``fedseg infer`` on a user's bundle: the checkpoint's job trained one (its ``train_config["bundle"]`` is a
    folder); for weights without a job, ``--bundle`` names a folder outside the suite's ``bundles/``."""
    from fedseg.bundle import default_bundle_dir, is_bundle_path
    from fedseg.inference import checkpoint_job

    job = checkpoint_job(args.checkpoint)
    if job.get("bundle") is not None:
        return is_bundle_path(job["bundle"])
    return bool(args.bundle) and Path(args.bundle).resolve().parent != default_bundle_dir().parent


def _bundle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", default=None, metavar="DIR",
                        help="any MONAI bundle (a model-zoo bundle or your own), read through MONAI's ConfigWorkflow at every "
                             "site: its network, data, loss, optimiser, inferers and postprocessing; --set ID=VALUE then "
                             "overrides its config ids (e.g. train#dataloader#batch_size=2) or train_config keys")
    parser.add_argument("--site-overrides", default=None, metavar="FILE",
                        help="with --bundle: JSON map site -> {bundle config id: value} (each site's dataset_dir, ...); "
                             "the sites are its keys")


def _set_argument(parser: argparse.ArgumentParser, help: str, metavar: str = "KEY=VALUE") -> None:
    """``--set ITEM ...`` of a sub-command: items gathered over repeated uses, each parsed by the command."""
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar=metavar, help=help)


def _participants_argument(parser: argparse.ArgumentParser) -> None:
    """``--participants``: the FVAC setting's split of domains into participants, for the importers that offer it."""
    parser.add_argument(
        "--participants", default=None,
        help="split domains into participants with disjoint training shares, e.g. DRIVE=3,STARE=1,CHASE_DB1=1 (FVAC setting)",
    )


def _add_importer_parser(data_sub: argparse._SubParsersAction, name: str, folder: str, **kwargs) -> argparse.ArgumentParser:
    """The ``fedseg data NAME`` parser of a real-data importer: ``--src`` (default ``$FEDSEG_DATASETS/<folder>``) and
    ``--out``; ``kwargs`` go to ``add_parser`` (help, description)."""
    parser = data_sub.add_parser(name, **kwargs)
    parser.add_argument("--src", default=None, help=_src_help(folder))
    parser.add_argument("--out", required=True)
    return parser


def _add_synth_parser(data_sub: argparse._SubParsersAction) -> None:
    """``fedseg data synth``: built-in synthetic multi-site data, as datalists or as bundle folder layouts."""
    synth = data_sub.add_parser("synth", help="built-in synthetic multi-site data")
    synth.add_argument("--family", default="polyp", choices=FAMILY_CHOICES + VOLUME_FAMILY_CHOICES)
    synth.add_argument("--sites", nargs="+", default=["site-1", "site-2", "site-3"])
    synth.add_argument("--out", required=True)
    synth.add_argument("--profile", default="default")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--layout", default="datalist", choices=["datalist", "images-labels", "decathlon"],
                       help="datalist: <out>/<family>/<site>/datalist.json; images-labels (2-D) / decathlon (3-D): "
                            "<out>/<site>/images|imagesTr, labels|labelsTr (class-index masks) for a MONAI bundle "
                            "globbing dataset_dir, and <out>/site_overrides.json")
    _participants_argument(synth)


def _add_retina_parser(data_sub: argparse._SubParsersAction) -> None:
    """``fedseg data retina``: DRIVE / STARE / CHASE_DB1 as three sites."""
    retina = _add_importer_parser(data_sub, "retina", "retina_vessels",
                                  help="DRIVE / STARE / CHASE_DB1 as three sites (read in place)")
    retina.add_argument("--seed", type=int, default=0)
    retina.add_argument(
        "--rescale", default=None,
        help="fixed rescale factor per data set for patch mode, e.g. CHASE_DB1=0.5 (the default); '' for none",
    )
    _participants_argument(retina)


def _add_nuclei_parser(data_sub: argparse._SubParsersAction) -> None:
    """``fedseg data nuclei``: MoNuSeg / TNBC, one site per data set or per MoNuSeg organ."""
    nuclei = _add_importer_parser(
        data_sub, "nuclei", "nuclei_he",
        help="MoNuSeg / TNBC H&E nuclei: one site per data set or per MoNuSeg organ (read in place)",
        description="Write one datalist per site pointing at the original files (nothing is copied) and "
                    "site_datalists.json. Images of one slide never span two splits; MoNuSeg's official test "
                    "split is kept where a site has one.")
    nuclei.add_argument("--layout", default="source", choices=["source", "organ"],
                        help="source: sites MoNuSeg and TNBC; organ: MoNuSeg organs as sites")
    nuclei.add_argument("--val-fraction", type=float, default=0.15, help="share of slides for validation")
    nuclei.add_argument("--test-fraction", type=float, default=0.2,
                        help="share of slides for test where a site has no official test split")
    nuclei.add_argument("--seed", type=int, default=0)
    nuclei.add_argument("--organs", nargs="+", default=None,
                        help="organ layout: organs to import (an organ that cannot be split is an error); "
                             "default: organs with at least --min-images images (others skipped with a notice)")
    nuclei.add_argument("--min-images", type=int, default=6,
                        help="organ layout without --organs: least images for an organ to become a site (default 6: "
                             "breast, kidney, liver, prostate)")
    _participants_argument(nuclei)


def _add_odoc_parser(data_sub: argparse._SubParsersAction) -> None:
    """``fedseg data odoc``: fundus optic disc/cup or prostate MRI slice samples, one site per domain."""
    odoc = _add_importer_parser(
        data_sub, "odoc", "odoc_prostate_samples",
        help="fundus optic disc/cup (multi-class) or prostate MRI slice samples, one site per domain (read in place)",
        description="Write one datalist per domain pointing at the original files and site_datalists.json, with the "
                    "label space declared: fundus masks store 0 = cup, 128 = rim, 255 = background (regions disc = "
                    "rim + cup, cup); prostate masks 0 / 255. Every mask is decoded and checked against the manifest.")
    odoc.add_argument("--task", default="fundus", choices=["fundus", "prostate"])
    odoc.add_argument("--sites", nargs="+", default=None, help="domains to import (default: all of the task)")
    odoc.add_argument("--seed", type=int, default=0)
    odoc.add_argument("--val-fraction", type=float, default=0.34, help="share of a domain's training rows for validation")


def _add_dca1_parser(data_sub: argparse._SubParsersAction) -> None:
    """``fedseg data dca1``: DCA1 coronary angiograms and vessel masks as segmentation site(s)."""
    dca1 = _add_importer_parser(
        data_sub, "dca1", "xray_angio",
        help="DCA1 coronary angiograms + vessel masks as segmentation site(s) (read in place)",
        description="Write one datalist per site pointing at the original files and site_datalists.json. Masks are "
                    "checked binary and against the manifest's foreground fraction; splits are by patient when the "
                    "manifest names patients, else by image.")
    dca1.add_argument("--sites", nargs="+", default=["DCA1"], help="site names; the images are divided among them")
    dca1.add_argument("--seed", type=int, default=0)
    dca1.add_argument("--val-fraction", type=float, default=0.15)
    dca1.add_argument("--test-fraction", type=float, default=0.25)


def _add_foundation_parser(data_sub: argparse._SubParsersAction) -> None:
    """``fedseg data foundation``: FedEFM's phase-1 classification silos."""
    foundation = data_sub.add_parser(
        "foundation", help="FedEFM phase-1 classification silos from real labels and built-in X-ray classes",
        description="Global label space: retina acquisition source, MoNuSeg organ / TNBC, ARCADE stenosis crops and "
                    "built-in X-ray scanner x device classes; classes dealt to silos with the unseen proportion. "
                    "Writes <out>/<silo>/datalist.json, site_datalists.json and label_space.json "
                    "(see docs/fedefm_data.md).")
    foundation.add_argument("--out", required=True)
    foundation.add_argument("--retina", default=None, help="retina_vessels folder (classes retina/<data set>)")
    foundation.add_argument("--nuclei", default=None, help="nuclei_he folder (classes nuclei/monuseg-<organ>, nuclei/tnbc)")
    foundation.add_argument("--arcade", default=None, help="xray_angio folder (classes arcade/stenosis, arcade/no-stenosis)")
    foundation.add_argument("--unseen", type=float, default=1.0, help="share of each silo's classes no other silo has")
    foundation.add_argument("--sites", type=int, default=3, help="number of silos (named silo-1 ... silo-N)")
    foundation.add_argument("--seed", type=int, default=0)
    foundation.add_argument("--profile", default="default", choices=["tiny", "default", "paper"],
                            help="built-in X-ray image size and images per class")
    foundation.add_argument("--xray-scanners", type=int, default=None,
                            help="built-in X-ray scanner styles (4 classes each); default = --sites, 0 for none")
    foundation.add_argument("--n-per-class", type=int, default=None, help="built-in images per class and silo")


def _add_check_parser(data_sub: argparse._SubParsersAction) -> None:
    """``fedseg data check``: datalists and every file they name, checked before training."""
    check = data_sub.add_parser(
        "check", help="find bad files before training: paths, 3-D volumes, tiny/huge images, masks, sizes",
        description="Check datalists and every file they name (fedseg.data.checks); exit status 1 with each "
                    "problem named, file by file.")
    check.add_argument("datalists", nargs="+", help="datalist JSON files (or folders holding datalist.json)")
    check.add_argument("--allow-external-paths", action="store_true",
                       help="accept files outside the datalist's folder (default: the datalist's own setting)")
    check.add_argument("--headers-only", action="store_true", help="check paths and headers, do not decode pixels")


def _add_data_parser(sub: argparse._SubParsersAction) -> None:
    """``fedseg data``: built-in data generation, the real-data importers and the datalist check."""
    data = sub.add_parser("data", help="generate built-in data or import real data")
    data_sub = data.add_subparsers(dest="data_cmd", required=True)
    for add in (_add_synth_parser, _add_retina_parser, _add_nuclei_parser, _add_odoc_parser, _add_dca1_parser,
                _add_foundation_parser, _add_check_parser):
        add(data_sub)
    data.set_defaults(func=_cmd_data)


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    """``fedseg export``: recipes written as NVFlare job folders."""
    export = sub.add_parser("export", help="export recipes into NVFlare job folders")
    export.add_argument("--method", default="fedavg")
    export.add_argument("--all", action="store_true", help="every method")
    export.add_argument("--profile", default="default")
    export.add_argument("--out", default="jobs")
    export.add_argument(
        "--checkpoint-dir", default=None,
        help="absolute server folder for round_checkpoint.pt (default: the run directory); a re-submitted job resumes from it",
    )
    export.add_argument(
        "--task-timeout", type=int, default=None,
        help="seconds a site may take per task (default: fedseg.config.default_task_timeout of the profile; 0 = wait for ever)",
    )
    export.add_argument(
        "--task-request-interval", type=float, default=None,
        help="seconds an idle site waits before asking for a task again (default 0.2: measured by benchmarks/cost/framework_overhead.py)",
    )
    export.add_argument("--server-optimizer", default="none", choices=("none", "sgd-momentum", "adam"),
                        help="a server step on the method's global model (default none: the method as published; "
                             "FedAdam / FedAvgM carry their own)")
    export.add_argument("--server-lr", type=float, default=1.0, help="the server step's learning rate (default 1.0)")
    export.add_argument("--server-momentum", type=float, default=0.6, help="sgd-momentum's momentum (default 0.6)")
    export.add_argument("--family", default=None, choices=FAMILY_CHOICES + VOLUME_FAMILY_CHOICES,
                        help="built-in data family of the job (its label space and, for volumes, its volume settings too)")
    export.add_argument("--labels-from", default=None, metavar="DATALIST",
                        help="put the label space this datalist declares (num_classes, labels, regions, label_values) and, for "
                             "volumes, its volume settings (target_spacing, modality, ...) into the job")
    _set_argument(export, help="any train_config key")
    _bundle_arguments(export)
    export.set_defaults(func=_cmd_export)


def _add_run_parser(sub: argparse._SubParsersAction) -> None:
    """``fedseg run METHOD``: one method in NVFlare's simulator, then its summary."""
    run = sub.add_parser("run", help="run a method in the NVFlare simulator and summarise it")
    run.add_argument("method")
    run.add_argument("-n", "--n-clients", type=int, default=3)
    run.add_argument("-w", "--workspace", default=None)
    run.add_argument("--profile", default="default")
    run.add_argument("--rounds", type=int, default=None)
    run.add_argument("--family", default=None, choices=FAMILY_CHOICES + VOLUME_FAMILY_CHOICES, help="built-in data family")
    run.add_argument("--image-size", type=int, default=None, help="network input size (images are resized on load)")
    run.add_argument("--local-epochs", type=int, default=None)
    run.add_argument("--site-datalists", default=None, help="JSON map site -> datalist (real data)")
    run.add_argument("--seed", type=int, default=None, help="training seed (initial weights, shuffling, augmentation)")
    _set_argument(run, help="any train_config key, value parsed as JSON where possible, e.g. --set batch_size=8 "
                            "learning_rate=3e-4")
    run.add_argument("--he", action="store_true",
                     help="homomorphic aggregation (CKKS, TenSEAL): the server sums encrypted models and never holds a "
                          "secret key; methods whose server step reads the models refuse it (docs/guide/deployment.md)")
    run.add_argument("--he-layers", default=None,
                     help="with --he: a regular expression naming the entries to encrypt (default: every one)")
    _bundle_arguments(run)
    run.set_defaults(func=_cmd_run)


def _add_bench_data_arguments(bench: argparse.ArgumentParser) -> None:
    """``fedseg bench``'s data: ``--site-datalists`` or a built-in family (its sites, profile and seed)."""
    data_src = bench.add_mutually_exclusive_group()
    data_src.add_argument("--site-datalists", default=None, help="JSON map site -> datalist path")
    data_src.add_argument("--family", default=None, choices=FAMILY_CHOICES + VOLUME_FAMILY_CHOICES + ("xray_foundation",),
                          help="built-in data family (default polyp; xray_foundation = FedEFM's classification "
                               "silos, unseen proportion from --set data_unseen=P)")
    bench.add_argument("--sites", nargs="+", default=["site-1", "site-2", "site-3"], help="built-in data: site names")
    bench.add_argument("--data-profile", default="default", help="built-in data: profile (image count / size)")
    bench.add_argument("--data-seed", type=int, default=0, help="built-in data: federation seed")


def _add_bench_comparison_arguments(bench: argparse.ArgumentParser) -> None:
    """``fedseg bench``'s comparison: the methods, references, baseline, seeds and the training budget."""
    bench.add_argument("--methods", nargs="+", default=["fedavg"],
                       help="methods, method options (graphfedseg:uncertainty_pass=last_epoch) or ablation rows "
                            "LABEL=METHOD:key=value,key=value; {seed} in a value is the run's seed (e.g. "
                            "foundation_ckpt=OUT/workspaces/method-fedefm-seed{seed}/server/simulate_job/app_server/"
                            "FL_global_model.pt)")
    bench.add_argument("--references", nargs="*", default=["local", "pooled"], choices=["local", "pooled"])
    bench.add_argument("--baseline", default=None,
                       help="label every approach is tested against (default fedavg, else the only label starting with fedavg)")
    bench.add_argument("--seeds", nargs="+", type=int, default=[0])
    bench.add_argument("--profile", default="default")
    bench.add_argument("--protocol", default=None, metavar="METHOD",
                       help="every method trains with this method's paper local protocol (network, optimiser, batches, "
                            "epochs, augmentation, intensity, loss, evaluation options); --profile paper: default the "
                            "bench's one published method, else fedavg")
    bench.add_argument("--rounds", type=int, default=None)
    bench.add_argument("--local-epochs", type=int, default=None)
    bench.add_argument("--image-size", type=int, default=None, help="shorthand for --set image_size=N")
    _set_argument(bench, help="any train_config key")


def _add_bench_execution_arguments(bench: argparse.ArgumentParser) -> None:
    """``fedseg bench``'s execution: simulator timings and limits, threads, the output folder, resuming and reuse."""
    bench.add_argument("--task-check-period", type=float, default=0.5, help="controller task_check_period (s)")
    bench.add_argument("--simulator-timeout", type=int, default=3600, metavar="SECONDS",
                       help="seconds one method run may take before it is stopped (default 3600; a slow or shared "
                            "machine may need more)")
    bench.add_argument("--task-request-interval", type=float, default=None,
                       help="NVFlare server task_request_interval (s); default: the recipe's")
    bench.add_argument("--task-timeout", type=int, default=None, metavar="S",
                       help="seconds a site may take for one task (default: the recipe's, from its inputs: 300 s for "
                            "one epoch of 64 px patches); more on a busy machine, where a late site fails the run")
    bench.add_argument("--omp-threads", default="1",
                       help="torch/OMP threads per site process and for the references ('default' = unset)")
    bench.add_argument("--out", required=True, help="output folder (resumable)")
    bench.add_argument("--refresh", action="store_true",
                       help="on resume, re-read finished method runs from their workspaces with this code (e.g. a metric "
                            "added to the tables since they ran); nothing is re-trained, references are kept as stored")
    bench.add_argument("--parallel", type=int, default=1, metavar="N",
                       help="method runs (simulator jobs) at once, for a machine with cores and GPU memory to spare "
                            "(default 1); their round times then include each other's load")
    bench.add_argument("--site-stats", default=None, metavar="run | STATS_JSON",
                       help="how the sites differ, beside the verdict: 'run' runs fedseg stats (NVFlare's federated "
                            "statistics) over the bench's datalists first; a path reads a stats.json")
    bench.add_argument("--reuse", nargs="+", default=[], metavar="BENCH_OUT",
                       help="other bench outputs: a run finished there with the same run configuration (method, seed, "
                            "budget, data) is copied into --out instead of trained again")


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """``fedseg bench``: methods and references compared over seeds in NVFlare's simulator."""
    bench = sub.add_parser(
        "bench", help="compare methods (and local-only / pooled references) over seeds, with paired tests",
        description="Run every method and reference for every seed in NVFlare's simulator (references in "
                    "process, same engine and schedule), then write results.json, results.md and plots/ under "
                    "--out. Repeating the command with the same --out skips finished runs.")
    _add_bench_data_arguments(bench)
    _add_bench_comparison_arguments(bench)
    _add_bench_execution_arguments(bench)
    _bundle_arguments(bench)
    bench.set_defaults(func=_cmd_bench)


def _add_summarise_parser(sub: argparse._SubParsersAction) -> None:
    """``fedseg summarise PATH`` (alias ``summarize``): a run's table and plots from its report.json."""
    summ = sub.add_parser("summarise", aliases=["summarize"], help="table + plots from report.json")
    summ.add_argument("path", help="a workspace, run directory or report.json")
    summ.add_argument("--all", action="store_true", help="every report found, not just the newest")
    summ.set_defaults(func=_cmd_summarise)


def _add_stats_parser(sub: argparse._SubParsersAction) -> None:
    """``fedseg stats``: federated statistics of the sites' images and labels, and how different the sites are."""
    stats = sub.add_parser("stats", help="federated statistics of every site's images and labels (NVFlare), and "
                                         "how different the sites are")
    data_src = stats.add_mutually_exclusive_group()
    data_src.add_argument("--site-datalists", default=None, help="JSON map site -> datalist path")
    data_src.add_argument("--family", default="polyp", choices=FAMILY_CHOICES + VOLUME_FAMILY_CHOICES,
                          help="built-in data family")
    data_src.add_argument("--bundle", default=None, metavar="DIR",
                          help="a MONAI bundle: each site's training images after the bundle's own preprocessing "
                               "(without its random transforms), what its network sees; needs --site-overrides")
    stats.add_argument("--site-overrides", default=None, metavar="FILE",
                       help="with --bundle: JSON map site -> {bundle config id: value} (each site's dataset_dir, ...); "
                            "the sites are its keys")
    _set_argument(stats, help="with --bundle: bundle config ids at every site, e.g. --set image_size=64",
                  metavar="ID=VALUE")
    stats.add_argument("-n", "--n-clients", type=int, default=3, help="built-in data: number of sites")
    stats.add_argument("--data-profile", default="default", help="built-in data: profile (image count / size)")
    stats.add_argument("--data-seed", type=int, default=0, help="built-in data: federation seed")
    stats.add_argument("--out", default=str(Path("workspaces") / "stats"), help="run folder (stats.json, stats.md)")
    stats.add_argument("--split", default="training", choices=["training", "validation", "test"],
                       help="the datalist split described (default: what the network trains on)")
    stats.add_argument("--intensity-bins", type=int, default=64, help="bins of the shared intensity histogram")
    stats.add_argument("--intensity-range", nargs="+", default=None, metavar="LOW HIGH | auto",
                       help="range of the shared intensity histogram (default: 0 256 for 8-bit images; auto, the sites' "
                            "min/max with NVFlare's noise, for volumes); the share of pixels outside it is reported")
    stats.add_argument("--fraction-bins", type=int, default=10, help="bins of the foreground-fraction histograms")
    stats.add_argument("--min-count", type=int, default=10,
                       help="a site with fewer images sends nothing (NVFlare's MinCountCleanser for the per-image "
                            "statistics; the intensity ones, over pixels, are not offered)")
    stats.add_argument("--max-bins-percent", type=float, default=10,
                       help="NVFlare's HistogramBinsCleanser: a histogram needs more records than bins x 100 / this")
    stats.add_argument("--min-sites", type=int, default=1,
                       help="the statistics are written when at least this many sites sent theirs (the others are "
                            "named as sites that sent nothing)")
    stats.add_argument("--site-wait", type=int, default=120, metavar="SECONDS",
                       help="how long each statistics task waits, after --min-sites sites answered, for the others "
                            "(a site that has not answered by then counts as dropped out)")
    # not --export: NVFlare's recipe module takes that flag out of the command line when it is imported
    stats.add_argument("--export-job", nargs="?", const="jobs", default=None, metavar="DIR",
                       help="only write the job for any sites as DIR/fedstats (default DIR: jobs) and stop")
    stats.set_defaults(func=_cmd_stats)


def _add_infer_parser(sub: argparse._SubParsersAction) -> None:
    """``fedseg infer``: masks for new images from a trained checkpoint (MONAI bundle inference)."""
    infer = sub.add_parser("infer", help="segment new images with a trained checkpoint (MONAI bundle inference)")
    infer.add_argument("--checkpoint", required=True)
    infer.add_argument("--output", required=True)
    infer.add_argument("--input", default=None, help="folder of images")
    infer.add_argument("--datalist", default=None)
    infer.add_argument("--split", default="test")
    infer.add_argument("--overrides", default=None, help='bundle overrides as JSON, e.g. \'{"image_size": 64}\'')
    infer.add_argument(
        "--label-values", default=None,
        help='stored mask encoding to write, JSON {"stored value": class}, e.g. \'{"255": 0, "128": 1, "0": 2}\' '
             "(default: the --datalist's own, else the one the checkpoint's job recorded, else class indices; 0/255 "
             "for a binary model)")
    infer.add_argument("--class-indices", action="store_true", help="write class indices 0..C-1 instead")
    infer.add_argument("--stitch-device", default=None,
                       help="assemble the sliding window's output on this device (e.g. cpu) while the windows run on the "
                            "network's device: a whole scan's scores in host memory, not GPU memory (patch mode)")
    _set_argument(infer, metavar="ID=VALUE", help="a user's bundle: config ids of its inference.json (--input sets its "
                                                  "dataset_dir)")
    infer.add_argument("--largest-component", action="store_true",
                       help="keep only each class's largest connected component in every mask")
    infer.add_argument(
        "--bundle", default=None,
        help="segmentation bundle folder (default bundles/unet2d_seg; bundles/unetr_seg for a fine-tuned FedEFM UNETR)",
    )
    infer.set_defaults(func=_cmd_infer)


def build_parser() -> argparse.ArgumentParser:
    """The ``fedseg`` parser: one sub-command per task, each with its handler as ``func``."""
    parser = argparse.ArgumentParser(prog="fedseg", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for add in (_add_data_parser, _add_export_parser, _add_run_parser, _add_bench_parser, _add_summarise_parser,
                _add_infer_parser, _add_stats_parser):
        add(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    with StopOnSignal(f"fedseg {args.cmd}"):  # SIGTERM / Ctrl-C end the simulators and every other process it started
        args.func(args)


if __name__ == "__main__":
    main()
