"""The site side of every job: receive a task, run it with the engine and the method's objective, reply.

What leaves the site (``FLModel`` sent back):
  * train:    the trained weights, ``metrics`` {train_loss, steps, the engine's validation metrics:
              val_dice (segmentation) or val_accuracy (classification)}, ``meta`` {n_samples, round} plus
              the objective's declared statistics;
  * evaluate: ``metrics`` of the received model on the test split ({dice, hd95, assd} or {accuracy,
              balanced_accuracy, accuracy_class_<k>}), nothing else (the per-image values stay in ``<site workspace>/fedseg_outputs/<site>/per_image_<model>.json``);
              with ``split: "validation"`` in the task meta (best-round model selection), only the engine's
              validation metric of the received model;
  * weight tasks (the objective's ``weight_tasks``, e.g. FedEFM's overseas training and gossip): weights
    (main and/or extra named models, ``fedseg.fl.protocol.pack_models``), ``meta`` {n_samples, round} plus
    declared statistics;
  * other tasks (method-specific): the objective's declared statistics only.
Images, labels, predictions and overlays stay in the site's workspace, and so does the site's training
state (``fedseg.engine.site_state``: optimiser, data order; saved after every training task once the process has
trained, restored by a restarted process before its first training).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from fedseg.bundle import is_bundle_path, read_site_overrides
from fedseg.config import validation_due
from fedseg.data.checks import check_datalist
from fedseg.engine.base import LocalEngine
from fedseg.engine.distributed import ENGINE, RankGroup, RanksOutOfStep
from fedseg.engine.factory import build_engine, resolve_task
from fedseg.engine.site_state import SiteState, job_key
from fedseg.fl.faults import FAULT_ENV, apply_faults, faults_for
from fedseg.fl.homomorphic import SITE_CONTEXT, SiteEncryption, load_context
from fedseg.fl.model_selection import SPLIT_META_KEY, VALIDATION_SPLIT
from fedseg.fl.payload import from_wire, payload_dtype, to_wire
from fedseg.fl.protocol import (BASE_STATISTICS, EVALUATE_TASK, META_KEY, RECEIVED_PREFIX, SPATIAL_KEY, SPATIAL_MODE_CODES,
                                TRAIN_TASK, VALIDATE_RECEIVED_KEY, pack_models, unpack_models)
from fedseg.fl.site_data import resolve_site_datalist
from fedseg.fl.task_clock import TASK_CLOCK_KEY
from fedseg.objectives.base import RoundContext, UnknownTaskError
from fedseg.objectives.registry import build_objective

logger = logging.getLogger(__name__)

#: under homomorphic aggregation, the models a site keeps decrypted in ``<workspace>/fedseg_outputs/<site>/`` (the
#: server stores ciphertexts only): evaluated model name -> file
DECRYPTED_MODELS = {"global": "global_model.pt", "global_best_val": "best_val_model.pt"}


class SiteRunner:
    """Holds a site's engine, model and objective across tasks (built on the first task).

    ``ranks``: the site trains as N ranks and this is rank 0 (``fedseg.engine.distributed``): every engine built
    here is built on the other ranks too, and joins their training epochs; everything else runs here only.
    """

    def __init__(self, site: str, args: argparse.Namespace, workspace: Optional[str] = None,
                 ranks: Optional[RankGroup] = None):
        self.site = site
        self.args = args
        self.ranks = ranks
        self.workspace = Path(workspace or os.getcwd())
        self.output_dir = self.workspace / "fedseg_outputs" / site
        self.state_dir = self.workspace / "fedseg_state" / site
        self.engine: Optional[LocalEngine] = None
        self.model: Optional[torch.nn.Module] = None
        self.objective = None
        self.site_state: Optional[SiteState] = None
        self._trained = False
        self._setup_key: Optional[str] = None
        #: NVFlare's context of the site's run (set by the native executor): a TenSEAL context named by its file in
        #: the startup kit is loaded through it (signed content)
        self.fl_ctx = None
        #: this site's half of homomorphic aggregation, loaded with the first task that asks for it
        self._he: Optional[SiteEncryption] = None

    def _setup(self, job: Dict[str, Any]) -> None:
        key = repr((job["objective"], job["objective_args"], job["train_config"]))
        if key == self._setup_key:
            return
        cfg = job["train_config"]
        if is_bundle_path(cfg.get("bundle")):
            self._setup_bundle(job, key)
            return
        datalist = resolve_site_datalist(
            self.site, cfg, self.args.datalist, self.args.site_datalists, self.args.data_root, str(self.workspace),
            clients=job.get("clients"),
        )
        logger.info("%s: training on %s", self.site, datalist)
        if resolve_task(datalist, cfg) == "segmentation":
            # bad files (outside the datalist's folder, 3-D in a 2-D job or 2-D in a volume job, image / label geometries
            # that differ, tiny, huge, unknown modes) fail here, before training,
            # with the file named in this site's log; the server only learns the error type (DatalistError).
            # Paths and headers only: SegEngine's load_datalist decodes every pair next
            from fedseg.data.datalist import read_datalist_json
            from fedseg.data.volumes import is_volume_job

            check_datalist(datalist, decode=False, volumes=is_volume_job(cfg, read_datalist_json(datalist)[1]))
        # the task (train_config / datalist) picks the engine; one site logic for every task
        # a foundation checkpoint is read by the server into the initial global model: a site receives those
        # weights with its first task and needs no copy of the file
        site_cfg = {**cfg, "foundation_ckpt": None}
        device = None if self.ranks is None else self.ranks.device
        self.engine = build_engine(self.site, datalist, site_cfg, bundle_dir=self.args.bundle_dir, device=device)
        if self.ranks is not None:
            if self.ranks.world_size > 1:  # the datalist is resolved (built-in data generated) here, then read there
                self.ranks.send(ENGINE, (self.site, str(datalist), site_cfg, self.args.bundle_dir))
            self.engine.ranks = self.ranks
        self._finish_setup(job, key)

    def _finish_setup(self, job: Dict[str, Any], key: str) -> None:
        """The network, objective and site state of a freshly built engine."""
        self.model = self.engine.build_network()
        logger.info("%s: engine on device %s", self.site, self.engine.device)
        self.objective = build_objective(job["objective"], **job["objective_args"])
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.site_state = SiteState(self.state_dir, job_key(job["objective"], job["objective_args"], job["train_config"]))
        self._trained = False
        self._setup_key = key

    def _setup_bundle(self, job: Dict[str, Any], key: str) -> None:
        """A user's MONAI bundle: its data come from the bundle (``dataset_dir``), with this site's overrides
        (``--site_overrides FILE``: ``{site: {config id: value}}``) over the job's; the bundle's writers point into this
        site's workspace. The overrides stay here: they name local folders."""
        cfg = job["train_config"]
        site_cfg = {**cfg, "bundle_overrides": {**(cfg.get("bundle_overrides") or {}), **read_site_overrides(self.args.site_overrides, self.site)},
                    "bundle_writers_dir": str(self.output_dir / "bundle")}
        logger.info("%s: training on the MONAI bundle %s", self.site, self.args.bundle_dir or cfg["bundle"])
        if self.ranks is not None:
            raise ValueError(f"{self.site}: a user's bundle trains in one process per site (site_ranks 1)")
        self.engine = build_engine(self.site, None, site_cfg, bundle_dir=self.args.bundle_dir)
        self._finish_setup(job, key)

    def handle(self, task: str, params: Dict[str, Any], meta: Dict[str, Any]) -> Dict[str, Any]:
        """Run one task; returns ``{"params", "metrics", "meta"}`` — exactly what will be sent.

        The site state is saved after a training task, before anything is sent: what the server received
        is always already in the state a restarted process resumes from."""
        job = meta[META_KEY]
        self._setup(job)
        he = self._encryption(job)
        if he is not None:  # homomorphic aggregation: decrypt what arrives, encrypt what leaves
            out = self._run(task, he.decrypt(params, self.model.state_dict()), meta, job)
            self._keep_decrypted(task, meta, job)
            out["params"] = he.encrypt(out["params"])
        else:
            # weights may travel in float16/bfloat16 (train_config payload_dtype); the site computes in float32
            out = self._run(task, from_wire(params), meta, job)
            out["params"] = to_wire(out["params"], payload_dtype(job["train_config"]))
        # only training tasks change the optimiser and the data order (evaluate and statistic tasks do not)
        if self._trained and (task == TRAIN_TASK or task in self.objective.weight_tasks):
            self.site_state.save(int(job["round"]), self.engine.make_optimizer(self.model), self.engine.shuffle_generator)
        return out

    def _encryption(self, job: Dict[str, Any]) -> Optional[SiteEncryption]:
        """The site's encryption when the job aggregates homomorphically (``job["he"]``), else None; its context is
        ``--he_context`` (default NVFlare's ``client_context.tenseal`` in the startup kit)."""
        spec = job.get("he")
        if spec is None:
            return None
        if self._he is None or self._he.encrypt_layers != spec.get("encrypt_layers"):
            context = load_context(getattr(self.args, "he_context", None) or SITE_CONTEXT, self.fl_ctx)
            self._he = SiteEncryption(context, self.site, spec.get("encrypt_layers"))
        return self._he

    def _keep_decrypted(self, task: str, meta: Dict[str, Any], job: Dict[str, Any]) -> None:
        """Under HE the server holds the global model as ciphertexts only: the site keeps the final global model (and
        the best validation round's) it decrypted, in the bundle's checkpoint format, for ``fedseg infer``."""
        name = meta.get("model_name")
        if task != EVALUATE_TASK or meta.get(SPLIT_META_KEY) == VALIDATION_SPLIT or name not in DECRYPTED_MODELS:
            return
        path = self.output_dir / DECRYPTED_MODELS[name]
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        torch.save({"model": state, "train_config": dict(job["train_config"])}, path)

    def _run(self, task: str, params: Dict[str, Any], meta: Dict[str, Any], job: Dict[str, Any]) -> Dict[str, Any]:
        known = (TRAIN_TASK, EVALUATE_TASK) + tuple(self.objective.weight_tasks) + tuple(self.objective.statistic_tasks)
        if task not in known:  # before touching the model: the server and this site disagree on the method
            raise UnknownTaskError(f"{self.site}: method {job['objective']!r} has no task {task!r} (known: {known})")
        main, extra = unpack_models(params)
        if main or not extra:  # a task may carry only extra models (FedEFM's overseas training)
            self._load_received({k: torch.as_tensor(v) for k, v in main.items()})
        ctx = RoundContext(
            site=self.site,
            round=int(job["round"]),
            total_rounds=int(job["total_rounds"]),
            server_meta=meta,
            train_config=job["train_config"],
            state_dir=str(self.state_dir),
            models={name: {k: torch.as_tensor(v) for k, v in state.items()} for name, state in extra.items()},
            job_key=self.site_state.key,
        )
        # the received model's validation score, asked for with the task (one task per round: best-round selection)
        validation_started = time.perf_counter()
        received = self._received_validation() if meta.get(VALIDATE_RECEIVED_KEY) else {}
        validation_seconds = time.perf_counter() - validation_started
        if task == TRAIN_TASK:
            out = self._train(ctx)
        elif task == EVALUATE_TASK:
            if meta.get(SPLIT_META_KEY) == VALIDATION_SPLIT:  # model selection: the validation metric only
                return {"params": {}, "metrics": self.engine.validation_metrics(self.model), "meta": {}}
            out = self._evaluate(meta.get("model_name", "global"), ctx.round)
        else:
            out = None
        if out is not None:
            out["metrics"].update(received)
            if received and "compute_time" in out["metrics"]:
                out["metrics"]["compute_time"] += validation_seconds  # the site's work in this task, validation included
            return out
        if task in self.objective.weight_tasks:
            weights, models, statistics = self.objective.handle_weight_task(task, ctx, self.model, self.engine)
            params = pack_models(
                {n: {k: v.detach().cpu().clone() for k, v in m.items()} for n, m in models.items()},
                main={k: v.detach().cpu().clone() for k, v in weights.items()},
            )
            meta = {"n_samples": self.engine.n_train, "round": ctx.round, **self._declared(statistics)}
            return {"params": params, "metrics": {}, "meta": meta}
        statistics = self.objective.handle_task(task, ctx, self.model, self.engine)  # a statistic task
        return {"params": {}, "metrics": {}, "meta": self._declared(statistics)}

    def _received_validation(self) -> Dict[str, float]:
        """The engine's validation metrics of the model as received, under ``received_<name>``."""
        return {RECEIVED_PREFIX + k: float(v) for k, v in self.engine.validation_metrics(self.model).items()}

    def _train(self, ctx: RoundContext) -> Dict[str, Any]:
        started = time.perf_counter()
        # a restarted process: Adam moments and data order as they were after the site's last earlier round
        restored = self.site_state.restore(ctx.round, self.engine.make_optimizer(self.model), self.engine.shuffle_generator)
        self.objective.begin_round(ctx, self.model)
        metrics = self.objective.local_training(self.engine, self.model, ctx)
        self._trained = True
        if restored is not None:
            metrics["state_restored_from_round"] = float(restored)
        if validation_due(ctx.train_config, ctx.round, ctx.total_rounds):
            metrics.update(self.engine.validation_metrics(self.model))
        statistics = self._declared(self.objective.end_round(ctx, self.model, self.engine))
        if ctx.round == ctx.total_rounds - 1:
            self.objective.save_site_figures(str(self.output_dir), ctx)
        # a copy: the sent tensors must not alias the live model the next task trains in place; entries the
        # objective keeps local (FedBN's norms, FedRep's head) stay here
        local = set(self.objective.local_state_keys(self.model))
        params = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items() if k not in local}
        extra = self.objective.outgoing_models(ctx)  # e.g. SCAFFOLD's control delta, under its own name
        if extra:
            params = pack_models({n: {k: torch.as_tensor(v).detach().cpu().clone() for k, v in m.items()} for n, m in extra.items()},
                                 main=params)
        # seconds of site compute this task (lets the benchmark separate framework overhead)
        metrics["compute_time"] = time.perf_counter() - started
        # peak resident memory of this site process so far (MiB; Linux reports KiB) for the benchmarks
        metrics["peak_memory_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        meta = {"n_samples": self.engine.n_train, "round": ctx.round, **self._spatial(), **statistics}
        return {"params": params, "metrics": metrics, "meta": meta}

    def _spatial(self) -> Dict[str, Any]:
        """``{SPATIAL_KEY: [mode code, rescale]}`` of a segmentation engine (the mode its datalist or the job chose;
        codes in ``protocol.SPATIAL_MODE_CODES``)."""
        if getattr(self.engine, "spatial_mode", None) is None:
            return {}
        return {SPATIAL_KEY: [SPATIAL_MODE_CODES[self.engine.spatial_mode], float(self.engine.train_config["rescale"])]}

    def _load_received(self, params: Dict[str, torch.Tensor]) -> None:
        """Load received weights; they may lack exactly the entries the objective keeps local (which then
        keep their values here: the objective restores them from its own state)."""
        own = self.model.state_dict()
        missing, unexpected = sorted(set(own) - set(params)), sorted(set(params) - set(own))
        local = set(self.objective.local_state_keys(self.model))
        if unexpected or not set(missing) <= local:
            raise ValueError(f"{self.site}: received weights do not fit the model: missing {[k for k in missing if k not in local][:5]}, "
                             f"unexpected {unexpected[:5]}")
        self.model.load_state_dict(params, strict=not missing)

    def _evaluate(self, model_name: str, round_: Optional[int] = None) -> Dict[str, Any]:
        metrics, rows = self.engine.evaluate(self.model, "test", per_image=True)
        # per-image results stay in this site's workspace (paired tests by ``fedseg bench``); only the
        # summary metrics are sent
        self.write_per_image(model_name, round_, rows)
        # site-local figures (segmentation overlays): written into this site's workspace, never sent
        self.engine.save_evaluation_figures(self.model, self.output_dir, model_name)
        return {"params": {}, "metrics": metrics, "meta": {}}

    def per_image_path(self, model_name: str) -> Path:
        """``<workspace>/fedseg_outputs/<site>/per_image_<model_name>.json`` (site-local, never sent)."""
        return self.output_dir / f"per_image_{model_name}.json"

    def write_per_image(self, model_name: str, round_: Optional[int], rows: list) -> Path:
        path = self.per_image_path(model_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"site": self.site, "model": model_name, "split": "test", "round": round_, "rows": rows}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)
        return path

    def _declared(self, statistics: Dict[str, Any]) -> Dict[str, Any]:
        allowed = set(self.objective.declared_statistics) | set(BASE_STATISTICS)
        allowed |= set(self.objective.declared_arrays(self.engine.train_config))
        undeclared = sorted(set(statistics) - allowed)
        if undeclared:
            raise ValueError(f"{self.site}: objective {self.objective.name!r} tried to send undeclared statistics {undeclared}")
        return statistics


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="fedseg site client (run by NVFlare)")
    parser.add_argument("--datalist", default=None, help="this site's datalist JSON")
    parser.add_argument("--site_datalists", default=None, help="JSON file mapping site name -> datalist JSON")
    parser.add_argument("--data_root", default=None, help="where built-in synthetic data is generated")
    parser.add_argument("--bundle_dir", default=None, help="MONAI bundle folder (default bundles/unet2d_seg; with a user's "
                        "bundle: where it is at this site, default the job's path)")
    parser.add_argument("--site_overrides", default=None,
                        help="a user's bundle: JSON file mapping site name -> {bundle config id: value} (dataset_dir, ...)")
    parser.add_argument("--he_context", default=None,
                        help="homomorphic aggregation: this site's TenSEAL context with the secret key (default "
                        "client_context.tenseal in its startup kit, as NVFlare's HEBuilder provisions it; an absolute "
                        "path: keys written for the simulator)")
    return parser.parse_args(argv)


