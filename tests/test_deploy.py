"""Security of a real deployment (deploy/project.yml): provisioning, mutual TLS, custom code off, loopback POC.

Fast tests provision kits with ``nvflare provision`` / ``nvflare poc prepare`` and check what they contain.
Slow tests start the real FL server of ``deploy/project.yml`` (a copy with free loopback ports, bound to
127.0.0.1) and: a client with a certificate from another project's CA never registers, the genuine
hospital-a does; a job folder carrying code is refused for every role, our exported job is accepted.
Every process a test starts is in its own process group and is killed by id at the end.
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
POC_PROJECT = REPO / "poc_workspace" / "project.yml"
SERVER = "fl-server.hospital.example"
SITES = ["hospital-a", "hospital-b"]
PROJECT_ADMIN = "admin@fedseg-consortium.example"
LEAD = "researcher@hospital-b.example"
ROLES = ("project_admin", "org_admin", "lead", "member")


def _env(**extra) -> dict:
    """The environment for nvflare processes: this checkout's fedseg first, private HOME, one thread each."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", FEDSEG_NUM_THREADS="1")
    env.pop("NVFLARE_POC_WORKSPACE", None)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "custom"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def _nvflare(args, cwd: Path, home: Path, timeout: float = 180, **env) -> str:
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "nvflare.cli", *args], cwd=cwd, env=_env(HOME=str(home), **env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, f"nvflare {' '.join(args)} failed:\n{proc.stdout[-4000:]}"
    return proc.stdout


def provision(project_file: Path, workspace: Path) -> Path:
    """``nvflare provision -p project_file -w workspace``; returns ``<workspace>/<project>/prod_00``."""
    _nvflare(["provision", "-p", str(project_file), "-w", str(workspace)], cwd=workspace.parent, home=workspace.parent / "home")
    name = yaml.safe_load(project_file.read_text())["name"]
    prod = workspace / name / "prod_00"
    assert prod.is_dir(), f"provision wrote no {prod}"
    return prod


def _load_pem(path: Path):
    from cryptography import x509

    return x509.load_pem_x509_certificate(path.read_bytes())


def _role_of(project_file: Path) -> dict:
    return {p["name"]: p.get("role") for p in yaml.safe_load(project_file.read_text())["participants"]}


def _deploy_builder_args(project_file: Path = DEPLOY_PROJECT) -> dict:
    builders = yaml.safe_load(project_file.read_text())["builders"]
    (policy,) = [b for b in builders if b["path"] == "fedseg.deploy.SitePolicyBuilder"]
    return policy.get("args") or {}


# ------------------------------------------------------------------------------------------- provisioning


def test_provision_deploy_project(tmp_path):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    prod = provision(DEPLOY_PROJECT, tmp_path / "ws")
    names = _role_of(DEPLOY_PROJECT)
    assert sorted(p.name for p in prod.iterdir() if p.is_dir()) == sorted(names)

    # every certificate is issued by the project's root CA (signature checked), and the root is self-signed
    root = _load_pem(prod / SERVER / "startup" / "rootCA.pem")
    root.verify_directly_issued_by(root)
    certs = {SERVER: prod / SERVER / "startup" / "server.crt"}
    certs |= {name: prod / name / "startup" / "client.crt" for name in names if name != SERVER}
    for name, path in certs.items():
        cert = _load_pem(path)
        cert.verify_directly_issued_by(root)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        # every kit carries the same root, so each end can check the other's certificate (mutual TLS)
        assert (path.parent / "rootCA.pem").read_bytes() == (prod / SERVER / "startup" / "rootCA.pem").read_bytes()

    # the server certificate names the DNS name the sites connect to (and localhost, from host_names)
    server_cert = _load_pem(certs[SERVER])
    sans = server_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert SERVER in sans.get_values_for_type(x509.DNSName)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)

    # mutual TLS on the server and at every site; sites and admins connect to the DNS name
    server_cfg = json.loads((prod / SERVER / "startup" / "fed_server.json").read_text())["servers"][0]
    assert server_cfg["connection_security"] == "mtls"
    for site in SITES:
        client_cfg = json.loads((prod / site / "startup" / "fed_client.json").read_text())
        assert client_cfg["client"]["connection_security"] == "mtls"
        assert client_cfg["servers"][0]["service"]["target"] == f"{SERVER}:8002"
    admin_cfg = json.loads((prod / PROJECT_ADMIN / "startup" / "fed_admin.json").read_text())["admin"]
    assert admin_cfg["host"] == SERVER and admin_cfg["connection_security"] == "mtls"

    # every server/site kit: the deployment's authorization policy and the fedseg component allow list
    from fedseg.fl.component_policy import class_allow_list

    policy = _deploy_builder_args()["authorization"]
    for participant in [SERVER, *SITES]:
        local = prod / participant / "local"
        assert json.loads((local / "authorization.json.default").read_text()) == policy
        assert json.loads((local / "resources.json.default").read_text())["class_allow_list"] == class_allow_list()


