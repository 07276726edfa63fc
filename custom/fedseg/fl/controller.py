"""The server workflow shared by every method: rounds, per-site payloads, validation, final evaluation.

A method changes only the ``ServerStrategy`` (how results become the next models) and the client
objective (named here and shipped to sites in the task meta). The controller writes ``report.json``,
a markdown summary and plots into the run directory, and after every round ``round_checkpoint.pt``
(``fedseg.fl.checkpoint``) into ``checkpoint_dir``: a job started with the same configuration and a
checkpoint there continues from the round after the checkpoint's instead of starting over.

A run is ``_start`` (sites, strategy, resume), one ``_round`` per round (train task, aggregation, report entry,
checkpoint; its tasks' rejections, bytes, times and screening geometry collect in a ``RoundStats``) and ``_finish``
(final evaluation, report). Where each round's global model is validated for best-round selection is decided by
``fedseg.fl.round_validation.ValidationSchedule``.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.workflows.model_controller import ModelController

from fedseg.bundle import build_network
from fedseg.config import default_task_timeout
from fedseg.fl.checkpoint import load_checkpoint, save_checkpoint
from fedseg.fl.homomorphic import SERVER_CONTEXT as SERVER_CONTEXT_DEFAULT
from fedseg.fl.homomorphic import HEError, ServerAggregation, he_task_meta, load_context, refusal
from fedseg.fl.model_selection import (BEST_VAL_CHECKPOINT, BEST_VAL_MODEL, LOCAL_MODEL, SPLIT_META_KEY, VALIDATION_SPLIT,
                                       BestValidationRound)
from fedseg.fl.payload import payload_dtype, to_wire
from fedseg.fl.protocol import (BASE_STATISTICS, EVALUATE_TASK, META_KEY, RECEIVED_PREFIX, SPATIAL_KEY, SPATIAL_MODE_CODES,
                                SUBMIT_MODEL_TASK, TRAIN_TASK, VALIDATE_RECEIVED_KEY, unpack_models)
from fedseg.fl.report import RunReport
from fedseg.fl.round_validation import Validation, ValidationSchedule
from fedseg.fl.task_clock import TaskClock
from fedseg.fl.task_hold import hold_task_requests
from fedseg.fl.screening import (
    BASE_STATISTIC_RANGES,
    MAIN_MODEL,
    METRIC_RANGES,
    ScreeningConfig,
    check_result,
    check_statistic_ranges,
    duplicated_sites,
    screen_models,
)
from fedseg.fl.validation import (
    InvalidUpdateError,
    to_tensor_params,
    validate_arrays,
    validate_params,
    validate_partial_params,
    validate_statistics,
)
from fedseg.objectives.registry import build_objective
from fedseg.strategies.base import ClientUpdate, SitePayload
from fedseg.strategies.registry import build_strategy
from fedseg.strategies.server_step import ServerStep, server_step_config


#: the server's global model under homomorphic aggregation (ciphertexts in their serialised form), in the run folder
ENCRYPTED_GLOBAL_MODEL = "FL_global_model.he.pt"
#: keys NVFlare's ModelController writes into a result's meta on the server (base_model_controller: the task's
#: meta as "props", and "client_name"); they are not part of what the site sent
NVFLARE_RESULT_META = ("props", "client_name")


@dataclass
class RoundStats:
    """What one round's tasks cost and what the checks on their results saw; every task the round sends adds to it.

    ``rejected``: ``{site: "task: reason"}`` of every result left out; ``bytes_sent`` / ``bytes_received``: payload
    bytes of every task, server -> sites and sites -> server (``payload_bytes``: tensors by size, scalars at 8 bytes, no
    serialisation overhead); ``clock``: each task's send -> last-result seconds and its per-site split
    (``fedseg.fl.task_clock``); ``screening``: ``{task: {site[ model]: {update_norm, update_cosine, model_cosine}}}``,
    what the screening thresholds were compared with; ``started``: the round's start (``time.perf_counter``).
    """

    rejected: Dict[str, str] = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_received: int = 0
    clock: TaskClock = field(default_factory=TaskClock)
    screening: Dict[str, Dict[str, Dict[str, float]]] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    cpu_started: float = field(default_factory=time.process_time)

    def report_fields(self) -> Dict[str, Any]:
        """The round's report fields from these stats (``rounds[]`` of ``report.json``, in the report's order)."""
        return dict(
            rejected=dict(self.rejected),
            # ||w_i - w_sent_i|| and its cosine with the median update, per task and site: what the
            # screening thresholds (config.screening) were compared with
            screening=dict(self.screening),
            wall_time=time.perf_counter() - self.started,
            # CPU seconds of the server process in the round (its aggregation, (de)serialisation, checks): what
            # homomorphic aggregation adds at the server
            server_cpu_time=time.process_time() - self.cpu_started,
            # seconds from sending each task to the last answer: lets a benchmark see what a
            # method's extra task (e.g. FedEvi's evaluate_surrogate) costs within the round
            task_times=self.clock.totals(),
            # each task's median deliver / site / return seconds over sites (fedseg.fl.task_clock)
            task_breakdown=self.clock.breakdown(),
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            # peak resident memory of the server process so far (MiB): how the server scales with K sites
            server_peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        )


class FedSegController(ModelController):
    """Run ``num_rounds`` rounds of a federated segmentation method.

    Args:
        method: name written into the report (e.g. "fedavg", "graphfedseg").
        num_rounds: communication rounds.
        strategy: server strategy name (``fedseg.strategies.registry``).
        strategy_args: options of the strategy.
        server_step: a server optimiser stepping the strategy's global model after every aggregation
            (``fedseg.strategies.server_step.server_step_config`` options: ``server_optimizer`` none | sgd-momentum |
            adam, ``server_lr``, ``server_momentum``, ``server_betas``, ``server_eps``); None = no step.
        objective: client objective name (``fedseg.objectives.registry``), sent to the sites.
        objective_args: options of the objective.
        train_config: hyper-parameters every site trains with (sent in each task's meta).
        min_clients: fewest valid results a round may continue with; fewer stops the job with an error.
        task_timeout: seconds a site may take for one task; None = ``fedseg.config.default_task_timeout``
            of ``train_config``; 0 = wait for ever. A site that does not answer in time is left out of
            that round (``missing`` in the report) and the round finishes with the others.
        task_check_period: how often NVFlare's controller checks task status (seconds); part of the
            per-round framework overhead (benchmarks/cost/framework_overhead.py).
        final_evaluation: evaluate the final global (and personalised) models on every site's test split.
        screening: options of the checks made on every result before aggregation
            (``fedseg.fl.screening.ScreeningConfig``: stale rounds, statistic ranges, all-zero models,
            update norms and directions far from the other sites'); ``None`` = the defaults.
        checkpoint_dir: absolute path of the folder for ``round_checkpoint.pt``; None = the job's run
            directory (lost with the job's workspace: a POC or production server that must survive a
            restart points this at persistent storage).
        cross_site_evaluation: for methods with personalised models, after the final evaluation evaluate
            every site's personalised model on every other site's test split (NVFlare's cross-site
            evaluation convention; ``final.cross_site`` in the report: only the mean metrics leave a site).
        task_request_hold: seconds a site's task request waits on the server for its next task when none is
            there yet (``fedseg.fl.task_hold``); 0 = answered at once with "try again", as NVFlare does (the
            site then asks again after its fetch interval: a fixed 0.5 s in the simulator).
        he: homomorphic aggregation (``fedseg.fl.homomorphic``): ``{"context": the server's TenSEAL context (a name in
            its startup kit, default ``server_context.tenseal``, or an absolute path), "encrypt_layers": None (every
            floating-point entry), a list of names or a regular expression}``; None = models in the clear. The sites
            encrypt what they send and decrypt what they receive; the server sums ciphertexts and stores them.
    """

    def __init__(
        self,
        method: str = "fedavg",
        num_rounds: int = 5,
        strategy: str = "fedavg",
        strategy_args: Optional[Dict[str, Any]] = None,
        server_step: Optional[Dict[str, Any]] = None,
        objective: str = "fedavg",
        objective_args: Optional[Dict[str, Any]] = None,
        train_config: Optional[Dict[str, Any]] = None,
        min_clients: int = 2,
        task_timeout: Optional[int] = None,
        final_evaluation: bool = True,
        task_check_period: float = 0.5,
        persistor_id: str = "persistor",
        screening: Optional[Dict[str, Any]] = None,
        checkpoint_dir: Optional[str] = None,
        cross_site_evaluation: bool = True,
        task_request_hold: float = 0.5,
        he: Optional[Dict[str, Any]] = None,
    ):
        super().__init__(persistor_id=persistor_id, ignore_result_error=True, task_check_period=task_check_period)
        self.task_check_period = float(task_check_period)
        self.method = method
        self.num_rounds = int(num_rounds)
        self.strategy = strategy
        self.strategy_args = dict(strategy_args or {})
        self.objective = objective
        self.objective_args = dict(objective_args or {})
        self.train_config = dict(train_config or {})
        self.min_clients = int(min_clients)
        self.task_timeout = default_task_timeout(self.train_config) if task_timeout is None else int(task_timeout)
        if self.task_timeout < 0:
            raise ValueError(f"task_timeout must be >= 0 seconds (0 = wait for ever), got {task_timeout}")
        self.final_evaluation = bool(final_evaluation)
        if checkpoint_dir is not None and not Path(checkpoint_dir).is_absolute():
            # relative to what? the server's working directory differs between POC, production and simulator
            raise ValueError(f"checkpoint_dir must be an absolute path, got {checkpoint_dir!r}")
        self.checkpoint_dir = checkpoint_dir
        self.cross_site_evaluation = bool(cross_site_evaluation)
        if not (isinstance(task_request_hold, (int, float)) and 0 <= task_request_hold <= 60):
            raise ValueError(f"task_request_hold must be in [0, 60] seconds, got {task_request_hold!r}")
        # a site asking for its next task before the server has sent it waits for it on the server (fl.task_hold)
        self.task_request_hold = float(task_request_hold)
        # fail at job start, not after an hour of training, if a name or an option is wrong
        self._strategy = build_strategy(self.strategy, **self.strategy_args)
        self.server_step = None if server_step is None else dict(server_step)  # None: no entry in the exported job
        self._server_step = server_step_config(**(self.server_step or {}))
        if self._server_step is not None and self.strategy == "fedopt":
            raise ValueError("strategy 'fedopt' (FedAdam, FedAvgM) takes its server step from its own options "
                             "(server_optimizer, server_lr, momentum): leave the job's server_optimizer at 'none'")
        if self._server_step is not None and not self._strategy.has_global_model:
            raise ValueError(f"{self.method}: no global model during training, so no server step applies; "
                             "use server_optimizer=none")
        objective_ = build_objective(self.objective, **self.objective_args)
        self._allowed_statistics = objective_.declared_statistics
        self._weight_tasks = tuple(objective_.weight_tasks)
        # extra models a result may carry for only some entries of the model (SCAFFOLD's control delta)
        self._partial_models = tuple(objective_.partial_models)
        self._declared_arrays = objective_.declared_arrays(self.train_config)
        self.screening = dict(screening or {})
        self._screening = ScreeningConfig.from_options(self.screening)
        self._statistic_ranges = {**BASE_STATISTIC_RANGES, **dict(objective_.statistic_ranges)}
        self._reference: Dict[str, torch.Tensor] = {}
        # wire dtype of the weights this server sends (sites cast theirs themselves); fails here if unknown
        self._payload_dtype = payload_dtype(self.train_config)
        #: each segmentation site's [patch?, rescale] (protocol.SPATIAL_KEY), from its train results
        self._site_spatial: Dict[str, List[float]] = {}
        #: the best round's global model by mean validation metric (train_config eval_best_val_round), else None
        self._selection = BestValidationRound() if self.train_config.get("eval_best_val_round") else None
        #: where each round's global model is validated for that selection (fedseg.fl.round_validation)
        self._validation = ValidationSchedule.for_job(self.train_config, self._strategy.has_global_model,
                                                      self._strategy.evaluates_global, self.final_evaluation)
        self.he = None if he is None else {"context": SERVER_CONTEXT_DEFAULT, "encrypt_layers": None, **dict(he)}
        if self.he is not None:
            reason = refusal(self._strategy, self._server_step, self._payload_dtype)
            if reason:
                raise HEError(f"{self.method} cannot aggregate encrypted models (he): {reason}")
        #: the server's half of homomorphic aggregation (from ``_start``, where its context is loaded), else None
        self._he: Optional[ServerAggregation] = None
        #: the latest round's locally trained models as the sites sent them (train_config eval_local_models), else None
        self._local_models: Optional[Dict[str, Dict[str, torch.Tensor]]] = {} if self.train_config.get("eval_local_models") else None

    # ---------------------------------------------------------------------------------- workflow
    def run(self) -> None:
        hold = hold_task_requests(self.fl_ctx, self.task_request_hold, stop=lambda: self.abort_signal.triggered)
        try:
            self._run()
        finally:
            if hold is not None:
                hold.release()

    def _run(self) -> None:
        clients, report, first_round = self._start()
        for round_ in range(first_round, self.num_rounds):
            if self.abort_signal.triggered:
                return
            self._round(report, clients, round_)
        self._finish(report, clients)

    def _start(self) -> Tuple[List[str], RunReport, int]:
        """Check the sites, start the strategy from the persistor's model, and continue from this job's checkpoint if
        there is one; returns the sites (sorted), the run's report and the first round still to run."""
        initial = self.load_model()
        if self.he is not None:  # before any task: a server that could decrypt, or has no context, never starts
            self._he = ServerAggregation(load_context(self.he["context"], self.fl_ctx), self.he["encrypt_layers"])
        self._attach_train_config()
        self._reference = {k: v.clone() for k, v in to_tensor_params(initial.params).items()}
        clients = sorted(self.sample_clients())
        duplicates = duplicated_sites(clients)
        if duplicates:
            raise RuntimeError(f"duplicated site names {sorted(duplicates)}: every site needs its own name")
        # sent to every site: built-in data whose classes depend on the whole federation (FedEFM's silos)
        self._clients = list(clients)
        if len(clients) < self.min_clients:
            raise RuntimeError(f"{len(clients)} sites connected, the job needs at least {self.min_clients}")
        if getattr(self._strategy, "needs_network", False):
            # strategies that run the sites' models (PathFL's SSA) build the job's own network
            self._strategy.network_factory = lambda: build_network(self.train_config)
        self._strategy.total_rounds = self.num_rounds
        self._strategy.start(clients, self._reference)
        if self._server_step is not None:
            self._strategy.attach_server_step(ServerStep(self._server_step, build_network(self.train_config)))
        # what a train result must hold: every entry, or the shared ones of a method with site-local layers
        shared = self._strategy.shared_keys()
        self._train_reference = self._reference if shared is None else {k: self._reference[k] for k in shared}
        report = RunReport(
            method=self.method,
            clients=clients,
            config=self._effective_config(clients),
        )
        return clients, report, self._resume(report)

    def _round(self, report: RunReport, clients: List[str], round_: int) -> None:
        """One round: the train task, the strategy's aggregation (with the tasks of its own it sends), the round's
        validation where it has a task of its own; then its report entry, the global model and the checkpoint."""
        stats = RoundStats()
        updates = self._train(report, clients, round_, stats)
        if self._local_models is not None:
            self._local_models = {s: u.params for s, u in updates.items()}
        self._attach_train_config()  # now with the spatial settings the sites reported
        fields = self._strategy.aggregate_round(
            round_, updates,
            lambda task, p, r=round_: self._exchange(task, p, r, require_params=task in self._weight_tasks,
                                                     stats=stats),
        )
        if self._validation.after_aggregation() is Validation.OWN_TASK:
            fields["global_val"] = self._validate_global(clients, round_, stats)
            self._selection.offer(round_, fields["global_val"], self._strategy.global_params())
        report.add_round(
            round_,
            metrics={s: u.metrics for s, u in updates.items()},
            missing=[s for s in clients if s not in updates],
            **stats.report_fields(),
            **fields,
        )
        if self._strategy.has_global_model:
            self._persist_global()
        report.write(self.get_run_dir(), plots=False)
        self._checkpoint(report, round_)
        self.info(f"round {round_ + 1}/{self.num_rounds} done: {report.round_summary(round_)}")

    def _train(self, report: RunReport, clients: List[str], round_: int, stats: RoundStats) -> Dict[str, ClientUpdate]:
        """Round ``round_``'s train task; returns the valid results. Where the previous round's global model still
        awaits its validation, it rides on this task (every site receives exactly that model and scores it before it
        trains), or has an evaluate task of its own first (a site receives a model of its own)."""
        payloads = {site: self._strategy.payload(site, round_) for site in clients}
        previous = self._validation.before_train(report.rounds, round_, payloads, self._strategy.global_params)
        if previous is Validation.OWN_TASK:
            self._offer_round(report, round_ - 1, self._validate_global(clients, round_ - 1, stats), self._strategy.global_params())
        elif previous is Validation.WITH_TRAIN_TASK:
            sent_global = self._strategy.global_params()
            payloads = {s: SitePayload(params=p.params, meta={**p.meta, VALIDATE_RECEIVED_KEY: True}) for s, p in payloads.items()}
        updates = self._exchange(TRAIN_TASK, payloads, round_, reference=self._train_reference, stats=stats)
        if previous is Validation.WITH_TRAIN_TASK:
            self._offer_round(report, round_ - 1, received_scores(updates), sent_global)
        return updates

    def _finish(self, report: RunReport, clients: List[str]) -> None:
        """After the last round: its global model's validation where that has a task of its own, the strategy's
        end, the final evaluation, and the report with its summary and plots."""
        if self._validation.after_last_round(report.rounds, self.num_rounds) is Validation.OWN_TASK:
            last = self.num_rounds - 1
            self._offer_round(report, last, self._validate_global(clients, last), self._strategy.global_params())
        finished = self._strategy.finish()
        if finished:
            report.final.update(finished)
        if not self._strategy.has_global_model:
            self.save_model(FLModel(params=self._strategy.global_params(), params_type=ParamsType.FULL))
        if self.final_evaluation:
            self._final_evaluation(report, clients)
        path = report.write(self.get_run_dir(), plots=True)
        self.info(f"report written to {path}")

    # ---------------------------------------------------------------------------------- best-round validation
    def _offer_round(self, report: RunReport, round_: int, scores: Dict[str, float], params) -> None:
        """Record round ``round_``'s validation scores of its global model (``rounds[].global_val``) and offer the
        model to the best-round selection."""
        for entry in report.rounds:
            if entry["round"] == round_:
                entry["global_val"] = dict(scores)
        self._selection.offer(round_, scores, params)

    def _validate_global(self, clients: List[str], round_: int, stats: Optional[RoundStats] = None) -> Dict[str, float]:
        """Every site's validation metric of the current global model by an evaluate task of its own
        (``fedseg.fl.model_selection``). A site that does not answer is left out of the mean; training goes on.
        ``stats``: the round's that the task counts in (None after the last round: not reported)."""
        params = self._strategy.global_params()
        payloads = {s: SitePayload(params=params, meta={"model_name": "global", SPLIT_META_KEY: VALIDATION_SPLIT}) for s in clients}
        results = self._exchange(EVALUATE_TASK, payloads, round_, require_params=False, min_results=0, stats=stats)
        return {s: float(next(iter(u.metrics.values()))) for s, u in sorted(results.items()) if u.metrics}

    # ---------------------------------------------------------------------------------- final phase
    def _final_evaluation(self, report: RunReport, clients: List[str]) -> None:
        """``final.global`` (unless the strategy has no complete global model), ``final.global_best_val`` (the best
        validation round's global model, with ``eval_best_val_round``), ``final.local`` (each site's model of the
        last round as it sent it, with ``eval_local_models``; not after a restart past the last round, which keeps no
        local models), ``final.personalized`` (models held by the strategy, or collected from the sites with
        ``submit_model``) and ``final.cross_site``."""
        if self._strategy.evaluates_global:
            last = self.num_rounds - 1
            validate = self._validation.after_last_round(report.rounds, self.num_rounds) is Validation.WITH_FINAL_EVALUATION
            params = self._strategy.global_params()
            report.final["global"] = self._evaluate({s: params for s in clients}, "global", validate=validate)
            if validate:  # the last round's global model: validated with its test evaluation
                scores = {s: m.pop(k) for s, m in report.final["global"].items() for k in list(m) if k.startswith(RECEIVED_PREFIX)}
                self._offer_round(report, last, scores, params)
        if self._validation.selects and self._selection.params is not None:
            report.final["best_val_round"] = self._selection.best_round
            report.final["best_val_score"] = self._selection.best_score
            report.final[BEST_VAL_MODEL] = self._evaluate({s: self._selection.params for s in clients}, BEST_VAL_MODEL)
            # in the bundle's checkpoint format with the job's train_config, for fedseg infer (like the personalised ones)
            path = Path(self.get_run_dir()) / BEST_VAL_CHECKPOINT
            torch.save({"model": self._storable(self._selection.params), "train_config": self.saved_train_config()}, path)
            report.final["best_val_checkpoint"] = BEST_VAL_CHECKPOINT
        if self._local_models:  # eval_local_models: each site's own last trained model on its own test split
            report.final[LOCAL_MODEL] = self._evaluate(self._local_models, LOCAL_MODEL)
        personalised = self._strategy.personalized_params()
        if personalised is None and self._strategy.personalized_at_sites:
            personalised = self._collect_personalised(clients)
        if personalised:
            report.final["personalized"] = self._evaluate(personalised, "personalized")
            report.final["personalized_checkpoints"] = self._save_personalised(personalised)
            if self.cross_site_evaluation:
                report.final["cross_site"] = self._cross_site(personalised, report.final, clients)

    def _collect_personalised(self, clients: List[str]) -> Dict[str, Dict[str, torch.Tensor]]:
        """Each site's personalised model (task ``submit_model``; validated and screened like a trained model
        against what the strategy would send it). A site that does not answer has none."""
        payloads = {s: self._strategy.payload(s, self.num_rounds) for s in clients}
        results = self._exchange(SUBMIT_MODEL_TASK, payloads, self.num_rounds, require_params=True, min_results=0)
        return {s: results[s].params for s in clients if s in results}

    def _cross_site(self, personalised: Dict[str, Dict[str, torch.Tensor]], final: Dict[str, Any], clients: List[str]) -> Dict[str, Any]:
        """Mean test Dice of every site's personalised model on every site's test split (NVFlare's
        CrossSiteModelEval convention). The diagonal and the global row are the final evaluations already
        made; each off-diagonal row is one broadcast of the owner's model to the other sites.

        Returns ``{"metric", "models" (rows: whose model), "test_sites" (columns: whose test split), "dice":
        rows x columns (None where a site did not answer), "global": the global model's row or None}``."""
        owners = [s for s in clients if s in personalised]
        rows = {m: {} for m in owners}
        for m in owners:
            rows[m][m] = (final.get("personalized", {}).get(m) or {}).get("dice")
            others = [s for s in clients if s != m]
            if not others:
                continue
            meta = {"model_name": f"cross_site_{m}"}
            payloads = {s: SitePayload(params=personalised[m], meta=meta) for s in others}  # one shared task
            results = self._exchange(EVALUATE_TASK, payloads, self.num_rounds, require_params=False, min_results=0)
            rows[m].update({s: float(u.metrics["dice"]) for s, u in results.items() if "dice" in u.metrics})
        global_row = None
        if final.get("global"):
            global_row = [(final["global"].get(s) or {}).get("dice") for s in clients]
        return {
            "metric": "dice",
            "models": owners,
            "test_sites": list(clients),
            "dice": [[rows[m].get(s) for s in clients] for m in owners],
            "global": global_row,
        }

    # ---------------------------------------------------------------------------------- restart
    def _checkpoint_folder(self) -> Path:
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.get_run_dir())

    def _resume(self, report: RunReport) -> int:
        """Load the checkpoint of this job if there is one; returns the first round still to run.

        The strategy (already started with this job's clients) takes the checkpoint's state, the report
        takes its rounds, and ``resumed_at`` records the round this process starts from.
        """
        state = load_checkpoint(self._checkpoint_folder(), report.config)
        if state is None:
            return 0
        if self._he is not None:  # encrypted entries were stored in their serialised form
            state = self._he.decode(state)
        self._strategy.load_state_dict(state["strategy"])
        if self._selection is not None:
            self._selection.load_state_dict(state.get("model_selection"))
        first = int(state["completed_round"]) + 1
        report.rounds = list(state["report"]["rounds"])
        report.resumed_at = list(state["report"]["resumed_at"]) + [first]
        if self._strategy.has_global_model:
            self._persist_global()
        self.info(f"resuming from {self._checkpoint_folder()}: rounds 0..{first - 1} done, continuing at round {first}")
        return first

    def _checkpoint(self, report: RunReport, round_: int) -> None:
        state = self._strategy.state_dict()
        if self._he is not None:
            state = self._he.encode(state)
        save_checkpoint(
            self._checkpoint_folder(),
            config=report.config,
            completed_round=round_,
            # the same tensors as the strategy state's: torch.save stores them once
            global_params=state["global"],
            strategy_state=state,
            rounds=report.rounds,
            resumed_at=report.resumed_at,
            model_selection=self._storable(self._selection.state_dict()) if self._selection is not None else None,
        )

    def _storable(self, value: Any) -> Any:
        """``value`` as written to disk: under HE every ciphertext in its serialised form, else as it is."""
        return self._he.encode(value) if self._he is not None and value is not None else value

    def _persist_global(self) -> None:
        """The global model into ``FL_global_model.pt`` through NVFlare's persistor; under HE the server has ciphertexts
        only, stored as such in ``FL_global_model.he.pt`` (each site keeps the decrypted model it receives)."""
        params = self._strategy.global_params()
        if self._he is None:
            self.save_model(FLModel(params=params, params_type=ParamsType.FULL))
            return
        path = Path(self.get_run_dir()) / ENCRYPTED_GLOBAL_MODEL
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"model": self._he.encode(dict(params)), "train_config": self.saved_train_config()}, tmp)
        tmp.replace(path)

    # ---------------------------------------------------------------------------------- helpers
    def _attach_train_config(self) -> None:
        """Make the persistor write :meth:`saved_train_config` next to ``model`` in ``FL_global_model.pt``, so
        that ``fedseg infer`` builds the network the job trained and runs it the way it was trained."""
        manager = getattr(self.persistor, "persistence_manager", None)
        if manager is not None and isinstance(getattr(manager, "other_props", None), dict):
            manager.other_props["train_config"] = self.saved_train_config()

    def saved_train_config(self) -> Dict[str, Any]:
        """The job's ``train_config`` as stored with its models: where the job left ``spatial_mode`` / ``rescale``
        to the sites' datalists, the value every site reported (``protocol.SPATIAL_KEY``); left unset where
        the sites differ (``fedseg infer`` then asks for it)."""
        cfg = dict(self.train_config)
        reported = list(self._site_spatial.values())
        if not reported:
            return cfg
        names = {code: mode for mode, code in SPATIAL_MODE_CODES.items()}
        modes = {names.get(round(v[0])) for v in reported} - {None}
        rescales = {float(v[1]) for v in reported}
        if cfg.get("spatial_mode") is None and len(modes) == 1:
            cfg["spatial_mode"] = modes.pop()
        if cfg.get("rescale") is None and len(rescales) == 1:
            cfg["rescale"] = rescales.pop()
        return cfg

    def _effective_config(self, clients: List[str]) -> Dict[str, Any]:
        return {
            "num_rounds": self.num_rounds,
            "num_clients": len(clients),
            "min_clients": self.min_clients,
            "task_timeout": self.task_timeout,
            "strategy": self.strategy,
            "objective": self.objective,
            "objective_args": self.objective_args,
            "train_config": self.train_config,
            "screening": self._screening.as_dict(),
            **self._strategy.config(),
            **({"server_step": self._server_step.as_dict()} if self._server_step is not None else {}),
            # under HE the server cannot read a model: the checks on the models themselves (norms, directions, all-zero)
            # are left to the sites, which refuse to encrypt NaN or Inf
            **({"he": {"encrypt_layers": self.he["encrypt_layers"], "model_screening": "off (the server reads no model)"}}
               if self.he is not None else {}),
        }

    def _task_meta(self, round_: int, extra: Dict[str, Any]) -> Dict[str, Any]:
        return {
            META_KEY: {
                "method": self.method,
                "objective": self.objective,
                "objective_args": self.objective_args,
                "train_config": self.train_config,
                "round": round_,
                "total_rounds": self.num_rounds,
                "clients": list(getattr(self, "_clients", [])),
                **({"he": he_task_meta(self.he["encrypt_layers"])} if self.he is not None else {}),
            },
            **extra,
        }

    def _save_personalised(self, models: Dict[str, Dict[str, torch.Tensor]]) -> Dict[str, str]:
        """One checkpoint per site, in the bundle's format ({"model": state_dict}) plus the job's
        ``train_config``, for ``fedseg infer``."""
        out = Path(self.get_run_dir()) / "personalized_models"
        out.mkdir(parents=True, exist_ok=True)
        paths = {}
        for site, params in models.items():
            path = out / f"{site}.pt"
            model = self._storable(dict(params)) if self._he is not None else {k: v.detach().cpu() for k, v in params.items()}
            torch.save({"model": model, "train_config": self.saved_train_config()}, path)
            paths[site] = str(path.relative_to(self.get_run_dir()))
        return paths

    def _evaluate(self, models: Dict[str, Dict[str, torch.Tensor]], model_name: str,
                  validate: bool = False) -> Dict[str, Dict[str, float]]:
        meta = {"model_name": model_name, **({VALIDATE_RECEIVED_KEY: True} if validate else {})}
        payloads = {s: SitePayload(params=p, meta=meta) for s, p in models.items()}
        # personalised models may exist for fewer sites than min_clients (a site that missed the submission)
        minimum = None if model_name in ("global", BEST_VAL_MODEL) else min(self.min_clients, len(models))
        results = self._exchange(EVALUATE_TASK, payloads, self.num_rounds, require_params=False, min_results=minimum)
        return {s: {k: float(v) for k, v in u.metrics.items()} for s, u in sorted(results.items())}

    def _exchange(
        self, task_name: str, payloads: Dict[str, SitePayload], round_: int, require_params: bool = True,
        reference: Optional[Dict[str, torch.Tensor]] = None, min_results: Optional[int] = None,
        stats: Optional[RoundStats] = None,
    ) -> Dict[str, ClientUpdate]:
        """Send each site its payload, wait for all answers (or the timeout), return validated results.

        A broadcast (``broadcast_groups``) goes out as one task, so it costs one serialisation; personalised
        payloads go out as one task per site. ``reference``: the entries a returned model must hold (default: the
        whole global model); ``min_results``: fewest valid results (default ``min_clients``) before the job stops
        with an error; ``stats``: the round's record that this task's rejections, bytes, times and screening
        geometry add to (None outside a round, in the final phase: nothing reports them).
        """
        reference = self._reference if reference is None else reference
        min_results = self.min_clients if min_results is None else int(min_results)
        stats = RoundStats() if stats is None else stats
        started, started_wall = time.perf_counter(), time.time()
        results: Dict[str, ClientUpdate] = {}
        answered: List[str] = []
        handled: List[str] = []
        sent_at: Dict[str, float] = {}

        def reject(site: str, reason: str) -> None:
            self.warning(f"rejected {task_name} result: {reason}")
            stats.rejected[site] = f"{task_name}: {reason}"

        def on_result(result: FLModel) -> bool:
            site = result.meta.get("client_name", "?")
            answered.append(site)
            # NVFlare adds the task's own meta to the result on the server ("props", with e.g. GraphFedSeg's
            # neighbour direction) and the sender's name: neither travelled from the site
            sent_meta = {k: v for k, v in (result.meta or {}).items() if k not in NVFLARE_RESULT_META}
            stats.bytes_received += payload_bytes(result.params) + payload_bytes(sent_meta)
            if site not in payloads:
                reject(site, f"{site}: answered a {task_name} task it was not sent")
                return False
            stats.clock.record(task_name, sent_at.get(site, started_wall), time.time(), result.meta or {})
            try:
                results[site] = self._to_update(site, result, require_params, round_, reference)
                return True
            except InvalidUpdateError as e:
                reject(site, str(e))
                return False
            finally:
                handled.append(site)  # after its result is in `results` (or rejected): the wait below reads this

        self._send(task_name, payloads, round_, on_result, sent_at, stats)
        # done when every site's answer is handled: NVFlare retires a finished task only at its next task check
        # (task_check_period), which would otherwise add up to that period to every task of every round
        expected = set(payloads)
        while self.get_num_standing_tasks() > 0 and not expected <= set(handled):
            if self.abort_signal.triggered:
                raise RuntimeError("job aborted")
            time.sleep(0.005)
        stats.clock.add_total(task_name, time.perf_counter() - started)
        # two answers under one name: neither can be trusted to be the site's own
        for site, count in duplicated_sites(answered).items():
            results.pop(site, None)
            reject(site, f"{site}: duplicated site name: {count} results for one task")
        if require_params and self._he is None:  # under HE the server cannot read the models it would compare
            for site, reason in screen_models(
                {s: {MAIN_MODEL: u.params, **u.models} if u.params else dict(u.models) for s, u in results.items()},
                {s: _named_models(payloads[s].params) for s in results},
                self._screening,
                geometry_out=stats.screening.setdefault(task_name, {}),
            ).items():
                results.pop(site)
                reject(site, reason)
        if len(results) < min_results:
            raise RuntimeError(
                f"task {task_name} round {round_}: only {len(results)} valid results "
                f"({sorted(results)}), fewer than {min_results} (min_clients={self.min_clients})"
            )
        return results

    def _send(self, task_name: str, payloads: Dict[str, SitePayload], round_: int, callback: Callable[[FLModel], bool],
              sent_at: Dict[str, float], stats: RoundStats) -> None:
        """Queue the tasks that carry ``payloads``: each broadcast group as one task where its sites' metas agree,
        else one per site; notes in ``sent_at`` when each site's task went out and counts the bytes sent."""
        for sites in broadcast_groups(payloads):
            first = payloads[sites[0]]
            same_meta = all(_same_meta(payloads[s].meta, first.meta) for s in sites)
            # the group's sites share one parameter object, so one cast (train_config payload_dtype) serves them
            if self._he is not None:  # ciphertexts as their serialised chunks
                wire = self._he.to_wire(first.params) if first.params else first.params
            else:
                wire = to_wire(first.params, self._payload_dtype) if first.params else first.params
            for targets in ([sites] if same_meta else [[s] for s in sites]):
                data = FLModel(
                    params=wire,
                    params_type=ParamsType.FULL,
                    current_round=round_,
                    total_rounds=self.num_rounds,
                    meta=self._task_meta(round_, payloads[targets[0]].meta),
                )
                stats.bytes_sent += len(targets) * (payload_bytes(data.params) + payload_bytes(data.meta))
                sent_at.update(dict.fromkeys(targets, time.time()))  # before the task is serialised and queued
                self.send_model(task_name, data, targets=targets, timeout=self.task_timeout, callback=callback)

    def _to_update(
        self, site: str, result: FLModel, require_params: bool, round_: Optional[int] = None,
        reference: Optional[Dict[str, torch.Tensor]] = None,
    ) -> ClientUpdate:
        """One result checked on its own (``round_``: the task's round; ``None`` skips the stale-round check;
        ``reference``: the entries its main model must hold, default the whole global model)."""
        reference = self._reference if reference is None else reference
        meta = result.meta or {}
        if meta.get("error"):
            raise InvalidUpdateError(f"{site}: the site could not run the task ({meta['error']}; details in its log)")
        params: Dict[str, torch.Tensor] = {}
        models: Dict[str, Dict[str, torch.Tensor]] = {}
        if require_params:
            main, extra = unpack_models(result.params or {})
            if main or not extra:
                params = self._he.read(site, main, reference) if self._he is not None else validate_params(site, main, reference)
            # every packed model (FedEFM's overseas experts) passes the same checks as the main one; a declared
            # partial one (SCAFFOLD's control delta) must hold known entries of the right shapes
            models = {
                name: (validate_partial_params if name in self._partial_models else validate_params)(
                    f"{site} [{name}]", state, self._reference)
                for name, state in extra.items()
            }
        metrics = validate_statistics(site, result.metrics or {}, (result.metrics or {}).keys())
        statistics = validate_statistics(site, meta, self._allowed_statistics)
        statistics.update(validate_arrays(site, meta, self._declared_arrays))
        check_statistic_ranges(site, metrics, METRIC_RANGES)
        base = validate_statistics(site, meta, BASE_STATISTICS)
        check_result(
            site,
            {} if self._he is not None else {MAIN_MODEL: params, **models} if params else models,
            {**statistics, **base},
            self._statistic_ranges,
            # the round the site says it trained for (NVFlare overwrites result.current_round with the task's)
            base.get("round", result.current_round),
            round_,
            self._screening,
        )
        n_samples = int(meta.get("n_samples", 0))
        if require_params and n_samples <= 0:
            raise InvalidUpdateError(f"{site}: result does not say how many training images it used")
        spatial = base.get(SPATIAL_KEY)
        if require_params and isinstance(spatial, (list, tuple)) and len(spatial) == 2:
            self._site_spatial[site] = [float(x) for x in spatial]
        return ClientUpdate(site=site, params=params, n_samples=n_samples, metrics=metrics, meta=statistics, models=models)


