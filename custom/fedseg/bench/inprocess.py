"""The real server workflow (``FedSegController.run``) with NVFlare's transport replaced by direct calls to
in-process sites (``SiteService``): validation, screening, aggregation, final and cross-site evaluation and the
report run as in a job, in one process and without NVFlare's polling. Used by the tests (seconds per run, site
restarts on demand) and by ``benchmarks/cost/baseline_cost.py`` (each method's site and server work without the
framework's fixed cost). The simulator tests cover NVFlare's transport itself."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional

from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fedseg.fl.client import SiteService, result_model
from fedseg.fl.controller import FedSegController
from fedseg.recipes.base import build_initial_network
from fedseg.recipes.export import export_job


def controller_args(method: str, tmp: Path, **recipe_args) -> Dict:
    """The controller's arguments as ``fedseg export`` writes them for ``method`` (tiny profile by default)."""
    recipe_args.setdefault("profile", "tiny")
    job = export_job(method, tmp / "job_export", **recipe_args)
    config = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    (args,) = [w["args"] for w in config["workflows"] if w["path"].endswith("FedSegController")]
    return args


class InProcessController(FedSegController):
    """``FedSegController`` whose tasks are answered by in-process ``SiteService`` objects (one per site)."""

    def __init__(self, sites: Dict[str, str], run_dir: Path, workspace: Path, restart_before: Optional[int] = None,
                 forget: Optional[str] = None, he_site_context: Optional[str] = None, **kwargs):
        """``restart_before``: every site process is replaced by a fresh one (same workspace) before the train task
        of that round; ``forget``: and the named state file (``fedseg_state/<site>/<forget>``) is deleted first;
        ``he_site_context``: the sites' TenSEAL context (homomorphic aggregation; an absolute path)."""
        kwargs.setdefault("min_clients", len(sites))
        super().__init__(**kwargs)
        self.he_site_context = he_site_context
        self.sites = sites
        self.run_dir = Path(run_dir)
        self.workspace = Path(workspace)
        self.restart_before, self.forget, self.restarted = restart_before, forget, False
        self.services = self._start_sites()
        self.saved: List[Dict] = []
        self.sent: List[Dict] = []  # (task, targets, params keys) of every task
        #: what every site answered: task, site, round, its parameter names and its meta keys (what left the site)
        self.received: List[Dict] = []
        self.abort_signal = SimpleNamespace(triggered=False)
        self.log = logging.getLogger("inprocess")

    def _start_sites(self) -> Dict[str, SiteService]:
        return {
            s: SiteService(s, argparse.Namespace(datalist=str(p), site_datalists=None, data_root=None, bundle_dir=None,
                                                 he_context=self.he_site_context),
                           workspace=str(self.workspace / s))
            for s, p in self.sites.items()
        }

    # --- what NVFlare provides to a ModelController -----------------------------------------------
    def load_model(self):
        return FLModel(params=build_initial_network(self.train_config).state_dict(), params_type=ParamsType.FULL)

    def _attach_train_config(self) -> None:
        pass

    def sample_clients(self, num_clients=None):
        return list(self.sites)

    def get_run_dir(self):
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return str(self.run_dir)

    def save_model(self, model):
        self.saved.append({k: v for k, v in model.params.items()})

    def send_model(self, task_name, data, targets=None, timeout=0, callback=None):
        self.sent.append({"task": task_name, "targets": list(targets), "keys": sorted(data.params or {}), "meta": data.meta})
        if task_name == "train" and data.current_round == self.restart_before and not self.restarted:
            self.restarted = True
            if self.forget:
                for site in self.sites:
                    (self.workspace / site / "fedseg_state" / site / self.forget).unlink()
            self.services = self._start_sites()  # the old site processes are gone; their workspaces stay
        for site in targets:
            out = self.services[site].answer(task_name, dict(data.params or {}), dict(data.meta or {}), data.current_round)
            result = result_model(out, data.current_round)
            self.received.append({"task": task_name, "site": site, "round": data.current_round,
                                  "params": sorted(result.params or {}), "meta": sorted(result.meta or {})})
            result.meta = {**result.meta, "client_name": site}
            callback(result)

    def get_num_standing_tasks(self):
        return 0

    def info(self, msg, *a, **k):
        self.log.info(msg)

    def warning(self, msg, *a, **k):
        self.log.warning(msg)


def run_in_process(method: str, sites: Dict[str, str], tmp: Path, restart_before: Optional[int] = None,
                   forget: Optional[str] = None, **recipe_args) -> Dict:
    """Run ``method`` (its exported controller arguments) on ``sites`` in process; returns the report dict
    plus ``_controller`` (for inspection)."""
    args = controller_args(method, tmp, **recipe_args)
    controller = InProcessController(sites, tmp / "server", tmp / "sites", restart_before=restart_before, forget=forget,
                                     he_site_context=recipe_args.get("he_site_context"), **args)
    controller.run()
    report = json.loads((tmp / "server" / "report.json").read_text())
    return {**report, "_controller": controller}
