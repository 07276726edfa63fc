"""NVFlare's own ``FedAvgRecipe`` around a MONAI bundle trained by MONAI's ``MonaiAlgo`` at every site.

The way NVIDIA FLARE runs MONAI bundles (NVFlare's ``examples/advanced/monai``): the sites run the Client API script
:mod:`fedseg.fl.monai_bundle_client` (``MonaiAlgo`` over the bundle's ``train.json``), the server is NVFlare's FedAvg
controller with its in-time weighted averaging (weights: the iterations each site trained), and the initial global
model is the bundle's ``network_def``. Nothing of fedseg's controller, strategies or objectives takes part: this is
the bundle as MONAI defines it, federated as NVFlare does it. The methods of the suite run the same bundles through
fedseg's own recipes (``fedseg.recipes``).

    python -m fedseg.recipes.monai_bundle --bundle unet2d_seg -n 2 --rounds 2 --site-overrides sites.json \\
        --set image_size=64 -w workspaces

with ``sites.json`` = ``{"site-1": {"dataset_dir": "/data/polyp/site-1"}, "site-2": {...}}`` (a folder holding the
site's ``datalist.json``). From Python::

    from nvflare.recipe import SimEnv
    from fedseg.recipes.monai_bundle import monai_bundle_recipe

    run = monai_bundle_recipe("unet2d_seg", num_rounds=2, site_overrides="sites.json").execute(SimEnv(num_clients=2))

Unlike the suite's jobs, this job carries its site script (``app/custom/``, as NVFlare's ``ScriptRunner`` packs it):
NVFlare treats it as bring-your-own-code, which a production deployment that refuses custom code will not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

from fedseg.bench.runs import parse_assignments
from fedseg.fl import monai_bundle_client as client

#: the job name the recipe gets unless told otherwise
DEFAULT_NAME = "monai_bundle_fedavg"


def _parser(bundle_root: Path, config_files: Sequence[str], sets: Optional[Mapping[str, Any]] = None):
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(bundle_root / f) for f in config_files])
    parser.update(pairs={"bundle_root": str(bundle_root), **dict(sets or {})})
    return parser


def bundle_network(bundle: str, sets: Optional[Mapping[str, Any]] = None):
    """The bundle's ``network_def`` with the ids every site gets (``sets``), on the CPU: the initial global model.

    Raises:
        ValueError: ``sets`` names an id ``train.json`` does not define.
    """
    root = client.resolve_bundle_root(bundle)
    parser = _parser(root, ["configs/train.json"])
    unknown = sorted(k for k in (sets or {}) if k not in parser)
    if unknown:  # ConfigParser.update would add them silently
        raise ValueError(f"bundle {root} has no config id {unknown}")
    parser.update(pairs=dict(sets or {}))
    return parser.get_parsed_content("network_def", instantiate=True, lazy=False)


def key_metric(bundle: str, eval_configs: Sequence[str] = client.DEFAULT_EVAL_CONFIGS) -> str:
    """The name of the evaluation workflow's ``validate#key_metric`` (``val_mean_dice``, ``val_accuracy``): the metric
    the sites report for the received model, which NVFlare's model selector ranks global models by.

    Raises:
        ValueError: the evaluation configs define no ``validate#key_metric``.
    """
    root = client.resolve_bundle_root(bundle)
    configs = ["configs/train.json", *[c for c in eval_configs if c != "configs/train.json"]]
    metric = _parser(root, configs).get("validate#key_metric")
    if not isinstance(metric, dict) or not metric:
        raise ValueError(f"bundle {root} ({configs}) has no validate#key_metric to select global models by")
    return next(iter(metric))


def _arg_value(key: str, value: Any) -> str:
    """One ``--set`` value as the script will read it back (:func:`fedseg.bench.runs.parse_value`).

    Raises:
        ValueError: the value would contain white space, on which NVFlare splits ``train_args``.
    """
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if re.search(r"\s", text) or not text:
        raise ValueError(f"--set {key}: {text!r} is empty or holds white space, which NVFlare's train_args cannot carry; "
                         "put it in the site overrides file instead")
    return text


def script_args(bundle: str, *, sets: Optional[Mapping[str, Any]] = None, site_overrides: Optional[os.PathLike] = None,
                local_epochs: int = 1, send_weight_diff: bool = False,
                eval_configs: Sequence[str] = client.DEFAULT_EVAL_CONFIGS) -> str:
    """The site script's command line (``train_args``)."""
    # a folder travels as an absolute path (the site script runs in its own workspace), a name as the name
    root = str(client.resolve_bundle_root(bundle)) if (Path(bundle) / "configs").is_dir() else bundle
    args = ["--bundle_root", root, "--local_epochs", str(int(local_epochs))]
    if site_overrides:
        args += ["--site_overrides", str(Path(site_overrides).absolute())]
    if sets:
        args += ["--set", *[f"{k}={_arg_value(k, v)}" for k, v in sets.items()]]
    if send_weight_diff:
        args.append("--send_weight_diff")
    if tuple(eval_configs) != client.DEFAULT_EVAL_CONFIGS:
        args += ["--eval_configs", *eval_configs]
    for arg in args:
        if re.search(r"\s", arg):
            raise ValueError(f"{arg!r} holds white space, which NVFlare's train_args cannot carry")
    return " ".join(args)


