#!/usr/bin/env python
"""Run a fedseg method as an NVFlare Job Recipe in an execution environment: simulator, POC or a deployment.

    python jobs/job.py graphfedseg --env sim -n 4                              # simulator, 4 sites; prints the report
    python jobs/job.py fedavg --env poc                                        # POC on this machine (poc_workspace/project.yml)
    python jobs/job.py fedavg --env prod --startup-kit ADMIN_KIT                # a deployment (deploy/README.md)
    python jobs/job.py graphfedseg --export my_jobs                            # only write the job folder (= fedseg export)
    python jobs/job.py graphfedseg --help                                      # the method's own options too

One script for every method (``METHOD`` is its first argument): the recipes differ only in their options, which are
read from the method's recipe (``fedseg.recipes``). The job carries no code; every participant runs the fedseg package
it installed and allows fedseg's components (the recipe writes the simulator's allow list itself; POC and
deployments get it from their project file: ``poc_workspace/README.md``, ``deploy/README.md``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from fedseg.processes import StopOnSignal

REPO = Path(__file__).resolve().parents[1]
#: where ``--export`` without a folder writes (NVFlare's default export folder)
DEFAULT_EXPORT_DIR = "fl_job"


def build_parser(method: str = None) -> argparse.ArgumentParser:
    """The command line; with ``method``, its recipe's own options too (``--alpha``, ``--uncertainty``, ...)."""
    parser = argparse.ArgumentParser(prog="job.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method", help="fedavg, graphfedseg, fedevi, fvac, pathfl, fedefm, ... (fedseg.recipes)")
    parser.add_argument("--env", choices=("sim", "poc", "prod"), default="sim", help="where the job runs (default sim)")
    sites = parser.add_mutually_exclusive_group()
    sites.add_argument("-n", "--num-sites", type=int, default=3, help="sim: sites site-1..site-N (default 3)")
    sites.add_argument("--sites", nargs="+", default=None, help="sim: site names")
    parser.add_argument("--rounds", type=int, default=None, help="communication rounds (default: the profile's)")
    parser.add_argument("--profile", default="default", help="default | tiny | paper (the method's paper settings)")
    parser.add_argument("--site-datalists", default=None, metavar="FILE",
                        help="JSON map site -> datalist (real data; sim: the sites are its keys); default built-in data")
    parser.add_argument("--bundle", default=None, metavar="DIR",
                        help="any MONAI bundle folder (a user's: its network, data, loss, optimiser, inferers), read "
                             "through MONAI's ConfigWorkflow at every site")
    parser.add_argument("--site-overrides", default=None, metavar="FILE",
                        help="with --bundle: JSON map site -> {bundle config id: value} (each site's dataset_dir, ...); "
                             "sim: the sites are its keys")
    parser.add_argument("--family", default=None, help="built-in data family (polyp, vessel, nuclei, fundus, prostate3d)")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="any train_config key, value read as JSON where possible, e.g. --set local_epochs=2")
    parser.add_argument("--min-clients", type=int, default=None,
                        help="sites the job waits for (default: every site for sim and poc, 2 for prod)")
    parser.add_argument("-w", "--workspace", default="workspaces",
                        help="sim: folder of the simulator workspaces (the job runs in WORKSPACE/<method>)")
    parser.add_argument("--project", default=str(REPO / "poc_workspace" / "project.yml"),
                        help="poc: the POC's project file, with fedseg's site policy (default poc_workspace/project.yml)")
    parser.add_argument("--startup-kit", default=None, help="prod: the admin's startup kit folder from nvflare provision")
    parser.add_argument("--username", default=None, help="poc/prod: admin user (default: the project's / the kit's)")
    parser.add_argument("--login-timeout", type=float, default=None, help="poc/prod: seconds to reach the server")
    parser.add_argument("--timeout", type=float, default=0.0, help="poc/prod: seconds to wait for the result (0 = no limit)")
    parser.add_argument("--result-dir", default=None, help="also copy the job's result folder into this folder")
    parser.add_argument("--he", action="store_true",
                        help="homomorphic aggregation: the sites send CKKS-encrypted models the server sums without reading "
                             "them (poc/prod: the keys NVFlare's HEBuilder put in the kits; sim: a key pair for this run)")
    parser.add_argument("--tracking", choices=("tensorboard", "mlflow"), default="tensorboard",
                        help="tensorboard (every job) or mlflow as well (needs the mlflow package here and on the server)")
    parser.add_argument("--mlflow-uri", default=None, help="MLflow tracking URI (default: mlflow.db in the job result)")
    parser.add_argument("--export", nargs="?", const=DEFAULT_EXPORT_DIR, default=None, metavar="DIR",
                        help="write the job folder DIR/<method> and stop (default DIR: fl_job)")
    parser.add_argument("--export-dir", default=None, help=argparse.SUPPRESS)  # NVFlare's spelling: --export --export-dir DIR
    if method:
        from fedseg.recipes import get_recipe_class
        from fedseg.recipes.job_options import method_parameters
        from fedseg.bench.runs import parse_value
        from fedseg.strategies.server_step import SERVER_STEPS

        group = parser.add_argument_group(f"{method} options (the recipe's; values read as JSON where possible)")
        own = method_parameters(get_recipe_class(method))
        for name, p in own.items():
            default = "" if p.default is p.empty else f" (default {p.default!r})"
            group.add_argument("--" + name.replace("_", "-"), dest=f"opt_{name}", type=parse_value,
                               default=argparse.SUPPRESS, metavar="VALUE", help=f"{name}{default}")
        if "server_optimizer" not in own:  # FedAdam / FedAvgM carry their own server step
            step = parser.add_argument_group("server step on the method's global model (fedseg.strategies.server_step)")
            step.add_argument("--server-optimizer", dest="opt_server_optimizer", choices=SERVER_STEPS,
                              default=argparse.SUPPRESS, help="none (default: the method as published), sgd-momentum, adam")
            for name, help_ in (("server_lr", "server learning rate (default 1.0)"),
                                ("server_momentum", "sgd-momentum's momentum (default 0.6)")):
                if name in own:  # FedAvgM's own server_lr is its recipe's option above
                    continue
                step.add_argument("--" + name.replace("_", "-"), dest=f"opt_{name}", type=float,
                                  default=argparse.SUPPRESS, metavar="VALUE", help=help_)
    return parser