def test_authorization_policy_turns_custom_code_off_for_every_role():
    """Evaluated by NVFlare's own authorizer (FLAuthorizer), for users of the site's org and of another org."""
    from nvflare.apis.fl_constant import AdminCommandNames
    from nvflare.security.security import COMMAND_CATEGORIES

    from fedseg.deploy import BYOC_RIGHT, parse_authorization, role_has_right

    authz = parse_authorization(_deploy_builder_args()["authorization"], site_org="hospital_a")
    for role in ROLES:
        for user_org in ("hospital_a", "hospital_b"):
            assert not role_has_right(authz, role, BYOC_RIGHT, "hospital_a", user_org), (role, user_org)
            assert not role_has_right(authz, role, "server-predeployed-flwr", "hospital_a", user_org), role
    # the project admin keeps every other right NVFlare defines (its default policy gives it "any")
    rights = {v for k, v in vars(AdminCommandNames).items() if not k.startswith("_") and isinstance(v, str)}
    rights = (rights - set(COMMAND_CATEGORIES)) | set(COMMAND_CATEGORIES.values())
    missing = sorted(r for r in rights if not role_has_right(authz, "project_admin", r, "hospital_a", "x"))
    assert not missing, f"project_admin lacks {missing}"
    assert role_has_right(authz, "lead", "submit_job")
    assert not role_has_right(authz, "org_admin", "submit_job")
    assert not role_has_right(authz, "member", "submit_job") and role_has_right(authz, "member", "view")
    # NVFlare's own default (the template) would let project_admin and lead submit custom code
    import nvflare.lighter

    template = yaml.safe_load((Path(nvflare.lighter.__file__).parent / "templates" / "master_template.yml").read_text())
    default = parse_authorization(json.loads(template["default_authz"]), site_org="hospital_a")
    assert role_has_right(default, "project_admin", BYOC_RIGHT) and role_has_right(default, "lead", BYOC_RIGHT)


def test_site_policy_builder_rejects_a_broken_policy():
    from fedseg.deploy import SitePolicyBuilder

    with pytest.raises(ValueError, match="invalid authorization policy"):
        SitePolicyBuilder(authorization={"permissions": {"lead": "any"}})  # no format_version
    with pytest.raises(ValueError, match="invalid authorization policy"):
        SitePolicyBuilder(authorization={"format_version": "1.0", "permissions": {"lead": {"byoc": "maybe"}}})


def test_loopback_server_builder_accepts_only_loopback_hosts():
    from fedseg.deploy import LoopbackServerBuilder

    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert LoopbackServerBuilder(host).host == host
    for host in ("0.0.0.0", "10.1.2.3", "fl-server.hospital.example", ""):
        with pytest.raises(ValueError, match="loopback"):
            LoopbackServerBuilder(host)


def test_poc_project_binds_server_to_loopback(tmp_path):
    """The generated POC server config: NVFlare binds a loopback service target to loopback only."""
    from fedseg.fl.component_policy import class_allow_list

    workspace = tmp_path / "poc"
    _nvflare(
        ["poc", "prepare", "-i", str(POC_PROJECT), "--force"], cwd=tmp_path, home=tmp_path / "home",
        NVFLARE_POC_WORKSPACE=str(workspace),
    )
    prod = workspace / "fedseg_poc" / "prod_00"
    cfg = json.loads((prod / "server" / "startup" / "fed_server.json").read_text())["servers"][0]
    assert cfg["service"]["target"].rsplit(":", 1)[0] == "127.0.0.1"
    for site in ("server", "site-1", "site-2", "site-3"):
        resources = json.loads((prod / site / "local" / "resources.json.default").read_text())
        assert resources["class_allow_list"] == class_allow_list()


