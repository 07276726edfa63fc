"""A Client API site script that trains a MONAI bundle with MONAI's own federated client, ``monai.fl.client.MonaiAlgo``.

This is the integration NVIDIA FLARE documents for MONAI bundles (NVFlare's ``examples/advanced/monai``): the bundle's
``train.json`` runs as it is, through ``ConfigWorkflow`` — its ``train#trainer`` (a ``SupervisedTrainer``) trains, its
``validate#evaluator`` scores — and NVFlare only moves weights. fedseg's engines and objectives are not involved, so
the method is plain FedAvg (``fedseg.recipes.monai_bundle`` builds NVFlare's ``FedAvgRecipe`` around this script).

Every round, at each site::

    received FLModel.params (the global state_dict)  -> ExchangeObject(weights=...)
    MonaiAlgo.evaluate(global)                       -> the bundle's validate#key_metric of the *received* model
    MonaiAlgo.train(global)                          -> local_epochs epochs of train#trainer from those weights
    MonaiAlgo.get_weights()                          -> the trained state_dict (or its difference to the global one)
    sent FLModel: params, metrics = the received model's evaluation (NVFlare's model selector reads its key metric),
                  meta NUM_STEPS_CURRENT_ROUND = iterations trained (FedAvg's weight)

A cross-site ``validate`` task is answered with ``MonaiAlgo.evaluate`` alone; ``submit_model`` with the local weights.

What a site needs comes as arguments (the job is the same for every site): ``--bundle_root`` (a bundle folder, or the
name of one of the suite's bundles, ``unet2d_seg``, resolved by :func:`fedseg.bundle.default_bundle_dir` at the site),
``--set ID=VALUE`` for every site (bundle config ids, values read as JSON where possible: ``--set image_size=64
channels=[16,32,64,128,256]``) and ``--site_overrides FILE``, a JSON object ``{site name: {config id: value}}`` whose
entry for this site wins (its ``dataset_dir``). The bundle's writers (``ckpt_dir``, ``output_dir``) point into
``<site workspace>/fedseg_outputs/<site>/<bundle name>/`` unless an override sets them, so nothing is written into
the bundle folder; the received model's metrics of every round are appended to ``evaluation.jsonl`` there.

NVFlare splits ``train_args`` on white space: values and paths must not contain spaces.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from fedseg.bench.runs import parse_assignments
from fedseg.bundle import WRITER_IDS, read_site_overrides

logger = logging.getLogger("fedseg.fl.monai_bundle_client")

#: the evaluation config MonaiAlgo reads by default here: train.json alone, whose validate#evaluator scores the
#: datalist's validation split (MonaiAlgo's own default, train.json + evaluate.json, scores our bundles' test split,
#: which must not choose the global model)
DEFAULT_EVAL_CONFIGS = ("configs/train.json",)
#: one line per evaluated global model at each site
EVALUATION_LOG = "evaluation.jsonl"


def resolve_bundle_root(bundle: str) -> Path:
    """A bundle folder as given, else one of the suite's bundles by name (``unet2d_seg``, ...).

    Raises:
        FileNotFoundError: neither a folder with ``configs/`` nor a known bundle name.
    """
    path = Path(bundle)
    if (path / "configs").is_dir():
        return path.resolve()
    if os.sep in bundle or "/" in bundle:
        raise FileNotFoundError(f"bundle folder {bundle} has no configs/")
    from fedseg.bundle import default_bundle_dir

    return default_bundle_dir(bundle).resolve()


def site_overrides(bundle_root: Path, config_files: Sequence[str], sets: Mapping[str, Any], site_values: Mapping[str, Any],
                   workdir: Path) -> Dict[str, Any]:
    """The ids this site's ``ConfigWorkflow`` s get: the writers in ``workdir``, then ``sets``, then ``site_values``.

    Raises:
        ValueError: an override names an id none of ``config_files`` defines (``ConfigParser.update`` would add it
            silently, and a mistyped id would leave the value it meant to change as it was).
    """
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(bundle_root / f) for f in config_files])
    unknown = sorted(k for k in {**sets, **site_values} if k not in parser)
    if unknown:
        raise ValueError(f"bundle {bundle_root} has no config id {unknown} (--set / --site_overrides)")
    writers = {key: str(workdir / sub) for key, sub in WRITER_IDS.items() if key in parser}
    return {**writers, **sets, **site_values}


def plain_numbers(values: Mapping[Any, Any]) -> Dict[str, Any]:
    """``{str key: float}`` of the numeric entries of ``values`` (MONAI's metrics and statistics may be tensors and
    their keys enums; what goes to NVFlare is plain). Non-finite values are kept: a NaN Dice is a fact to report."""
    out = {}
    for key, value in values.items():
        name = str(getattr(key, "value", key))
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class BundleSite:
    """One site's ``MonaiAlgo`` over a bundle, with the overrides and writers this script sets.

    Args:
        site: the site's name (MonaiAlgo's ``CLIENT_NAME``).
        bundle_root: the bundle folder.
        overrides: ``{config id: value}`` for the train and evaluation workflows (:func:`site_overrides`).
        local_epochs: epochs of ``train#trainer`` per round.
        send_weight_diff: send the trained weights minus the received ones (NVFlare ``ParamsType.DIFF``).
        eval_configs: the evaluation workflow's configs, relative to the bundle (train type: its
            ``validate#evaluator`` scores).
        workdir: where :data:`EVALUATION_LOG` is written.
    """

    def __init__(self, site: str, bundle_root: Path, overrides: Mapping[str, Any], local_epochs: int = 1,
                 send_weight_diff: bool = False, eval_configs: Sequence[str] = DEFAULT_EVAL_CONFIGS,
                 workdir: Optional[Path] = None):
        from monai.fl.client import MonaiAlgo
        from monai.fl.utils.constants import ExtraItems

        self.site = site
        self.workdir = Path(workdir) if workdir is not None else None
        self.algo = MonaiAlgo(
            bundle_root=str(bundle_root),
            local_epochs=int(local_epochs),
            send_weight_diff=bool(send_weight_diff),
            config_train_filename="configs/train.json",
            train_kwargs=dict(overrides),
            config_evaluate_filename=list(eval_configs),
            eval_kwargs=dict(overrides),
            # the received weights are the model: a CheckpointLoader in the configs must not replace them
            disable_ckpt_loading=True,
        )
        # APP_ROOT "": bundle_root is used as given (MonaiAlgo joins the two); logging stays as the site set it
        self.algo.initialize(extra={ExtraItems.CLIENT_NAME: site, ExtraItems.APP_ROOT: "", ExtraItems.LOGGING_FILE: False})

    @staticmethod
    def _exchange(params: Mapping[str, Any]):
        from monai.fl.utils.exchange_object import ExchangeObject

        return ExchangeObject(weights=dict(params))

    def evaluate(self, params: Mapping[str, Any], round_: Optional[int] = None, model: str = "global") -> Dict[str, float]:
        """The evaluation workflow's metrics of ``params`` (a state_dict), recorded in :data:`EVALUATION_LOG`."""
        metrics = plain_numbers(self.algo.evaluate(self._exchange(params)).metrics or {})
        logger.info("%s: %s model of round %s: %s", self.site, model, round_, metrics)
        if self.workdir is not None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            line = {"site": self.site, "round": round_, "model": model, "metrics": {k: v if math.isfinite(v) else None for k, v in metrics.items()}}
            with open(self.workdir / EVALUATION_LOG, "a") as f:
                f.write(json.dumps(line) + "\n")
        return metrics

    def train(self, params: Mapping[str, Any]):
        """Train ``local_epochs`` epochs from ``params``; returns ``(weights, statistics)``: the state_dict (or its
        difference to ``params``) on the CPU and MonaiAlgo's training statistics, ``num_executed_iterations`` among them."""
        self.algo.train(self._exchange(params))
        result = self.algo.get_weights()
        return dict(result.weights), plain_numbers(result.statistics or {})

    def local_weights(self) -> Dict[str, Any]:
        """The trainer's network as it is now, on the CPU."""
        return {k: v.detach().cpu() for k, v in self.algo.trainer.network.state_dict().items()}

    def finalize(self) -> None:
        self.algo.finalize()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="monai_bundle_client.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle_root", required=True, help="bundle folder, or a name of bundles/ (unet2d_seg, ...)")
    parser.add_argument("--site_overrides", default=None, help="JSON file {site: {config id: value}}")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="ID=VALUE",
                        help="bundle config ids for every site, values as JSON where possible")
    parser.add_argument("--local_epochs", type=int, default=1, help="epochs of train#trainer per round")
    parser.add_argument("--send_weight_diff", action="store_true", help="send weight differences (ParamsType.DIFF)")
    parser.add_argument("--eval_configs", nargs="+", default=list(DEFAULT_EVAL_CONFIGS),
                        help="evaluation configs relative to the bundle (train type: validate#evaluator scores)")
    parser.add_argument("--workdir", default=None,
                        help="where the bundle writes (default <cwd>/fedseg_outputs/<site>/<bundle name>)")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    """The Client API loop: receive, evaluate and train (``train``), evaluate (``validate``), send."""
    import nvflare.client as flare
    import torch
    from nvflare.app_common.abstract.fl_model import FLMetaKey

    args = parse_args(argv)
    if os.environ.get("FEDSEG_NUM_THREADS"):  # several sites sharing one machine (simulator, POC)
        torch.set_num_threads(int(os.environ["FEDSEG_NUM_THREADS"]))
    flare.init()
    site = flare.get_site_name()
    root = resolve_bundle_root(args.bundle_root)
    workdir = Path(args.workdir) if args.workdir else Path.cwd() / "fedseg_outputs" / site / root.name
    configs = ["configs/train.json", *[c for c in args.eval_configs if c != "configs/train.json"]]
    overrides = site_overrides(root, configs, parse_assignments(args.set), read_site_overrides(args.site_overrides, site), workdir)
    logger.info("%s: MONAI bundle %s with %s", site, root, overrides)
    bundle = BundleSite(site, root, overrides, args.local_epochs, args.send_weight_diff, args.eval_configs, workdir)
    try:
        while flare.is_running():
            received = flare.receive()
            if received is None:
                break
            round_ = received.current_round
            if flare.is_train():
                metrics = bundle.evaluate(received.params, round_)
                weights, statistics = bundle.train(received.params)
                steps = int(statistics.get("num_executed_iterations", 0))
                flare.send(flare.FLModel(
                    params=weights,
                    params_type=flare.ParamsType.DIFF if args.send_weight_diff else flare.ParamsType.FULL,
                    metrics=metrics,
                    meta={FLMetaKey.NUM_STEPS_CURRENT_ROUND: steps, "train_statistics": statistics},
                    current_round=round_,
                ))
            elif flare.is_evaluate():
                flare.send(flare.FLModel(metrics=bundle.evaluate(received.params, round_, model="received"),
                                         current_round=round_))
            elif flare.is_submit_model():
                flare.send(flare.FLModel(params=bundle.local_weights(), params_type=flare.ParamsType.FULL))
            else:
                raise ValueError(f"{site}: unknown task {flare.get_task_name()!r}")
    finally:
        bundle.finalize()


if __name__ == "__main__":
    main()
