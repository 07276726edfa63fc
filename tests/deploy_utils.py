"""Provisioned NVFlare deployments on one machine for tests: provision, start a server/site from its kit, stop.

Used by tests/test_deploy.py. Every process is started in its own process group and stopped by its id.

:func:`deployment_scenario` is what tests/test_deploy.py checks of a running deployment, run once as the shared run
``deployment`` (tests/sim_utils.py): it provisions and starts the deployment under a folder ROOT, plays
every step (an impostor site, jobs with code, the recipe through ProdEnv), stops it and writes what it saw to
``ROOT/observations.json`` (:func:`scenario_main`); the tests assert on that. A process of its own, so that nothing it
prints lands in the output of a test running meanwhile.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY_PROJECT = REPO / "deploy" / "project.yml"
SERVER = "fl-server.hospital.example"
SITES = ["hospital-a", "hospital-b"]
PROJECT_ADMIN = "admin@fedseg-consortium.example"
LEAD = "researcher@hospital-b.example"
ROLES = ("project_admin", "org_admin", "lead", "member")


def nvflare_env(**extra) -> dict:
    """The environment for nvflare processes: this checkout's fedseg first, private HOME, one thread each."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", FEDSEG_NUM_THREADS="1")
    env.pop("NVFLARE_POC_WORKSPACE", None)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "custom"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def run_nvflare(args, cwd: Path, home: Path, timeout: float = 180, **env) -> str:
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "nvflare.cli", *args], cwd=cwd, env=nvflare_env(HOME=str(home), **env),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, f"nvflare {' '.join(args)} failed:\n{proc.stdout[-4000:]}"
    return proc.stdout


def provision(project_file: Path, workspace: Path) -> Path:
    """``nvflare provision -p project_file -w workspace``; returns ``<workspace>/<project>/prod_00``."""
    args = ["provision", "-p", str(project_file), "-w", str(workspace)]
    run_nvflare(args, cwd=workspace.parent, home=workspace.parent / "home")
    name = yaml.safe_load(project_file.read_text())["name"]
    prod = workspace / name / "prod_00"
    assert prod.is_dir(), f"provision wrote no {prod}"
    return prod


SERVER_MODULE = "nvflare.private.fed.app.server.server_train"
CLIENT_MODULE = "nvflare.private.fed.app.client.client_train"
START_TIMEOUT = 90.0  # seconds for the server to accept an admin session / a site to register (normally ~5-10 s)


def load_run_poc():
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec = importlib.util.spec_from_file_location("fedseg_run_poc", REPO / "poc_workspace" / "run_poc.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.dont_write_bytecode = before


def loopback_project(dst: Path, fed_learn_port: int, admin_port: int, name: str = None) -> Path:
    """A copy of deploy/project.yml for one machine: given ports, sites/admins connect to localhost, and the
    server listens on 127.0.0.1 only. The certificates still name the server's DNS name."""
    project = yaml.safe_load(DEPLOY_PROJECT.read_text())
    if name:
        project["name"] = name
    for p in project["participants"]:
        if p["type"] == "server":
            # sites and admins connect to localhost; the certificate keeps naming the DNS name too
            p.update(fed_learn_port=fed_learn_port, admin_port=admin_port, default_host="localhost")
            p["host_names"] = [*p.get("host_names", []), p["name"]]
    builders = project["builders"]
    at = next(i for i, b in enumerate(builders) if b["path"].endswith(".CertBuilder"))
    builders.insert(at, {"path": "fedseg.deploy.LoopbackServerBuilder", "args": {"host": "127.0.0.1"}})
    dst.write_text(yaml.safe_dump(project, sort_keys=False))
    return dst


class Participant:
    """One server or site process started from its startup kit as ``startup/sub_start.sh`` would (no restart loop)."""

    def __init__(self, kit: Path, org: str, log: Path, home: Path, client: bool):
        args = ["-m", str(kit), "-s", "fed_client.json" if client else "fed_server.json", "--set", "secure_train=true"]
        args += ([f"uid={kit.name}"] if client else []) + [f"org={org}", "config_folder=config"]
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", CLIENT_MODULE if client else SERVER_MODULE, *args], cwd=kit,
            env=nvflare_env(HOME=str(home)), stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends it and any job process it spawned
        )
        self.kit = kit

    def text(self) -> str:
        files = [self.log, self.kit / "log.txt"]
        return "\n".join(f.read_text(errors="replace") for f in files if f.is_file())

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)  # the group this test created (pgid == the child's pid)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        self._out.close()