def received_scores(updates: Dict[str, ClientUpdate]) -> Dict[str, float]:
    """``{site: validation score of the model it received}`` from results that carry one (``received_*``)."""
    return {s: float(v) for s, u in sorted(updates.items()) for k, v in u.metrics.items() if k.startswith(RECEIVED_PREFIX)}


def payload_bytes(value: Any) -> int:
    """Bytes of a payload: tensors and arrays by their size, numbers at 8 bytes, containers summed."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (bytes, bytearray)):  # a serialised ciphertext
        return len(value)
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v) for v in value)
    return 8 if isinstance(value, (int, float, bool)) else 0


def broadcast_groups(payloads: Mapping[str, SitePayload]) -> List[List[str]]:
    """The sites grouped by the parameter object they are sent, in the order of ``payloads``: the sites of one group
    all receive the same parameters (a broadcast, such as the global model), every other site its own.

    Identity, not equality, is the test. A strategy that broadcasts hands every site the very same dict, so identity
    finds a broadcast without reading a weight, where comparing tensors would read the whole model for every pair of
    sites; and a payload built for one site (a personalised model) stays that site's own task even where its values
    happen to equal another's. The ids are those of objects ``payloads`` holds alive, so no two coincide.
    """
    groups: Dict[int, List[str]] = {}
    for site, payload in payloads.items():
        groups.setdefault(id(payload.params), []).append(site)
    return list(groups.values())


def _named_models(params: Dict[str, Any]) -> Dict[str, Dict[str, torch.Tensor]]:
    """What the server sent a site, ``{model name: params}`` (main model under ``MAIN_MODEL``)."""
    main, extra = unpack_models(params or {})
    named = {name: to_tensor_params(state) for name, state in extra.items()}
    if main:
        named[MAIN_MODEL] = to_tensor_params(main)
    return named


def _same_meta(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Whether two sites can share one task; metas holding arrays are treated as different."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except (ValueError, RuntimeError):  # element-wise comparison of arrays/tensors
        return False