# ---------------------------------------------------------------------------------- jobs and allow list


def _components(node):
    """Every ``{"path": ...}`` component config inside a job config, nested ones (e.g. the persistor's model) too."""
    if isinstance(node, dict):
        if isinstance(node.get("path"), str):
            yield node
        for value in node.values():
            yield from _components(value)
    elif isinstance(node, list):
        for value in node:
            yield from _components(value)


class _Workspace:
    """What NVFlare's ComponentPathAuthorizer asks of a workspace: where the site's resources file is."""

    def __init__(self, resources_file: Path):
        self.resources_file = resources_file

    def get_resources_file_path(self) -> str:
        return str(self.resources_file)

    def get_root_dir(self) -> str:
        return str(self.resources_file.parent)


@pytest.mark.parametrize("method", sorted(p.name for p in (REPO / "jobs").iterdir() if (p / "meta.json").is_file()))
def test_committed_job_carries_no_code_and_every_component_is_allowed(method, tmp_path):
    """NVFlare's own checks: its app validator finds no custom code; its component authorizer builds every class."""
    from nvflare.apis.app_validation import AppValidationKey
    from nvflare.apis.fl_exception import UnsafeComponentError
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer
    from nvflare.private.fed.app.default_app_validator import DefaultAppValidator

    from fedseg.fl.component_policy import add_to_resources

    job = REPO / "jobs" / method
    assert not any(p.suffix == ".py" for p in job.rglob("*")), f"jobs/{method} carries Python code"
    for app in (p for p in job.iterdir() if p.is_dir()):
        for site_type in ("server", "client"):
            err, info = DefaultAppValidator(site_type).validate(str(app))
            assert err == "" and not info.get(AppValidationKey.BYOC), (app, site_type, err, info)

    resources = tmp_path / "local" / "resources.json"
    add_to_resources(resources)
    authorizer, workspace = ComponentPathAuthorizer(), _Workspace(resources)
    configs = list(job.rglob("config_fed_*.json"))
    assert len(configs) == 2
    paths = []
    for config in configs:
        for component in _components(json.loads(config.read_text())):
            authorizer.authorize_component_config(component, workspace=workspace)  # raises if not allowed
            paths.append(component["path"])
    assert "fedseg.fl.site_executor.FedSegSiteExecutor" in paths and "fedseg.fl.controller.FedSegController" in paths
    # the same authorizer refuses what a hostile job could name instead
    for path in ("subprocess.Popen", "fedseg_evil.fl.Controller", "nvflare.app_common.executors.client_api_executor.ClientAPIExecutor"):
        with pytest.raises(UnsafeComponentError, match="not in allow_list"):
            authorizer.authorize_component_config({"path": path, "args": {}}, workspace=workspace)


def test_class_allow_list_matches_nvflare_matching_rule():
    from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer

    from fedseg.fl.component_policy import FEDSEG_COMPONENTS, class_allow_list, is_allowed

    allow = class_allow_list(["my_site.models."])
    assert allow[: len(DEFAULT_CLASS_ALLOW_LIST)] == list(DEFAULT_CLASS_ALLOW_LIST)
    assert set(FEDSEG_COMPONENTS) | {"my_site.models."} <= set(allow) and len(allow) == len(set(allow))
    ComponentPathAuthorizer._normalize_allow_list(allow)  # NVFlare accepts every entry
    probes = [
        "fedseg.fl.controller.FedSegController", "fedseg.flx.Controller", "fedseg.networks.unet.FeatureUNet",
        "fedseg.cli.main", "my_site.models.Net", "my_site.modelsX.Net",
        "nvflare.app_opt.pt.file_model_persistor.PTFileModelPersistor",
        "nvflare.app_opt.pt.file_model_persistor.PTFileModelPersistorX", "nvflare.app_common.workflows.fedavg.FedAvg",
    ]
    for path in probes:
        reference = any(ComponentPathAuthorizer._path_matches_prefix(path, prefix) for prefix in allow)
        assert is_allowed(path, allow) == reference, path


