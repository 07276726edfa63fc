"""The recipe every method shares: one controller + one site script, configured by name and options.

A method's recipe module only gives its strategy's and objective's options and a ``paper`` profile; the method table
(``fedseg.methods``) names the strategy and the objective.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from nvflare.app_opt.pt.job_config.base_fed_job import BaseFedJob
from nvflare.recipe.spec import ExecEnv, Recipe

from fedseg.bundle import build_network, bundle_network_fields, is_bundle_path
from fedseg.config import BASE_TRAIN_CONFIG, default_task_timeout, resolve_profile
from fedseg.fl.audit import ResultAuditFilter
from fedseg.fl.controller import FedSegController
from fedseg.fl.homomorphic import SERVER_CONTEXT, HEError
from fedseg.fl.protocol import EVALUATE_TASK, TRAIN_TASK
from fedseg.fl.site_executor import FedSegRanksExecutor, FedSegScriptExecutor, FedSegSiteExecutor, torchrun_command
from fedseg.method_options import JobOptions, nearest_name, unknown_options
from fedseg.methods import get_method
from fedseg.objectives.registry import OBJECTIVES
from fedseg.processes import Stopped, stopping
from fedseg.recipes.environments import ExecEnvError, deployment_failure, prepare_env
from fedseg.recipes.tracking import add_tensorboard
from fedseg.strategies.registry import get_strategy_class
from fedseg.strategies.server_step import DEFAULT_SERVER_MOMENTUM, server_step_config

#: ``site_executor`` option -> how a site receives its tasks (``fedseg.fl.site_executor``), from the sites'
#: ``script_args`` and ``site_ranks``
SITE_EXECUTORS = {
    "native": lambda args, ranks: FedSegSiteExecutor(args),
    "client_api": lambda args, ranks: FedSegScriptExecutor(args, execution_mode="in_process"),
    "client_api_external": lambda args, ranks: FedSegScriptExecutor(args, execution_mode="external_process"),
    # local training as N ranks (N GPUs of one server) under torchrun: fedseg.engine.distributed
    "client_api_torchrun": lambda args, ranks: FedSegRanksExecutor(torchrun_command(ranks, args)),
}

#: the executors that run a site's training as ``site_ranks`` processes
RANKED_EXECUTORS = ("client_api_torchrun",)


class SiteScript:
    """Adds the site executor to a job (native by default; ``fedseg.fl.site_executor``).

    Nothing is copied into ``app/custom/``: a job that carries code is "bring your own code" (BYOC), which
    a production deployment refuses (``deploy/``). The executors run the fedseg package installed at the
    site, so the exported job is configuration only and relocatable.
    """

    def __init__(self, script_args: str = "", executor: str = "native", site_ranks: int = 1):
        if executor not in SITE_EXECUTORS:
            raise ValueError(f"site_executor must be one of {sorted(SITE_EXECUTORS)}, got {executor!r}")
        if site_ranks != 1 and executor not in RANKED_EXECUTORS:
            # a job asking for N ranks per site that would train in one process is a mistake, not a preference
            raise ValueError(f"site_ranks={site_ranks!r} needs site_executor in {RANKED_EXECUTORS}, got {executor!r}")
        self.script_args = script_args
        self.executor = executor
        self.site_ranks = site_ranks
        self._executor = SITE_EXECUTORS[executor](script_args, site_ranks)  # bad options fail when the job is built

    def add_to_fed_job(self, job, ctx, **kwargs):
        job.add_executor(self._executor, tasks=["*"], ctx=ctx)
        return {}


#: seconds a site waits before asking the server for its next task: a task waits at the server for half of it on
#: average before a site picks it up (a few small messages a second per idle site; NVFlare's own default is 2 s)
TASK_REQUEST_INTERVAL = 0.05

def homomorphic_job_args(he: bool, encrypt_layers: Any, server_context: str, site_context: Optional[str],
                         site_executor: str, script_args: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """``(the controller's he argument, the sites' script arguments)`` of a job with homomorphic aggregation or
    without (``(None, script_args)``); a site context given as a path (the simulator's keys) goes to every site.

    Raises:
        HEError: a site executor other than the native one (the one that encrypts and decrypts).
    """
    if not he:
        return None, script_args
    if site_executor != "native":
        raise HEError(f"he: the sites decrypt and encrypt in the native executor only, got site_executor={site_executor!r}")
    if site_context:
        script_args = f"{script_args} --he_context {site_context}".strip()
    return {"context": server_context, "encrypt_layers": encrypt_layers}, script_args


def build_initial_network(train_config: Dict[str, Any]):
    """The bundle's network with the job's overrides — the same constructor (and ``init_seed``) the sites use."""
    return build_network(train_config)


class FedSegRecipe(Recipe):
    """NVFlare Job Recipe for one federated segmentation method: exported as a job folder (``fedseg export``:
    ``jobs/<method>``) or run as it is in an execution environment, ``recipe.execute(SimEnv(...))`` (or ``PocEnv``,
    ``ProdEnv``; ``jobs/job.py``). The job carries no code; every participant runs its installed fedseg.

    A method's recipe names the options of its strategy and objective it takes (:attr:`strategy_options`,
    :attr:`objective_options`: their dataclasses own the defaults), takes them out of its keywords
    (:meth:`method_args`), and passes its name, those arguments, its ``profile``, ``PAPER_PROFILES``, ``num_rounds`` and
    the other keywords as it received them; this class resolves the training configuration from them.

    Args:
        name: job name (also the exported folder's job name).
        method: method name recorded in report.json; its row of the method table (``fedseg.methods``) names the
            server strategy and the client objective the job runs.
        strategy_args / objective_args: the strategy's and the objective's options.
        profile: a base profile (``fedseg.config.PROFILES``: "default", "tiny", ...) or one of ``profiles``.
        profiles: the method's own profiles (its ``PAPER_PROFILES``), beside and over the base ones.
        num_rounds: communication rounds; None = the profile's.
        **train_overrides: training hyper-parameters over the profile's (``fedseg.config.BASE_TRAIN_CONFIG`` keys;
            a None value keeps the profile's). The effective ones are ``self.train_config``.
        min_clients: sites needed to start, and fewest valid results a round may continue with.
        task_timeout: seconds a site may take for one task before it is left out of that round; None =
            ``fedseg.config.default_task_timeout(train_config)`` (written into the exported job); 0 = no limit.
        script_args: the sites' command-line options (e.g. ``--site_datalists sites.json``).
        site_executor: "native" (default: ``FedSegSiteExecutor``), "client_api" or "client_api_external"
            (NVFlare's Client API running the site script in-process or in a process of its own), or
            "client_api_torchrun": the site's local training as ``site_ranks`` processes, one per GPU, launched by
            ``torchrun`` (``fedseg.engine.distributed``).
        site_ranks: N, the ranks (GPUs) each site trains with under "client_api_torchrun" (default 1).
        screening: checks on every result before aggregation (``fedseg.fl.screening.ScreeningConfig`` fields,
            e.g. ``{"norm_factor": 5, "max_update_norm": 50}``); ``None`` = the documented defaults.
        checkpoint_dir: absolute folder for the server's ``round_checkpoint.pt`` (None: the run directory);
            a job re-submitted with the same folder resumes after the last completed round.
        task_request_interval: seconds an idle site waits before asking the server for a task again (NVFlare's
            server setting, default here 0.05: a task waits half of it on average before a site picks it up; a
            production deployment with many sites may raise it, benchmarks/cost/framework_overhead.py).
        server_optimizer: a server step on the global model the method's aggregation produces
            (``fedseg.strategies.server_step``): "none" (default: the method as published), "sgd-momentum"
            (FedAvgM's heavy ball) or "adam" (FedAdam's); with ``server_lr`` (1.0), ``server_momentum`` (0.6),
            ``server_betas`` ((0.9, 0.99)) and ``server_eps`` (1e-3).
        he: homomorphic aggregation (``fedseg.fl.homomorphic``): the sites send CKKS-encrypted models, the server sums
            ciphertexts with plaintext weights and never holds a secret key. Methods whose server step reads the
            models (GraphFedSeg, FedCE, FedAdam/FedAvgM, a server optimiser, median screening, ...) refuse it here
            with one line saying why. Keys as NVFlare's ``HEBuilder`` provisions them (POC, production).
        he_encrypt_layers: which floating-point entries the sites encrypt: None (all, default), a list of names or a
            regular expression (NVFlare's ``encrypt_layers``); the others travel in the clear.
        he_server_context / he_site_context: the TenSEAL contexts, by name in the startup kits (default NVFlare's
            ``server_context.tenseal`` / ``client_context.tenseal``) or as absolute paths (the simulator's keys,
            ``fedseg.fl.homomorphic.provision_contexts``).
    """

    #: the options of the method's strategy this recipe takes as keywords and writes into its job (None: none)
    strategy_options: Optional[JobOptions] = None
    #: the same for the method's objective
    objective_options: Optional[JobOptions] = None
    #: False for a method whose local training does not go through DP-SGD (Ditto's two models, FedRep's alternating
    #: updates): a job setting ``dp_target_epsilon`` is refused before anything is built
    supports_dp: bool = True

    @classmethod
    def method_options(cls) -> Dict[str, inspect.Parameter]:
        """The recipe's own keywords: the strategy's and the objective's options it takes, with their defaults (an
        option both halves take, once)."""
        offered: Dict[str, inspect.Parameter] = {}
        for options in (cls.strategy_options, cls.objective_options):
            for name, parameter in (options.offered() if options is not None else {}).items():
                offered.setdefault(name, parameter)
        return offered

    @classmethod
    def method_args(cls, options: Dict[str, Any], profile_values: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """``{"strategy_args", "objective_args"}`` of the job from a recipe's keywords ``options``, whose method options
        (:meth:`method_options`) are taken out of it; the rest are the shared job and training options.
        ``profile_values``: the profile's values of method options over their defaults (GraphFedSeg's ``paper``
        profile runs the authors' code); a keyword given as None keeps the profile's value (``JobOptions.job_args``).

        Raises:
            ValueError / TypeError: a value the strategy's or the objective's options refuse (before any site starts).
        """
        offered = cls.method_options()
        given = {name: options.pop(name) for name in offered if name in options}
        # a misspelt method option would otherwise be refused as an unknown train_config key
        misspelt = [k for k in options if k not in BASE_TRAIN_CONFIG and k not in RECIPE_KEYWORDS
                    and nearest_name(k, [*offered, *BASE_TRAIN_CONFIG]) in offered]
        if misspelt:
            raise unknown_options(cls.__name__, misspelt, offered, error=ValueError)
        return {key: job.job_args(given, profile_values) if job is not None else None
                for key, job in (("strategy_args", cls.strategy_options), ("objective_args", cls.objective_options))}

    def __init__(
        self,
        *,
        name: str,
        method: str,
        strategy_args: Optional[Dict[str, Any]] = None,
        objective_args: Optional[Dict[str, Any]] = None,
        profile: str = "default",
        profiles: Optional[Mapping[str, Dict[str, Any]]] = None,
        num_rounds: Optional[int] = None,
        min_clients: int = 2,
        task_timeout: Optional[int] = None,
        task_check_period: float = 0.5,
        script_args: str = "",
        site_executor: str = "native",
        site_ranks: int = 1,
        screening: Optional[Dict[str, Any]] = None,
        checkpoint_dir: Optional[str] = None,
        task_request_interval: float = TASK_REQUEST_INTERVAL,
        server_optimizer: str = "none",
        server_lr: float = 1.0,
        server_momentum: float = DEFAULT_SERVER_MOMENTUM,
        server_betas: Sequence[float] = (0.9, 0.99),
        server_eps: float = 1e-3,
        he: bool = False,
        he_encrypt_layers: Optional[Any] = None,
        he_server_context: str = SERVER_CONTEXT,
        he_site_context: Optional[str] = None,
        **train_overrides: Any,
    ):
        if not (isinstance(task_request_interval, (int, float)) and 0 < task_request_interval <= 60):
            raise ValueError(f"task_request_interval must be in (0, 60] seconds, got {task_request_interval!r}")
        spec = get_method(method)
        if not self.supports_dp and train_overrides.get("dp_target_epsilon") is not None:
            raise ValueError(f"{spec.title} does not support differential privacy (dp_target_epsilon)")
        strategy, objective = spec.strategy, spec.objective
        OBJECTIVES.target(objective)  # an objective no site could build fails here, not at the sites
        resolved = resolve_profile(profile, profiles, num_rounds, **train_overrides)
        self.check_train_config(resolved["train_config"])
        num_rounds = resolved["num_rounds"]
        self.name = name
        self.method = method
        self.train_config = dict(resolved["train_config"])
        initial_network = build_initial_network(self.train_config)
        if is_bundle_path(self.train_config.get("bundle")):
            # a user's bundle: one absolute path in the job, and what the server checks of its network
            self.train_config["bundle"] = str(Path(self.train_config["bundle"]).resolve())
            self.train_config.update(bundle_network_fields(self.train_config, initial_network))
        step_options = {"server_optimizer": server_optimizer, "server_lr": server_lr, "server_momentum": server_momentum,
                        "server_betas": list(server_betas), "server_eps": server_eps}
        step = server_step_config(**step_options)  # fails here on a wrong name or value
        he_args, script_args = homomorphic_job_args(he, he_encrypt_layers, he_server_context, he_site_context,
                                                    site_executor, script_args)
        user_bundle = is_bundle_path(self.train_config.get("bundle"))
        job = BaseFedJob(
            # a user's network is described by its bundle, which NVFlare's persistor builds (networks/bundle_network.py)
            initial_model=None if user_bundle else initial_network,
            name=name,
            min_clients=min_clients,
            key_metric=None,
        )
        controller = FedSegController(
            method=method,
            num_rounds=num_rounds,
            strategy=strategy,
            strategy_args=strategy_args,
            # the job's JSON records the options the step reads (none: no entry, the method as published)
            server_step=None if step is None else {k: v for k, v in step_options.items() if k in step.as_dict()},
            objective=objective,
            objective_args=objective_args,
            train_config=self.train_config,
            min_clients=min_clients,
            task_timeout=default_task_timeout(self.train_config) if task_timeout is None else task_timeout,
            task_check_period=task_check_period,
            screening=screening,
            checkpoint_dir=checkpoint_dir,
            he=he_args,  # the strategy's refusal (GraphFedSeg, FedCE, ...) is raised here, before anything is exported
        )
        if user_bundle:
            from nvflare.app_opt.pt.job_config.model import PTModel

            from fedseg.networks.bundle_network import bundle_network_component

            job.comp_ids.update(job.to_server(PTModel(model=bundle_network_component(self.train_config))))
        # sites ask for their next task every task_request_interval seconds (NVFlare default 2 s): the
        # largest cut in per-round framework overhead we measured (benchmarks/cost/framework_overhead.py)
        job.to_server({"server": {"task_request_interval": float(task_request_interval)}})
        # fedseg is an installed package at every site: reference it, don't copy its source into the job
        job.set_app_packages(["fedseg"])
        job.to_server(controller, id="controller")
        job.to_clients(SiteScript(script_args, site_executor, site_ranks))
        super().__init__(job)
        # every result a site sends is summarised (names/shapes, never values) into privacy_audit.jsonl
        # (NVFlare filter tables have no wildcard: list every task this method uses)
        tasks = [TRAIN_TASK, EVALUATE_TASK] + list(get_strategy_class(strategy).extra_tasks)
        self.add_server_input_filter(ResultAuditFilter(), tasks=tasks)
        # the sites' metric curves in TensorBoard, through NVFlare's recipe utility (fedseg.recipes.tracking:
        # MLflow can be added beside it)
        add_tensorboard(self)

    def check_train_config(self, train_config: Dict[str, Any]) -> None:
        """Refuse a resolved training configuration the method cannot train (before anything is built); a method's
        recipe overrides it (PathFL: 2-D only). Raises ValueError."""

    def process_env(self, env: ExecEnv) -> None:
        """Ready ``env`` for this job before NVFlare deploys it (NVFlare calls this in ``run`` / ``execute``): in
        ``SimEnv`` fedseg's component allow list goes into the simulated workspace; ``PocEnv`` and ``ProdEnv`` are checked
        (the POC project's site policy, the admin's startup kit) — ``fedseg.recipes.environments``.

        Raises:
            ExecEnvError: the environment cannot run this job as it is (one line naming the fix).
        """
        prepare_env(env, self.name)

    def run(self, env: ExecEnv, server_exec_params: Optional[dict] = None, client_exec_params: Optional[dict] = None):
        """NVFlare's ``Recipe.run``; a deployment that fails raises :class:`ExecEnvError` saying what to do next."""
        try:
            return super().run(env, server_exec_params=server_exec_params, client_exec_params=client_exec_params)
        except ExecEnvError:
            raise
        except Exception as e:  # noqa: BLE001 - explained for the environments we know, re-raised as is otherwise
            if stopping() is not None:  # NVFlare's simulator turns the stop signal into a failed run (status -9)
                raise Stopped(stopping()) from e
            explained = deployment_failure(env, self.name, e)
            if explained is None:
                raise
            raise explained from e


#: the keywords :class:`FedSegRecipe` takes itself (the job's options); a recipe's other keywords are its method's
#: options and ``train_config`` keys
RECIPE_KEYWORDS = frozenset(inspect.signature(FedSegRecipe.__init__).parameters) - {"self", "train_overrides"}