class SiteService:
    """One site's answer to each task, whichever NVFlare executor delivers it.

    Wraps :class:`SiteRunner` with what every delivery path must do alike: a failed task is answered with
    the exception's type only (its message may name local files), and the test-only fault injection
    (``fedseg.fl.faults``) distorts the result last. ``fedseg.fl.site_executor`` (the native executor every
    job uses) and :func:`main` (the Client API script) both call :meth:`answer`.
    """

    def __init__(self, site: str, args: argparse.Namespace, workspace: Optional[str] = None,
                 ranks: Optional[RankGroup] = None):
        self.site = site
        self.runner = SiteRunner(site, args, workspace=workspace, ranks=ranks)
        self.faults = faults_for(site)  # test-only (FEDSEG_FAULT_INJECTION); empty in any real run
        if self.faults:
            logger.warning("%s: %s is set: this site will send faulty results (%s)", site, FAULT_ENV, self.faults)

    def answer(self, task: str, params: Dict[str, Any], meta: Dict[str, Any], current_round: Optional[int]) -> Dict[str, Any]:
        """``{"params", "metrics", "meta"}`` to send for ``task``; never raises."""
        # fault injection measures its distortions from what the site received; keep a copy, since the
        # received tensors may be reused by the time the result is built
        sent = {k: torch.as_tensor(v).clone() for k, v in (params or {}).items()} if self.faults else {}
        started_at = time.time()
        try:
            out = self.runner.handle(task, params or {}, meta or {})
        except RanksOutOfStep:  # the site's other ranks cannot follow another task: end the site script
            raise
        except Exception as e:  # keep serving: the server leaves this site out of the round
            logger.exception("%s: task %s failed", self.site, task)
            # only the exception type travels; its message may name local files (patient ids)
            out = {"params": {}, "metrics": {}, "meta": {"error": type(e).__name__}}
        if self.faults:
            out = apply_faults(self.faults, task, int(current_round or 0), out, sent)
        # when the task reached this site and when its answer was ready: the server splits its round trip
        # into delivery, site work and return with it (fedseg.fl.task_clock)
        out["meta"] = {**out.get("meta", {}), TASK_CLOCK_KEY: [started_at, time.time()]}
        return out