def parse(argv):
    """``(args, method_options)``: the method comes first, so that its recipe's options can be offered."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("method", nargs="?")
    known, _ = first.parse_known_args(argv)
    method = known.method if known.method and not known.method.startswith("-") else None
    if method:
        from fedseg.recipes import available_methods

        if method not in available_methods():
            build_parser().error(f"unknown method {method!r}; choose from {', '.join(available_methods())}")
    args = build_parser(method).parse_args(argv)
    options = {k[len("opt_"):]: v for k, v in vars(args).items() if k.startswith("opt_")}
    return args, options


def build_recipe(args, options, mapping=None):
    """The method's recipe with this command line's settings (``mapping``: the sites' datalists, if given)."""
    from fedseg.bench.runs import parse_sets
    from fedseg.recipes import get_recipe_class
    from fedseg.recipes.job_options import data_fields, profile_data

    if args.bundle:  # a user's bundle: --set items are its config ids or train_config keys
        from fedseg.bench.runs import parse_assignments
        from fedseg.recipes.job_options import bundle_options

        overrides, script_args, _ = bundle_options(args.bundle, args.site_overrides, parse_assignments(args.set))
        if script_args:
            options["script_args"] = script_args
        if args.min_clients is not None:
            options["min_clients"] = args.min_clients
        return get_recipe_class(args.method)(profile=args.profile, num_rounds=args.rounds, **options, **overrides)
    overrides = parse_sets(args.set)
    if args.family:
        overrides["data_family"] = args.family
    if mapping or args.family:  # label space (and volume settings) of the sites' data, checked before anything starts
        overrides.update(data_fields(mapping, args.family, overrides, profile_data(args.profile)))
    if mapping:
        options["script_args"] = f"--site_datalists {Path(args.site_datalists).resolve()}"
    if args.min_clients is not None:
        options["min_clients"] = args.min_clients
    recipe = get_recipe_class(args.method)(profile=args.profile, num_rounds=args.rounds, **options, **overrides)
    if args.tracking == "mlflow":
        from fedseg.recipes.tracking import add_mlflow

        add_mlflow(recipe, tracking_uri=args.mlflow_uri)
    return recipe


def build_env(args, mapping=None):
    """The execution environment, checked before anything starts (``fedseg.recipes.environments``), and the sites it
    runs (None where the deployment decides)."""
    from fedseg.recipes import environments as envs

    login = {"login_timeout": args.login_timeout} if args.login_timeout else {}
    if args.env == "sim":
        if args.bundle and args.site_overrides and not mapping:
            import json

            mapping = dict.fromkeys(json.loads(Path(args.site_overrides).read_text()))  # the sites are its keys
        sites = sorted(mapping) if mapping else (args.sites or [f"site-{i}" for i in range(1, args.num_sites + 1)])
        return envs.sim_env(sites, args.workspace), sites
    if args.env == "poc":
        env = envs.poc_env(args.project, username=args.username, **login)
        return env, envs.project_sites(envs.read_project(args.project))
    if not args.startup_kit:
        raise envs.ExecEnvError("--env prod needs --startup-kit: the admin folder nvflare provision wrote, "
                                "<provision workspace>/<project>/prod_NN/<admin e-mail> (deploy/README.md)")
    return envs.prod_env(args.startup_kit, username=args.username, **login), None


def run_job(args, options) -> str:
    """Build, run and wait: the job's result folder (a simulator workspace, or the result downloaded from the server)."""
    from fedseg.recipes.environments import ExecEnvError, report_in
    from fedseg.recipes.job_options import read_site_datalists

    # several site processes share this machine in sim and poc: one torch thread each unless told otherwise
    if args.env in ("sim", "poc"):
        os.environ.setdefault("FEDSEG_NUM_THREADS", "1")
        os.environ.setdefault("OMP_NUM_THREADS", os.environ["FEDSEG_NUM_THREADS"])
    mapping = read_site_datalists(args.site_datalists) if args.site_datalists else None
    env, sites = build_env(args, mapping)  # a missing kit or project is named before the recipe builds its network
    if sites and args.min_clients is None and args.env in ("sim", "poc"):
        args.min_clients = len(sites)  # every site of a federation on this machine takes part
    if args.he:
        options["he"] = True
        if args.env == "sim":  # no startup kits: a key pair for this run, gone with the process
            import tempfile

            from fedseg.fl.homomorphic import simulator_he_options

            keys = tempfile.TemporaryDirectory(prefix="fedseg_he_")
            options.update(simulator_he_options(Path(keys.name)))
    run = build_recipe(args, options, mapping).run(env)
    print(f"job {run.get_job_id()} submitted ({args.env}); status: {run.get_status()}")
    # POC: keep the POC workspace, which holds the downloaded result (PocEnv's default clean-up removes it); the
    # POC's processes are stopped either way
    result = run.get_result(timeout=args.timeout, clean_up=False)
    status = run.get_status()  # None in the simulator (it returned only once the job had ended)
    job = f"job {run.get_job_id()}"
    if args.env != "sim" and status is None:
        raise ExecEnvError(f"lost the server before {job} ended: is the {'POC' if args.env == 'poc' else 'FL server'} "
                           "still running? Its server log says what happened")
    if status is not None and not status.startswith("FINISHED"):
        raise ExecEnvError(f"{job} was still {status} after --timeout {args.timeout:g} s: give it longer (0 = no limit)")
    if result is None or status not in (None, "FINISHED:COMPLETED"):
        raise ExecEnvError(f"{job} ended {status or 'without a result'}: the server's log "
                           f"{'in ' + str(result) + ' ' if result else ''}says why")
    report_in(result)  # a result without a report is a job that did not finish
    return str(result)


@StopOnSignal("job.py")  # SIGTERM / Ctrl-C end the simulator's (or POC's) processes too
def main(argv=None) -> int:
    args, options = parse(sys.argv[1:] if argv is None else argv)
    from fedseg.recipes.environments import ExecEnvError

    try:
        if args.export or args.export_dir:
            from fedseg.recipes.export import write_job
            from fedseg.recipes.job_options import read_site_datalists

            mapping = read_site_datalists(args.site_datalists) if args.site_datalists else None
            print(f"exported {args.method} -> {write_job(build_recipe(args, options, mapping), args.export_dir or args.export)}")
            return 0
        result = run_job(args, options)
    except (ExecEnvError, ValueError) as e:
        print(f"job.py: {e}", file=sys.stderr)
        return 1
    if args.result_dir:
        copy = Path(args.result_dir).resolve() / Path(result).name
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(result, copy)
        result = str(copy)
    print(f"job result: {result}")
    from fedseg.cli import main as fedseg_main

    fedseg_main(["summarise", result])  # the report table, as `fedseg summarise RESULT` prints it
    return 0


if __name__ == "__main__":
    # NVFlare's recipe module reads --export / --export-dir from sys.argv when it is imported: this script has read
    # its whole command line itself, so NVFlare is handed none of it
    _argv, sys.argv[1:] = sys.argv[1:], []
    sys.exit(main(_argv))
