"""What a fedseg recipe needs from each NVFlare execution environment (``SimEnv``, ``PocEnv``, ``ProdEnv``).

``FedSegRecipe.process_env(env)`` calls :func:`prepare_env` before NVFlare deploys the job; a failed deployment is
turned into an :class:`ExecEnvError` by :func:`deployment_failure`. Both exist because fedseg jobs carry no code: a
participant builds their components only if its ``class_allow_list`` names them (``fedseg.fl.component_policy``),
and a participant's list is its own — a job cannot bring one.

* ``SimEnv`` — the recipe writes fedseg's list into the simulated workspace, ``<workspace_root>/<job name>/local/
  resources.json``; NVFlare's ``SimEnv.deploy`` installs its own default list only where a workspace has none, and
  the simulator copies the file to every simulated participant.
* ``PocEnv`` — ``PocEnv.deploy`` prepares a fresh POC from its project file (``nvflare poc prepare -i``): the list
  reaches every kit through that file's ``fedseg.deploy.SitePolicyBuilder`` (``poc_workspace/project.yml``). The recipe
  checks the project file and the admin name before anything starts.
* ``ProdEnv`` — the sites got the list when they were provisioned (``deploy/project.yml``); the recipe checks that
  the startup kit is an admin's and that the user name is the one its certificate names.

Every :class:`ExecEnvError` message is one line that names the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

#: the provisioning builder that writes fedseg's allow list into every kit (``fedseg.deploy``)
POLICY_BUILDER = "fedseg.deploy.SitePolicyBuilder"
#: where this repository keeps the POC project file with :data:`POLICY_BUILDER` (for the messages)
POC_PROJECT_HINT = "poc_workspace/project.yml"


class ExecEnvError(RuntimeError):
    """An execution environment in which a fedseg job cannot run as it is; the message is one line naming the fix."""


# ------------------------------------------------------------------------------------------ before deployment
def prepare_env(env: Any, job_name: str) -> None:
    """Make ``env`` ready for a fedseg job named ``job_name``, or raise :class:`ExecEnvError` saying what to change.

    Environments other than NVFlare's three are left alone (they are the caller's to prepare)."""
    from nvflare.recipe import PocEnv, ProdEnv, SimEnv

    if isinstance(env, SimEnv):
        allow_in_simulation(env, job_name)
    elif isinstance(env, PocEnv):
        check_poc_project(env.project_conf_path, env.username)
    elif isinstance(env, ProdEnv):
        check_admin_kit(env.startup_kit_location, env.username)


def simulation_workspace(env: Any, job_name: str) -> Path:
    """The workspace ``SimEnv.deploy`` runs the job ``job_name`` in (``<workspace_root>/<job name>``)."""
    return Path(env.workspace_root) / job_name


def allow_in_simulation(env: Any, job_name: str) -> Path:
    """Write fedseg's allow list into the simulated workspace's ``local/resources.json`` (entries already there are
    kept); returns the file."""
    from fedseg.fl.component_policy import prepare_simulator_workspace

    workspace = simulation_workspace(env, job_name)
    try:
        return prepare_simulator_workspace(workspace)
    except (OSError, ValueError) as e:
        raise ExecEnvError(f"cannot write fedseg's component allow list into {workspace}/local/resources.json ({e}): "
                           "fix or remove that file, or give SimEnv another workspace_root") from None


def read_project(path: os.PathLike) -> Dict[str, Any]:
    """An NVFlare project file (YAML) as a dict; :class:`ExecEnvError` when it is missing or not a project file."""
    import yaml

    project_file = Path(path)
    if not project_file.is_file():
        raise ExecEnvError(f"project file {project_file} does not exist: give the path of {POC_PROJECT_HINT} "
                           "(or of your copy of it)")
    try:
        project = yaml.safe_load(project_file.read_text())
    except yaml.YAMLError as e:
        raise ExecEnvError(f"{project_file} is not valid YAML ({str(e).splitlines()[0]}): fix it or start again from "
                           f"{POC_PROJECT_HINT}") from None
    if not isinstance(project, dict) or not isinstance(project.get("participants"), list):
        raise ExecEnvError(f"{project_file} is not an NVFlare project file (no participants list): start from "
                           f"{POC_PROJECT_HINT}")
    return project


def project_admin(project: Dict[str, Any]) -> Optional[str]:
    """The name of a project file's ``project_admin`` (the admin kit ``PocEnv`` logs in with), or None."""
    admins = [p.get("name") for p in project["participants"] if p.get("type") == "admin" and p.get("role") == "project_admin"]
    return admins[0] if admins else None


def project_sites(project: Dict[str, Any]) -> List[str]:
    """The client sites a project file names, in its order."""
    return [p["name"] for p in project["participants"] if p.get("type") == "client"]


def check_poc_project(project_conf_path: str, username: str) -> Dict[str, Any]:
    """A ``PocEnv`` can run fedseg jobs: its project file exists, has :data:`POLICY_BUILDER`, and ``username`` is its
    project admin. Returns the project."""
    if not project_conf_path:
        raise ExecEnvError(
            "PocEnv without project_conf_path prepares NVFlare's default POC project, whose sites refuse fedseg's "
            f"components: use PocEnv(project_conf_path='{POC_PROJECT_HINT}', username='admin@fedseg.org') "
            "(poc_workspace/README.md)")
    project = read_project(project_conf_path)
    builders = [b.get("path") for b in project.get("builders") or [] if isinstance(b, dict)]
    if POLICY_BUILDER not in builders:
        raise ExecEnvError(
            f"the POC project {project_conf_path} has no {POLICY_BUILDER}, so its sites would refuse fedseg's "
            f"components: add `- path: {POLICY_BUILDER}` to its builders after StaticFileBuilder (as in {POC_PROJECT_HINT})")
    admin = project_admin(project)
    if admin is None:
        raise ExecEnvError(f"the POC project {project_conf_path} has no participant with role project_admin: add one "
                           f"(as in {POC_PROJECT_HINT})")
    if username != admin:
        raise ExecEnvError(f"PocEnv(username={username!r}) is not the project admin of {project_conf_path}: use "
                           f"username={admin!r}")
    return project


