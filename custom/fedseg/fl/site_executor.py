"""The site executors: how NVFlare hands a task to a site's :class:`fedseg.fl.client.SiteService`.

``FedSegSiteExecutor`` (every exported job) is a native NVFlare ``Executor``: it owns the site's engine,
model, objective and state for the whole job and answers each task inside ``execute`` — no training script,
no exchange queue between an executor and a script, no result polling. That polling was a fixed cost of
every task on the Client API path (benchmarks/cost/framework_overhead.py).

``FedSegScriptExecutor`` is NVFlare's Client API executor pointed at the *installed*
``fedseg/fl/site_script.py``. It serves the same ``SiteService`` through ``flare.receive()/send()`` and is
kept for one purpose: ``execution_mode="external_process"`` runs a site's training in a process of its own,
so a crash there (a CUDA fault, the kernel's out-of-memory killer) leaves the site's NVFlare client
connected and the job answers with the task missing rather than a lost site. Both run one site logic.

``FedSegRanksExecutor`` is the same Client API executor for a site that trains as N ranks (N GPUs of one server):
NVFlare launches ``torchrun --nproc_per_node=N -m fedseg.fl.site_ranks ARGS`` as the site's external trainer; rank 0
talks to NVFlare, every rank joins the training epochs (``fedseg.engine.distributed``). The command is in the job's
config as it will run, so a site can read, and adjust, what it launches.

None carries code in the job: the job folder references ``fedseg`` installed at the site (custom code
— "bring your own code" — is refused by a production deployment, ``deploy/``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from nvflare.apis.event_type import EventType
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal
from nvflare.apis.analytix import AnalyticsDataType
from nvflare.apis.utils.analytix_utils import create_analytic_dxo, send_analytic_dxo
from nvflare.app_common.executors.client_api_executor import ClientAPIExecutor
from nvflare.app_common.utils.fl_model_utils import FLModelUtils
from nvflare.client.config import ExchangeFormat, TransferType
from nvflare.fuel.utils import fobs

from fedseg.fl.tracking import tracked_metrics

# fedseg.fl.client (torch, MONAI) is imported where a site trains: the Client API executors below only launch a
# trainer, in this process (site_script) or another (torchrun), so a worker that serves them does not import it

#: the Client API site entry inside the installed package (``python -m fedseg.fl.client`` does the same)
INSTALLED_SITE_SCRIPT = Path(__file__).resolve().parent / "site_script.py"


class FedSegSiteExecutor(Executor):
    """Native site executor: every task of every method answered in-process by one ``SiteService``.

    Args:
        script_args: the site's command-line options (``fedseg.fl.client.parse_args``), e.g.
            ``--site_datalists sites.json``; the same string the Client API script would receive.
    """

    def __init__(self, script_args: str = ""):
        from fedseg.fl.client import parse_args

        super().__init__()
        self.script_args = script_args  # recipe export records constructor args stored as self.<name>
        self._args = parse_args(shlex.split(script_args))  # a bad option fails when the job is built
        self._service = None  # the site's fedseg.fl.client.SiteService, from START_RUN on

    def handle_event(self, event_type: str, fl_ctx: FLContext) -> None:
        if event_type == EventType.START_RUN:
            # params travel as torch tensors (the server's persistor registers the same decomposer)
            from nvflare.app_opt.pt.decomposers import TensorDecomposer

            from fedseg.fl.client import SiteService, set_site_threads

            fobs.register(TensorDecomposer)
            set_site_threads()
            self._service = SiteService(fl_ctx.get_identity_name(), self._args)
            # a homomorphic job loads the site's TenSEAL context from its startup kit through NVFlare
            self._service.runner.fl_ctx = fl_ctx

    def execute(self, task_name: str, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        if self._service is None:  # START_RUN never came: not a state a task can be answered in
            self.log_error(fl_ctx, "site executor was not started (no START_RUN event)")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        try:
            received = FLModelUtils.from_shareable(shareable, fl_ctx)
        except Exception as e:
            self.log_error(fl_ctx, f"task {task_name}: cannot read the task data ({type(e).__name__})")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        if abort_signal.triggered:
            return make_reply(ReturnCode.TASK_ABORTED)
        from fedseg.fl.client import result_model

        out = self._service.answer(task_name, received.params or {}, received.meta or {}, received.current_round)
        self._track(tracked_metrics(task_name, out["metrics"], received.meta or {}), int(received.current_round or 0), fl_ctx)
        return FLModelUtils.to_shareable(result_model(out, received.current_round))

    def _track(self, scalars: dict, step: int, fl_ctx: FLContext) -> None:
        """Training metrics of a round and final test metrics as NVFlare analytics events (the job's tracking
        receivers: TensorBoard, MLflow; ``fedseg.fl.tracking``)."""
        for tag, value in scalars.items():
            dxo = create_analytic_dxo(tag=tag, value=value, data_type=AnalyticsDataType.SCALAR, global_step=step)
            send_analytic_dxo(self, dxo, fl_ctx)


class FedSegScriptExecutor(ClientAPIExecutor):
    """NVFlare Client API executor running the installed ``fedseg.fl.site_script`` (see the module docstring).

    Args:
        script_args: command-line arguments for the site script (``fedseg.fl.client.parse_args``).
        execution_mode: ``"in_process"`` or ``"external_process"`` (training in its own process).
    """

    def __init__(self, script_args: str = "", execution_mode: str = "in_process"):
        if not INSTALLED_SITE_SCRIPT.is_file():
            raise FileNotFoundError(
                f"the installed fedseg package has no site entry {INSTALLED_SITE_SCRIPT}; reinstall fedseg at this site"
            )
        super().__init__(
            execution_mode=execution_mode,
            # an absolute path: NVFlare's TaskScriptRunner uses it as is instead of searching app/custom/
            task_script_path=str(INSTALLED_SITE_SCRIPT),
            task_script_args=script_args,
            params_exchange_format=ExchangeFormat.PYTORCH,
            server_expected_format=ExchangeFormat.PYTORCH,
            params_transfer_type=TransferType.FULL,
        )
        self.script_args = script_args


#: the module torchrun starts on every rank of a site (``fedseg/fl/site_ranks.py`` in the installed package)
RANKS_SITE_MODULE = "fedseg.fl.site_ranks"


def torchrun_command(site_ranks: int, script_args: str = "") -> str:
    """``torchrun --standalone --nnodes=1 --nproc_per_node=N -m fedseg.fl.site_ranks ARGS``: N ranks on this machine,
    the rendezvous on a free local port (``--standalone``: several sites or jobs on one machine do not collide).

    Raises:
        ValueError: ``site_ranks`` is not a positive integer.
    """
    from fedseg.fl.client import parse_args

    if isinstance(site_ranks, bool) or not isinstance(site_ranks, int) or site_ranks < 1:
        raise ValueError(f"site_ranks must be a positive integer, got {site_ranks!r}")
    parse_args(shlex.split(script_args))  # a bad site option fails when the job is built
    launcher = ["torchrun", "--standalone", "--nnodes=1", f"--nproc_per_node={site_ranks}", "-m", RANKS_SITE_MODULE]
    return shlex.join(launcher + shlex.split(script_args))


class FedSegRanksExecutor(ClientAPIExecutor):
    """NVFlare Client API executor launching a site's N training ranks under torchrun (module docstring).

    Args:
        command: the launch command, :func:`torchrun_command` (the recipe writes it from ``site_ranks`` and
            ``script_args``); it runs in the site's app folder with NVFlare's trainer bootstrap in its environment.
        launch_timeout: seconds the ranks may take to start and rank 0 to reach NVFlare.
    """

    def __init__(self, command: str, launch_timeout: float = 300.0):
        if not isinstance(command, str) or not command.strip():
            raise ValueError("FedSegRanksExecutor needs a launch command (fedseg.fl.site_executor.torchrun_command)")
        super().__init__(
            execution_mode="external_process",
            command=command,
            launch_once=True,  # one group of ranks for the whole job: engines, caches and optimisers persist
            launch_timeout=launch_timeout,
            params_exchange_format=ExchangeFormat.PYTORCH,
            server_expected_format=ExchangeFormat.PYTORCH,
            params_transfer_type=TransferType.FULL,
        )
        self.command = command