def test_add_to_resources_keeps_site_entries_and_names_bad_files(tmp_path):
    from fedseg.fl.component_policy import add_to_resources, class_allow_list

    path = tmp_path / "resources.json"
    path.write_text(json.dumps({"format_version": 2, "class_allow_list": ["hospital.tools."], "other": 1}))
    written = add_to_resources(path)
    data = json.loads(path.read_text())
    assert data["other"] == 1 and data["class_allow_list"] == written == class_allow_list(["hospital.tools."])
    assert add_to_resources(path) == written  # idempotent
    path.write_text("{not json")
    with pytest.raises(ValueError, match="resources.json"):
        add_to_resources(path)
    path.write_text(json.dumps({"class_allow_list": "fedseg."}))
    with pytest.raises(ValueError, match="must be a list"):
        add_to_resources(path)


# ------------------------------------------------------------------------- a running server on loopback

SERVER_MODULE = "nvflare.private.fed.app.server.server_train"
CLIENT_MODULE = "nvflare.private.fed.app.client.client_train"
START_TIMEOUT = 90.0  # seconds for the server to accept an admin session / a site to register (normally ~5-10 s)


def _load_run_poc():
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
            env=_env(HOME=str(home)), stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
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
        self.fed_port, self.admin_port = _load_run_poc().pick_free_ports(2)
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
        _load_run_poc().kill_poc_processes(self.root)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    dep = Deployment(tmp_path_factory.mktemp("deploy"))
    try:
        dep.session(PROJECT_ADMIN)
        yield dep
    finally:
        dep.close()


@pytest.mark.slow
def test_server_listens_on_loopback_only(deployment):
    import psutil

    sockets = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid]
    ports = {deployment.fed_port, deployment.admin_port}
    ours = [c for c in sockets if c.laddr.port in ports]
    assert {c.laddr.port for c in ours} == ports, f"server not listening on {ports}: {ours}"
    assert {c.pid for c in ours} == {deployment.server.proc.pid}
    assert all(c.laddr.ip == "127.0.0.1" for c in ours), ours


def _assert_never_registers(deployment, impostor: Participant, seconds: float = 12.0, until: str = "") -> str:
    """Poll the server's site list for ``seconds`` (a genuine site registers in ~5 s), or until the impostor's log
    shows ``until``: the impostor must not appear. Stops the impostor; returns its log (lower case)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and until in impostor.text().lower()):
        assert "hospital-a" not in deployment.registered_sites(), "a client of another CA registered"
        time.sleep(1.0)
    assert "hospital-a" not in deployment.registered_sites(), "a client of another CA registered"
    impostor.stop()
    return impostor.text().lower()


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


@pytest.mark.slow
def test_client_with_a_certificate_from_another_ca_is_refused(deployment):
    genuine_kit = deployment.prod / "hospital-a"
    genuine_root = (genuine_kit / "startup" / "rootCA.pem").read_bytes()
    foreign_kit = deployment.foreign / "hospital-a"
    assert (foreign_kit / "startup" / "rootCA.pem").read_bytes() != genuine_root
    # an impostor: a hospital-a certificate of another CA, trusting our (public) root CA so it accepts our server
    impostor_kit = deployment.root / "impostor" / "hospital-a"
    shutil.copytree(foreign_kit, impostor_kit)
    (impostor_kit / "startup" / "rootCA.pem").write_bytes(genuine_root)

    # 1. TLS layer, both server ports: the server answers HTTP to the genuine certificate (whose holder also checks
    #    that the server's certificate names fl-server.hospital.example); the impostor's gets no answer at all
    for port in (deployment.fed_port, deployment.admin_port):
        assert https_get(port, genuine_kit).startswith(b"HTTP/1.1 "), port
        answer = https_get(port, impostor_kit)
        assert not answer.startswith(b"HTTP"), (port, answer)
    assert "hospital-a" not in deployment.registered_sites()

    # 2. NVFlare client: the impostor's client process never registers
    _assert_never_registers(deployment, deployment.start(impostor_kit, "hospital_a", client=True))

    # 3. the other project's kit as issued does not even trust our server (the client refuses it)
    failure = "certificate verify failed"
    client_log = _assert_never_registers(deployment, deployment.start(foreign_kit, "hospital_a", client=True), 30.0, failure)
    assert failure in client_log, client_log[-3000:]

    # 4. the genuine hospital-a (this project's CA) registers with the same server: the refusals were the certificates
    genuine = deployment.start(deployment.prod / "hospital-a", "hospital_a", client=True)
    deadline = time.monotonic() + START_TIMEOUT
    while "hospital-a" not in deployment.registered_sites():
        assert genuine.proc.poll() is None, genuine.text()[-3000:]
        assert time.monotonic() < deadline, f"hospital-a did not register:\n{genuine.text()[-3000:]}"
        time.sleep(1.0)


def _stage_job(src: Path, dst: Path, with_code: bool) -> Path:
    """A copy of an exported job (the Flare API signs the folder it submits, in place); with ``with_code`` it also
    carries Python in app/custom/ — what a job that brings its own code looks like."""
    shutil.copytree(src, dst)
    if with_code:
        custom = dst / "app" / "custom"
        custom.mkdir()
        (custom / "site_hook.py").write_text("import os\nprint(os.listdir('/'))  # runs at every site if accepted\n")
    return dst


def _wait_status(session, job_id: str, done, timeout: float = 60.0) -> dict:
    """Poll the job's meta until ``done(status)`` (e.g. FINISHED:..., RUNNING) or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        meta = session.get_job_meta(job_id)
        if done(str(meta.get("status"))) or time.monotonic() > deadline:
            return meta
        time.sleep(1.0)