class Deployment:
    """deploy/project.yml provisioned for loopback, plus a second project (another root CA), server running."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.fed_port, self.admin_port = load_run_poc().pick_free_ports(2)
        self.prod = provision(loopback_project(root / "project.yml", self.fed_port, self.admin_port), root / "ws")
        foreign_yml = loopback_project(root / "foreign.yml", self.fed_port, self.admin_port, name="other_consortium")
        self.foreign = provision(foreign_yml, root / "foreign_ws")
        from nvflare.lighter.utils import update_storage_locations

        update_storage_locations(str(self.prod / SERVER / "local"), workspace=str(root / "server_storage"))
        self.participants = []
        self.server = self.start(self.prod / SERVER, "fedseg_consortium", client=False)
        self.sessions = {}

    def start(self, kit: Path, org: str, client: bool) -> Participant:
        p = Participant(kit, org, self.root / f"{kit.parent.parent.parent.name}_{kit.name}.out", self.home, client)
        self.participants.append(p)
        return p

    def session(self, admin: str):
        """A Flare API session as ``admin`` (its startup kit in this deployment), retried while the server boots."""
        from nvflare.fuel.flare_api.flare_api import new_secure_session

        if admin in self.sessions:
            return self.sessions[admin]
        deadline, last = time.monotonic() + START_TIMEOUT, None
        while time.monotonic() < deadline:
            if self.server.proc.poll() is not None:
                pytest.fail(f"the server exited (rc {self.server.proc.returncode}):\n{self.server.text()[-4000:]}")
            try:
                self.sessions[admin] = new_secure_session(admin, str(self.prod / admin), timeout=10.0)
                return self.sessions[admin]
            except Exception as e:  # NoConnection while the server boots
                last = e
                time.sleep(1.0)
        pytest.fail(f"no admin session as {admin} within {START_TIMEOUT:.0f}s ({last}):\n{self.server.text()[-4000:]}")

    def ensure_sites(self, sites=SITES) -> None:
        """Start the genuine sites not running yet and wait until every one of them is registered."""
        running = {p.kit for p in self.participants if p.proc.poll() is None}
        orgs = {"hospital-a": "hospital_a", "hospital-b": "hospital_b"}
        for site in sites:
            if self.prod / site not in running:
                self.start(self.prod / site, orgs[site], client=True)
        deadline = time.monotonic() + START_TIMEOUT
        while not set(sites) <= self.registered_sites():
            assert time.monotonic() < deadline, f"sites {sites} not all registered: {self.registered_sites()}"
            time.sleep(1.0)

    def registered_sites(self) -> set:
        return {c.name for c in self.session(PROJECT_ADMIN).get_system_info().client_info}

    def close(self) -> None:
        for sess in self.sessions.values():
            try:
                sess.close()
            except Exception:
                pass
        for p in reversed(self.participants):
            p.stop()
        # job processes the server/sites spawned in their own sessions (normally gone after the abort): by PID,
        # matched on this deployment's folder in their command line
        load_run_poc().kill_poc_processes(self.root)


def https_get(port: int, kit: Path, server_name: str = SERVER) -> bytes:
    """``GET /`` over TLS to the server as the holder of ``kit``'s client certificate, trusting ``kit``'s root CA and
    checking that the server's certificate names ``server_name``; returns what the server answered.

    With TLS 1.3 the server checks the client's certificate after the client's side of the handshake: a refused
    certificate shows as an alert or as a connection closed with no answer (b"") on the first read.
    """
    import socket
    import ssl

    startup = kit / "startup"
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(startup / "rootCA.pem"))
    ctx.load_cert_chain(str(startup / "client.crt"), str(startup / "client.key"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_name) as tls:
            tls.sendall(f"GET / HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n".encode())
            try:
                return tls.recv(64)
            except (ssl.SSLError, ConnectionError) as e:  # the server's alert / reset
                return f"refused: {type(e).__name__}: {e}".encode()


def stage_job(src: Path, dst: Path, with_code: bool) -> Path:
    """A copy of an exported job (the Flare API signs the folder it submits, in place); with ``with_code`` it also
    carries Python in app/custom/ — what a job that brings its own code looks like."""
    shutil.copytree(src, dst)
    if with_code:
        custom = dst / "app" / "custom"
        custom.mkdir()
        (custom / "site_hook.py").write_text("import os\nprint(os.listdir('/'))  # runs at every site if accepted\n")
    return dst


def wait_status(session, job_id: str, done, timeout: float = 60.0) -> dict:
    """Poll the job's meta until ``done(status)`` (e.g. FINISHED:..., RUNNING) or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        meta = session.get_job_meta(job_id)
        if done(str(meta.get("status"))) or time.monotonic() > deadline:
            return meta
        time.sleep(1.0)


