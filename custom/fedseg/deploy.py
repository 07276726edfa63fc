"""NVFlare provisioning builders for fedseg deployments (``deploy/project.yml``, ``poc_workspace/project.yml``).

A project file lists them after NVFlare's ``StaticFileBuilder`` (which writes the files they edit); they run in
the ``nvflare provision`` / ``nvflare poc prepare`` process, so fedseg must be installed where kits are made.

* :class:`SitePolicyBuilder` — every server/site kit gets ``local/resources.json.default`` with the fedseg
  ``class_allow_list`` (fedseg jobs carry no code, so NVFlare builds only allow-listed components, see
  ``fedseg.fl.component_policy``) and, when given, ``local/authorization.json.default`` (who may do what;
  the deployment's policy turns custom code — the ``byoc`` right — off for every role).
* :class:`LoopbackServerBuilder` — the server's ``fed_server.json`` target becomes a loopback address, so
  the server listens on loopback only (POC: everything on one machine) instead of every interface.
* :class:`JobSchedulerBuilder` — how often the server's job scheduler retries a submitted job that cannot start yet
  (NVFlare waits 10 s; in POC a job is usually submitted before its sites have connected).
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from nvflare.lighter.spec import Builder, Project, ProvisionContext

from fedseg.fl.component_policy import add_to_resources

RESOURCES_DEFAULT = "resources.json.default"
AUTHORIZATION_DEFAULT = "authorization.json.default"
FED_SERVER_JSON = "fed_server.json"
BYOC_RIGHT = "byoc"


def parse_authorization(policy: Dict[str, Any], site_org: str = "any_org"):
    """NVFlare's own parser of ``authorization.json`` (``FLAuthorizer``); raises ValueError naming the problem."""
    from nvflare.security.security import FLAuthorizer

    try:
        return FLAuthorizer(site_org, policy)
    except (SyntaxError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"invalid authorization policy: {e}") from None


class SitePolicyBuilder(Builder):
    """Writes the fedseg component allow list (and optionally the authorization policy) into every server/site kit.

    Args:
        authorization: an ``authorization.json`` policy (``{"format_version": "1.0", "permissions": {...}}``) for
            every server and site; None keeps NVFlare's default policy (where ``project_admin`` and ``lead`` may
            submit custom code).
        extra_class_allow_list: more class paths / package prefixes a site allows beyond fedseg's.
    """

    def __init__(self, authorization: Optional[Dict[str, Any]] = None, extra_class_allow_list: Iterable[str] = ()):
        if authorization is not None:
            parse_authorization(authorization)  # fail at provisioning, not when the server starts
        self.authorization = authorization
        self.extra_class_allow_list = list(extra_class_allow_list or ())

    def build(self, project: Project, ctx: ProvisionContext):
        sites = [project.get_server(), *project.get_clients()]
        for participant in sites:
            if participant is None:
                continue
            local_dir = ctx.get_local_dir(participant)
            add_to_resources(os.path.join(local_dir, RESOURCES_DEFAULT), self.extra_class_allow_list)
            if self.authorization is not None:
                with open(os.path.join(local_dir, AUTHORIZATION_DEFAULT), "w") as f:
                    json.dump(self.authorization, f, indent=2)
                    f.write("\n")


def _load_server_json(project: Project, builder: str, folder: Callable[[Any], str], name: str) -> Tuple[str, Dict[str, Any]]:
    """``(path, content)`` of the server's provisioned JSON file ``name`` in ``folder(server)`` (``ctx.get_kit_dir``,
    ``ctx.get_local_dir``), for ``builder`` to edit: NVFlare's ``StaticFileBuilder`` writes the file, so ``builder``
    must be listed after it."""
    server = project.get_server()
    if server is None:
        raise ValueError(f"{builder}: the project has no server")
    path = os.path.join(folder(server), name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: list {builder} after StaticFileBuilder")
    with open(path) as f:
        return path, json.load(f)


class LoopbackServerBuilder(Builder):
    """Makes the server listen on a loopback address only (NVFlare binds all interfaces unless its target is loopback).

    NVFlare 2.9's server binds its fed-learn and admin ports to the host of ``fed_server.json``'s service target
    when that host is a loopback address, and to every interface otherwise; the target's host is the server's
    name by default. This rewrites it to ``host`` (sites keep connecting to the server's ``default_host``).

    Args:
        host: a loopback address (``127.0.0.1``, ``localhost``).
    """

    def __init__(self, host: str = "127.0.0.1"):
        name = host.strip().rstrip(".").lower()
        try:
            loopback = name == "localhost" or ipaddress.ip_address(name).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"LoopbackServerBuilder host must be a loopback address (127.0.0.1, localhost), got {host!r}; "
                "to accept remote sites leave this builder out (the server then listens on every interface)"
            )
        self.host = host.strip()

    def build(self, project: Project, ctx: ProvisionContext):
        path, config = _load_server_json(project, "LoopbackServerBuilder", ctx.get_kit_dir, FED_SERVER_JSON)
        for entry in config.get("servers") or []:
            service = entry.get("service") or {}
            target = service.get("target", "")
            _, sep, port = target.rpartition(":")
            if not sep or not port.isdigit():
                raise ValueError(f"{path}: unexpected service target {target!r}")
            service["target"] = f"{self.host}:{port}"
        with open(path, "w") as f:
            json.dump(config, f, indent=2)


class JobSchedulerBuilder(Builder):
    """Sets the server's ``DefaultJobScheduler`` retry interval (``min_schedule_interval``, seconds) in its
    ``local/resources.json.default``: a job submitted before enough sites are connected is retried that often
    (NVFlare's default 10 s). POC submits as soon as the server answers, before the sites have joined, so every POC
    job waited up to 10 s for nothing.

    Args:
        min_schedule_interval: seconds between two scheduling attempts of a waiting job (> 0).
    """

    def __init__(self, min_schedule_interval: float = 2.0):
        if not (isinstance(min_schedule_interval, (int, float)) and 0 < float(min_schedule_interval) <= 600):
            raise ValueError(f"min_schedule_interval must be in (0, 600] seconds, got {min_schedule_interval!r}")
        self.min_schedule_interval = float(min_schedule_interval)

    def build(self, project: Project, ctx: ProvisionContext):
        path, resources = _load_server_json(project, "JobSchedulerBuilder", ctx.get_local_dir, RESOURCES_DEFAULT)
        schedulers = [c for c in resources.get("components") or [] if c.get("id") == "job_scheduler"]
        if not schedulers:
            raise ValueError(f"{path}: no job_scheduler component to configure")
        for component in schedulers:
            component.setdefault("args", {})["min_schedule_interval"] = self.min_schedule_interval
        with open(path, "w") as f:
            json.dump(resources, f, indent=2)
            f.write("\n")