@pytest.mark.slow
def test_job_with_custom_code_is_refused_and_our_job_is_accepted(deployment, tmp_path):
    """NVFlare checks the byoc right when it deploys a job (at the server, then at each site, each with its own
    authorization.json): a job with app/custom code never runs, whoever submits it; our exported job runs."""
    deployment.ensure_sites()  # the job needs min_clients=2 sites to be scheduled at all
    our_job = REPO / "jobs" / "fedavg"
    for admin in (PROJECT_ADMIN, LEAD):  # the two roles NVFlare's default policy lets submit custom code
        session = deployment.session(admin)
        job_id = session.submit_job(str(_stage_job(our_job, tmp_path / admin / "fedavg", with_code=True)))
        meta = _wait_status(session, job_id, lambda s: s.startswith("FINISHED"))
        assert meta["status"] == "FINISHED:FAILED_TO_RUN", meta
        assert meta["byoc"] is True and meta["submitter_role"] == _role_of(DEPLOY_PROJECT)[admin]
        assert any("BYOC not permitted" in d for d in meta.get("job_deploy_detail", [])), meta
        assert meta.get("start_time") in ("", None), meta  # it never started anywhere

    # our exported job (configuration only): deployed to the server and both sites and running; then aborted
    session = deployment.session(PROJECT_ADMIN)
    job_id = session.submit_job(str(_stage_job(our_job, tmp_path / "ours" / "fedavg", with_code=False)))
    try:
        meta = _wait_status(session, job_id, lambda s: s != "SUBMITTED" and s != "DISPATCHED", timeout=90.0)
        assert meta["status"] == "RUNNING", meta
        assert not meta.get("byoc") and not any("BYOC" in d for d in meta.get("job_deploy_detail", [])), meta
        for site in SITES:  # each site accepted it under its own policy: the job's app is in its workspace
            deadline = time.monotonic() + 30
            while not (deployment.prod / site / job_id).is_dir():
                assert time.monotonic() < deadline, f"{site} did not deploy job {job_id}"
                time.sleep(1.0)
    finally:
        session.abort_job(job_id)
    meta = _wait_status(session, job_id, lambda s: s.startswith("FINISHED"), timeout=60.0)
    assert meta["status"] == "FINISHED:ABORTED", meta


def test_allow_in_kit_edits_the_file_nvflare_reads(tmp_path):
    from fedseg.fl.component_policy import allow_in_kit, class_allow_list

    kit = tmp_path / "site-1"
    (kit / "local").mkdir(parents=True)
    default = kit / "local" / "resources.json.default"
    default.write_text(json.dumps({"format_version": 2, "components": [{"id": "x"}]}))
    assert allow_in_kit(kit) == default  # no site override: the default file
    assert json.loads(default.read_text())["components"] == [{"id": "x"}]
    override = kit / "local" / "resources.json"
    override.write_text(json.dumps({"format_version": 2}))
    assert allow_in_kit(kit) == override  # the site's own file wins in NVFlare, so that is the one to edit
    assert json.loads(override.read_text())["class_allow_list"] == class_allow_list()
    with pytest.raises(FileNotFoundError, match="no local"):
        allow_in_kit(tmp_path / "nothing")