def kit_user(kit: os.PathLike) -> Optional[str]:
    """The user name an admin startup kit's certificate names (its common name), or None without one."""
    cert = Path(kit) / "startup" / "client.crt"
    if not cert.is_file():
        return None
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    names = x509.load_pem_x509_certificate(cert.read_bytes()).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


def check_admin_kit(startup_kit: os.PathLike, username: Optional[str] = None) -> str:
    """``startup_kit`` is an admin's startup kit (``startup/fed_admin.json``) and ``username`` (when given) is the user
    its certificate names. Returns that user."""
    kit = Path(startup_kit)
    if not kit.exists():
        raise ExecEnvError(f"startup kit {kit} does not exist: give the admin folder `nvflare provision` wrote, "
                           "<provision workspace>/<project>/prod_NN/<admin e-mail> (deploy/README.md)")
    if not (kit / "startup" / "fed_admin.json").is_file():
        raise ExecEnvError(f"{kit} is not an admin's startup kit (no startup/fed_admin.json): give the admin folder, "
                           "<provision workspace>/<project>/prod_NN/<admin e-mail>, not a server's or a site's")
    user = kit_user(kit) or kit.name
    if username is not None and username != user:
        raise ExecEnvError(f"the startup kit {kit} is {user!r}'s, not {username!r}'s: log in as username={user!r}")
    return user


# ------------------------------------------------------------------------------------------ the environments
def sim_env(sites: List[str], workspace_root: os.PathLike, threads: Optional[int] = None, gpu: Optional[str] = None):
    """NVFlare's ``SimEnv`` for ``sites`` (one process each) with its workspaces under ``workspace_root``."""
    from nvflare.recipe import SimEnv

    return SimEnv(clients=list(sites), num_threads=threads or len(sites), gpu_config=gpu,
                  workspace_root=str(Path(workspace_root).resolve()))


def poc_env(project_file: os.PathLike, login_timeout: float = 60.0, username: Optional[str] = None):
    """NVFlare's ``PocEnv`` for the POC a project file describes, logged in as its project admin (checked first).

    ``login_timeout``: seconds the FLARE API session may take to reach the freshly started server (NVFlare's own
    default, 10 s, is short for a loaded machine)."""
    from nvflare.recipe import PocEnv

    path = str(Path(project_file).resolve())
    project = read_project(path)
    user = username or project_admin(project) or ""
    check_poc_project(path, user)
    return PocEnv(project_conf_path=path, username=user, extra={"login_timeout": login_timeout})


def prod_env(startup_kit: os.PathLike, username: Optional[str] = None, login_timeout: float = 30.0):
    """NVFlare's ``ProdEnv`` for an admin startup kit (checked first), as the user the kit's certificate names."""
    from nvflare.recipe import ProdEnv

    user = check_admin_kit(startup_kit, username)
    return ProdEnv(startup_kit_location=str(Path(startup_kit).resolve()), username=user, login_timeout=login_timeout)


# ------------------------------------------------------------------------------------------ after deployment
def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def deployment_failure(env: Any, job_name: str, error: BaseException) -> Optional[ExecEnvError]:
    """What a failed ``env.deploy`` of the job ``job_name`` means, as one line naming the next step; None for an
    environment this module does not know."""
    from nvflare.recipe import PocEnv, ProdEnv, SimEnv

    if isinstance(env, SimEnv):
        from fedseg.fl.component_policy import refused_components_hint

        workspace = simulation_workspace(env, job_name)
        if refused_components_hint(workspace):
            return ExecEnvError(f"the simulated sites refused fedseg's components (no allow list in {workspace}/local/"
                                "resources.json): run the job through the recipe (recipe.execute(env)), which writes it")
        return ExecEnvError(f"the simulation of {job_name} failed ({_first_line(error)}): the reason is in "
                            f"{workspace}/server/simulate_job/log.txt and {workspace}/<site>/log.txt")
    if isinstance(env, PocEnv):
        return ExecEnvError(
            f"the POC in {env.poc_workspace} is not running or did not answer as {env.username} ({_first_line(error)}): "
            f"`nvflare poc stop`, make sure no other program holds the server ports of {env.project_conf_path} "
            "(fed_learn_port, admin_port), and run again; the server's log is under the POC workspace, "
            "<project>/prod_NN/<server>/log.txt")
    if isinstance(env, ProdEnv):
        return ExecEnvError(
            f"could not submit {job_name} as {env.username} with {env.startup_kit_location} ({_first_line(error)}): "
            "is the FL server running and reachable at the host and port in the kit's startup/fed_admin.json?")
    return None


def report_in(result: os.PathLike) -> Path:
    """The ``report.json`` in a job result (a simulator workspace, or a result folder downloaded from POC / a
    deployment), the newest where there are several; :class:`ExecEnvError` when there is none."""
    root = Path(result)
    reports = sorted(root.rglob("report.json"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    if not reports:
        raise ExecEnvError(f"the job result {root} holds no report.json: the job did not finish; its server log says why")
    return reports[-1]