# ------------------------------------------------------------------------------------------ the scenario
def _listening(deployment) -> dict:
    """The sockets listening on the server's two ports, as (ip, port, pid), and the server's pid."""
    import psutil

    ports = {deployment.fed_port, deployment.admin_port}
    sockets = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid]
    return {"ports": sorted(ports), "server_pid": deployment.server.proc.pid,
            "listening": [[c.laddr.ip, c.laddr.port, c.pid] for c in sockets if c.laddr.port in ports]}


def _watch_registrations(deployment, impostor: Participant, seconds: float = 12.0, until: str = "") -> dict:
    """Poll the server's site list for ``seconds`` (a genuine site registers in ~5 s), or until the impostor's log
    shows ``until``; stop the impostor. Returns every site list seen and the impostor's log (lower case)."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and until in impostor.text().lower()):
        seen.append(sorted(deployment.registered_sites()))
        time.sleep(1.0)
    seen.append(sorted(deployment.registered_sites()))
    impostor.stop()
    return {"seen": seen, "log": impostor.text().lower()}


def _impostors(deployment) -> dict:
    """A hospital-a certificate of another CA at the TLS layer and as an NVFlare client, the other project's kit as
    issued, then the genuine hospital-a: what the server answered and which sites it listed meanwhile."""
    genuine_kit = deployment.prod / "hospital-a"
    genuine_root = (genuine_kit / "startup" / "rootCA.pem").read_bytes()
    foreign_kit = deployment.foreign / "hospital-a"
    # an impostor: a hospital-a certificate of another CA, trusting our (public) root CA so it accepts our server
    impostor_kit = deployment.root / "impostor" / "hospital-a"
    shutil.copytree(foreign_kit, impostor_kit)
    (impostor_kit / "startup" / "rootCA.pem").write_bytes(genuine_root)
    seen = {"https": {str(port): {"genuine": https_get(port, genuine_kit).decode("latin-1"),
                                  "impostor": https_get(port, impostor_kit).decode("latin-1")}
                      for port in (deployment.fed_port, deployment.admin_port)},
            "after_tls": sorted(deployment.registered_sites())}
    seen["impostor_client"] = _watch_registrations(deployment, deployment.start(impostor_kit, "hospital_a", client=True))
    foreign = deployment.start(foreign_kit, "hospital_a", client=True)
    seen["foreign_client"] = _watch_registrations(deployment, foreign, 30.0, "certificate verify failed")
    genuine = deployment.start(genuine_kit, "hospital_a", client=True)
    deadline = time.monotonic() + START_TIMEOUT
    while "hospital-a" not in deployment.registered_sites() and genuine.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1.0)
    seen["genuine"] = {"registered": "hospital-a" in deployment.registered_sites(), "exit": genuine.proc.poll(),
                       "log": genuine.text()[-3000:]}
    return seen


def _jobs(deployment, root: Path) -> dict:
    """A job folder carrying code submitted by each role NVFlare's default policy lets submit code (its meta once
    FINISHED), then the tiny FedAvg recipe through NVFlare's ProdEnv with the admin's startup kit."""
    from fedseg.recipes.environments import prod_env
    from fedseg.recipes.fedavg import FedAvgRecipe

    deployment.ensure_sites()  # the job needs min_clients=2 sites to be scheduled at all
    seen = {"with_code": {}}
    for admin in (PROJECT_ADMIN, LEAD):
        session = deployment.session(admin)
        job_id = session.submit_job(str(stage_job(REPO / "jobs" / "fedavg", root / "jobs" / admin / "fedavg", with_code=True)))
        seen["with_code"][admin] = wait_status(session, job_id, lambda s: s.startswith("FINISHED"))
    run = FedAvgRecipe(profile="tiny", num_rounds=1, local_epochs=1).run(prod_env(deployment.prod / PROJECT_ADMIN))
    try:
        result = run.get_result(timeout=240.0, clean_up=False)
        seen["status"], seen["result"] = run.get_status(), str(result) if result else None
    finally:
        if run.get_status() not in ("FINISHED:COMPLETED", None):
            deployment.session(PROJECT_ADMIN).abort_job(run.get_job_id())
    seen["meta"] = deployment.session(PROJECT_ADMIN).get_job_meta(run.get_job_id())
    return seen


def _run_recipe(deployment, recipe, timeout: float = 240.0) -> dict:
    """``recipe`` through NVFlare's ProdEnv as the project admin: its status, downloaded result and job id (aborted if
    it did not finish)."""
    from fedseg.recipes.environments import prod_env

    run = recipe.run(prod_env(deployment.prod / PROJECT_ADMIN))
    try:
        result = run.get_result(timeout=timeout, clean_up=False)
        return {"status": run.get_status(), "result": str(result) if result else None, "job_id": run.get_job_id()}
    finally:
        if run.get_status() not in ("FINISHED:COMPLETED", None) and not str(run.get_status()).startswith("FINISHED"):
            deployment.session(PROJECT_ADMIN).abort_job(run.get_job_id())


def _homomorphic(deployment, root: Path) -> dict:
    """FedAvg with homomorphic aggregation through ProdEnv, with the keys HEBuilder put into the kits: its status, the
    models the sites decrypted, and which of them the server's side holds in the clear (its kit folder with the job's
    workspace, its job store). Then the same job with the server given a site's context (it holds the secret key):
    its status and the line the server logged."""
    import torch
    from he_utils import plaintext_copies

    from fedseg.recipes.fedavg import FedAvgRecipe

    deployment.ensure_sites()
    seen = _run_recipe(deployment, FedAvgRecipe(name="fedavg_he", profile="tiny", num_rounds=1, local_epochs=1, he=True))
    decrypted = sorted(p for site in SITES for p in (deployment.prod / site).rglob("global_model.pt"))
    seen["decrypted"] = [str(p.relative_to(deployment.prod)) for p in decrypted]
    models = [torch.load(p, map_location="cpu", weights_only=True)["model"] for p in decrypted]
    # what the server keeps: its kit folder, and the job's workspace as its job store archived it (a zip)
    stored = _stored_workspace(root, seen["job_id"])
    server_side = [deployment.prod / SERVER, stored]
    seen["plaintext_at_server"] = [hit for folder in server_side for hit in plaintext_copies(folder, models)]
    seen["server_files"] = sorted(str(p.relative_to(stored)) for p in stored.rglob("*") if p.is_file())
    secret = deployment.prod / "hospital-a" / "startup" / "client_context.tenseal"
    refused = FedAvgRecipe(name="fedavg_he_secret_key", profile="tiny", num_rounds=1, local_epochs=1, he=True,
                           he_server_context=str(secret))
    seen["secret_key"] = _run_recipe(deployment, refused, timeout=120.0)
    log = (_stored_workspace(root, seen["secret_key"]["job_id"]) / "log.txt").read_text(errors="replace")
    seen["secret_key"]["logged"] = [line.strip() for line in log.splitlines()
                                    if "server's HE context holds a secret key" in line][:1]
    return seen


def _stored_workspace(root: Path, job_id: str) -> Path:
    """The server's workspace of a finished job as its job store keeps it (``jobs-storage/<id>/workspace``, a zip),
    extracted under ``root/stored/<id>``."""
    import zipfile

    out = root / "stored" / job_id
    with zipfile.ZipFile(root / "server_storage" / "jobs-storage" / job_id / "workspace") as archive:
        archive.extractall(out)
    return out


#: the scenario's steps, in order (one test of tests/test_deploy.py each)
SCENARIO = (("listening", lambda dep, root: _listening(dep)), ("impostors", lambda dep, root: _impostors(dep)),
            ("jobs", _jobs), ("homomorphic", _homomorphic))


def deployment_scenario(root: Path) -> dict:
    """deploy/project.yml provisioned for loopback under ``root``, its server started, :data:`SCENARIO` played, every
    process stopped. Returns what each step saw (``{step: ...}``), or under ``errors`` the traceback of a step that
    failed (the later steps still run); ``prod`` and ``foreign`` are the two projects' kit folders."""
    import traceback

    seen = {"errors": {}}
    deployment = Deployment(root)
    try:
        deployment.session(PROJECT_ADMIN)
        seen.update(prod=str(deployment.prod), foreign=str(deployment.foreign))
        for step, play in SCENARIO:
            try:
                seen[step] = play(deployment, root)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:  # noqa: BLE001 - an error or a pytest.fail(): the step's test fails with it
                seen["errors"][step] = traceback.format_exc()
    finally:
        deployment.close()
    return seen


def scenario_main(argv) -> int:
    """``argv``: the scenario's folder; :func:`deployment_scenario` there, what it saw in ``observations.json``."""
    out = Path(argv[0]).resolve()
    (out / "observations.json").write_text(json.dumps(deployment_scenario(out), default=str, indent=1))
    return 0