def result_model(out: Dict[str, Any], current_round: Optional[int]):
    """The ``FLModel`` a site sends for ``SiteService.answer``'s ``out`` (both executors send this)."""
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    return FLModel(params=out["params"], params_type=ParamsType.FULL, metrics=out["metrics"], meta=out["meta"],
                   current_round=current_round)


def set_site_threads() -> None:
    """Torch threads from ``FEDSEG_NUM_THREADS`` (several sites sharing one machine: simulator, POC)."""
    if os.environ.get("FEDSEG_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["FEDSEG_NUM_THREADS"]))


def main(argv=None) -> None:
    """The Client API site loop (``fedseg.fl.site_executor.FedSegScriptExecutor``): receive, answer, send."""
    args = parse_args(argv)
    set_site_threads()
    serve_client_api(args)


def serve_client_api(args: argparse.Namespace, ranks: Optional[RankGroup] = None) -> None:
    """Receive, answer and send until NVFlare ends the job (``ranks``: this is rank 0 of a site's ranks)."""
    import nvflare.client as flare
    from nvflare.client.tracking import SummaryWriter

    from fedseg.fl.tracking import tracked_metrics

    flare.init()
    service = SiteService(flare.get_site_name(), args, ranks=ranks)
    writer = SummaryWriter()
    while flare.is_running():
        received = flare.receive()
        if received is None:
            break
        task = flare.get_task_name()
        out = service.answer(task, received.params or {}, received.meta or {}, received.current_round)
        step = int(received.current_round or 0)
        for tag, value in tracked_metrics(task, out["metrics"], received.meta or {}).items():
            writer.add_scalar(tag, value, global_step=step)
        flare.send(result_model(out, received.current_round))