def monai_bundle_recipe(
    bundle: str = "unet2d_seg",
    *,
    name: str = DEFAULT_NAME,
    num_rounds: int = 2,
    min_clients: int = 2,
    local_epochs: int = 1,
    sets: Optional[Mapping[str, Any]] = None,
    site_overrides: Optional[os.PathLike] = None,
    eval_configs: Sequence[str] = client.DEFAULT_EVAL_CONFIGS,
    send_weight_diff: bool = False,
    cross_site_eval: bool = False,
    task_request_interval: Optional[float] = None,
):
    """NVFlare's ``FedAvgRecipe`` (``nvflare.app_opt.pt.recipes.fedavg``) with :mod:`fedseg.fl.monai_bundle_client` at
    every site and the bundle's ``network_def`` as the initial model.

    Args:
        bundle: a bundle folder, or the name of one of the suite's bundles (``unet2d_seg``, ``volume_seg``,
            ``unetr_seg``, ``vit_foundation``): a name is resolved at each site, so the job stays relocatable.
        name: the job's name (SimEnv's workspace is ``<workspace_root>/<name>``).
        num_rounds / min_clients: FedAvg's rounds and the sites each round waits for.
        local_epochs: epochs of the bundle's ``train#trainer`` per round.
        sets: ``{config id: value}`` for every site and the initial model (network sizes, ``val_interval``, ...);
            the values must not hold white space.
        site_overrides: a JSON file ``{site: {config id: value}}`` each site reads its entry from (``dataset_dir``).
        eval_configs: the configs of the sites' evaluation workflow (default ``train.json``: the validation split).
        send_weight_diff: sites send trained minus received weights; the server aggregates them as differences.
        cross_site_eval: after the rounds, every site scores the global model and every site's local model
            (NVFlare's ``add_cross_site_evaluation``: the script answers ``submit_model`` and ``validate``); the
            server writes ``cross_site_val/cross_val_results.json``.
        task_request_interval: seconds an idle site waits before asking for its next task; None: the suite's recipes'
            value (``fedseg.recipes.base.TASK_REQUEST_INTERVAL``, 0.05 s, where NVFlare's 2 s default adds up to 2 s to
            every task, cross-site validations included).

    Raises:
        ValueError: an id the bundle does not define, or a value NVFlare's ``train_args`` cannot carry.
        FileNotFoundError: ``site_overrides`` does not exist, or no such bundle.
    """
    from nvflare.apis.dxo import DataKind
    from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe

    if site_overrides and not Path(site_overrides).is_file():
        raise FileNotFoundError(f"site overrides file {site_overrides} does not exist")
    args = script_args(bundle, sets=sets, site_overrides=site_overrides, local_epochs=local_epochs,
                       send_weight_diff=send_weight_diff, eval_configs=eval_configs)
    recipe = FedAvgRecipe(
        name=name,
        model=bundle_network(bundle, sets),
        min_clients=min_clients,
        num_rounds=num_rounds,
        train_script=str(Path(client.__file__).resolve()),
        train_args=args,
        aggregator_data_kind=DataKind.WEIGHT_DIFF if send_weight_diff else DataKind.WEIGHTS,
        key_metric=key_metric(bundle, eval_configs),
    )
    if task_request_interval is None:
        from fedseg.recipes.base import TASK_REQUEST_INTERVAL

        task_request_interval = TASK_REQUEST_INTERVAL
    recipe.add_server_config({"server": {"task_request_interval": float(task_request_interval)}})
    if cross_site_eval:
        from nvflare.recipe import add_cross_site_evaluation

        add_cross_site_evaluation(recipe)
    return recipe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fedseg.recipes.monai_bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default="unet2d_seg", help="bundle folder or name of bundles/ (default unet2d_seg)")
    sites = parser.add_mutually_exclusive_group()
    sites.add_argument("-n", "--num-sites", type=int, default=2, help="sites site-1..site-N (default 2)")
    sites.add_argument("--sites", nargs="+", default=None, help="site names")
    parser.add_argument("--rounds", type=int, default=2, help="FedAvg rounds (default 2)")
    parser.add_argument("--local-epochs", type=int, default=1, help="epochs of train#trainer per round (default 1)")
    parser.add_argument("--site-overrides", default=None, metavar="FILE", help="JSON {site: {config id: value}}")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="ID=VALUE",
                        help="bundle config ids for every site, values read as JSON where possible")
    parser.add_argument("--eval-configs", nargs="+", default=list(client.DEFAULT_EVAL_CONFIGS),
                        help="the sites' evaluation configs (default configs/train.json: the validation split)")
    parser.add_argument("--send-weight-diff", action="store_true", help="sites send weight differences")
    parser.add_argument("--cross-site-eval", action="store_true",
                        help="after the rounds, every site scores the global and every local model")
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"job name (default {DEFAULT_NAME})")
    parser.add_argument("-w", "--workspace", default="workspaces", help="SimEnv's workspace root (the job runs in W/<name>)")
    parser.add_argument("--export", default=None, metavar="DIR", help="write the job folder DIR/<name> and stop")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Build the recipe and run it in NVFlare's ``SimEnv`` (or export it); prints the job's status and result folder."""
    from nvflare.recipe import SimEnv

    args = build_parser().parse_args(argv)
    recipe = monai_bundle_recipe(
        args.bundle, name=args.name, num_rounds=args.rounds, min_clients=len(args.sites) if args.sites else args.num_sites,
        local_epochs=args.local_epochs, sets=parse_assignments(args.set), site_overrides=args.site_overrides,
        eval_configs=args.eval_configs, send_weight_diff=args.send_weight_diff, cross_site_eval=args.cross_site_eval,
    )
    if args.export:
        recipe.export(args.export)
        print(f"exported {Path(args.export) / args.name}")
        return 0
    env = SimEnv(num_clients=0 if args.sites else args.num_sites, clients=args.sites,
                 workspace_root=str(Path(args.workspace).absolute()))
    run = recipe.execute(env)
    print(f"job status: {run.get_status()}")
    print(f"job result: {run.get_result()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
