"""Security of a real deployment (deploy/project.yml): provisioning, mutual TLS, custom code off, loopback POC.

Fast tests provision kits with ``nvflare provision`` and check what they contain. Slow tests read the shared run
``deployment`` (tests/sim_utils.py, in the background: ``deploy_utils.deployment_scenario``), which starts the real FL
server of ``deploy/project.yml`` (a copy with free loopback ports, bound to 127.0.0.1): a client with a certificate
from another project's CA never registers, the genuine hospital-a does; a job folder carrying code is refused for
every role, our recipe runs through NVFlare's ``ProdEnv`` (one tiny round, result downloaded), and again with
homomorphic aggregation (the keys HEBuilder provisioned). About 2.5 minutes. The
POC's kits are those of the suite's one POC (shared run ``poc``, tests/test_poc.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from deploy_utils import DEPLOY_PROJECT, LEAD, PROJECT_ADMIN, ROLES, SERVER, SITES, START_TIMEOUT, provision


def _load_pem(path: Path):
    from cryptography import x509

    return x509.load_pem_x509_certificate(path.read_bytes())


def _role_of(project_file: Path) -> dict:
    return {p["name"]: p.get("role") for p in yaml.safe_load(project_file.read_text())["participants"]}


def _role_has_right(authorizer, role: str, right: str, site_org: str = "any_org", user_org: str = "any_org") -> bool:
    """Whether an admin with ``role`` (of ``user_org``) holds ``right`` at a site of ``site_org`` under a policy parsed by
    NVFlare's ``FLAuthorizer`` (:func:`fedseg.deploy.parse_authorization`)."""
    from nvflare.fuel.sec.authz import AuthzContext, Person

    user = Person(f"someone@{user_org}", user_org, role)
    ok, _ = authorizer.authorize(AuthzContext(right=right, user=user, submitter=user))
    return bool(ok)


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


def test_provisioned_he_keys_let_the_sites_decrypt_and_not_the_server(tmp_path):
    """HEBuilder in deploy/project.yml: every site's kit holds the secret key (one key for the federation), the
    server's kit the context without it; the server can add what one site encrypted, another site decrypts it."""
    ts = pytest.importorskip("tenseal")
    import torch

    from fedseg.fl.homomorphic import (Ciphertext, HEError, ServerAggregation, SiteEncryption, check_server_context,
                                       check_site_context)

    prod = provision(DEPLOY_PROJECT, tmp_path / "ws")
    server = ts.context_from((prod / SERVER / "startup" / "server_context.tenseal").read_bytes())
    sites = {s: ts.context_from((prod / s / "startup" / "client_context.tenseal").read_bytes()) for s in SITES}
    check_server_context(server)
    assert not (prod / SERVER / "startup" / "client_context.tenseal").exists()
    for site, context in sites.items():
        check_site_context(context, site)
        assert not (prod / site / "startup" / "server_context.tenseal").exists()
    with pytest.raises(HEError, match="secret key"):
        ServerAggregation(sites["hospital-a"])
    a, b = (SiteEncryption(sites[s], s) for s in SITES)
    reference = {"w": torch.zeros(5)}
    at_server = ServerAggregation(server)
    received = [at_server.read(s, e.encrypt({"w": torch.full((5,), float(i + 1))}), reference)["w"]
                for i, (s, e) in enumerate(zip(SITES, (a, b)))]
    summed = {"w": Ciphertext.weighted_sum(received, [0.5, 0.5])}
    for site in (a, b):  # 0.5 * 1 + 0.5 * 2, decrypted by either site
        assert torch.allclose(site.decrypt(at_server.to_wire(summed), reference)["w"], torch.full((5,), 1.5), atol=1e-4)


def test_authorization_policy_turns_custom_code_off_for_every_role():
    """Evaluated by NVFlare's own authorizer (FLAuthorizer), for users of the site's org and of another org."""
    from nvflare.apis.fl_constant import AdminCommandNames
    from nvflare.security.security import COMMAND_CATEGORIES

    from fedseg.deploy import BYOC_RIGHT, parse_authorization

    authz = parse_authorization(_deploy_builder_args()["authorization"], site_org="hospital_a")
    for role in ROLES:
        for user_org in ("hospital_a", "hospital_b"):
            assert not _role_has_right(authz, role, BYOC_RIGHT, "hospital_a", user_org), (role, user_org)
            assert not _role_has_right(authz, role, "server-predeployed-flwr", "hospital_a", user_org), role
    # the project admin keeps every other right NVFlare defines (its default policy gives it "any")
    rights = {v for k, v in vars(AdminCommandNames).items() if not k.startswith("_") and isinstance(v, str)}
    rights = (rights - set(COMMAND_CATEGORIES)) | set(COMMAND_CATEGORIES.values())
    missing = sorted(r for r in rights if not _role_has_right(authz, "project_admin", r, "hospital_a", "x"))
    assert not missing, f"project_admin lacks {missing}"
    assert _role_has_right(authz, "lead", "submit_job")
    assert not _role_has_right(authz, "org_admin", "submit_job")
    assert not _role_has_right(authz, "member", "submit_job") and _role_has_right(authz, "member", "view")
    # NVFlare's own default (the template) would let project_admin and lead submit custom code
    import nvflare.lighter

    template = yaml.safe_load((Path(nvflare.lighter.__file__).parent / "templates" / "master_template.yml").read_text())
    default = parse_authorization(json.loads(template["default_authz"]), site_org="hospital_a")
    assert _role_has_right(default, "project_admin", BYOC_RIGHT) and _role_has_right(default, "lead", BYOC_RIGHT)


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


@pytest.mark.slow
@pytest.mark.shared_runs("poc")
def test_poc_project_binds_server_to_loopback(shared_runs):
    """The POC NVFlare generated from poc_workspace/project.yml (the suite's one POC, tests/test_poc.py, which gives it
    free ports): NVFlare binds a loopback service target to loopback only."""
    from fedseg.fl.component_policy import class_allow_list

    prod = shared_runs("poc").workspace / "fedseg_poc" / "prod_00"
    cfg = json.loads((prod / "server" / "startup" / "fed_server.json").read_text())["servers"][0]
    assert cfg["service"]["target"].rsplit(":", 1)[0] == "127.0.0.1"
    for site in ("server", "site-1", "site-2", "site-3"):
        resources = json.loads((prod / site / "local" / "resources.json.default").read_text())
        assert resources["class_allow_list"] == class_allow_list()
    server = json.loads((prod / "server" / "local" / "resources.json.default").read_text())
    (scheduler,) = [c for c in server["components"] if c["id"] == "job_scheduler"]
    assert scheduler["args"]["min_schedule_interval"] == 2.0  # JobSchedulerBuilder; NVFlare's other args kept
    assert scheduler["args"]["max_jobs"] == 4


def test_job_scheduler_builder_refuses_a_bad_interval():
    from fedseg.deploy import JobSchedulerBuilder

    for bad in (0, -1, "2", 601):
        with pytest.raises(ValueError, match="min_schedule_interval"):
            JobSchedulerBuilder(bad)


def test_server_file_builders_edit_the_provisioned_server_kit(tmp_path):
    """``nvflare provision`` of the POC project (no process started): LoopbackServerBuilder rewrites the server's
    service target to 127.0.0.1 (the port kept) and JobSchedulerBuilder sets the scheduler's retry interval, each in
    the file StaticFileBuilder wrote."""
    repo = Path(__file__).resolve().parents[1]
    prod = provision(repo / "poc_workspace" / "project.yml", tmp_path / "ws")
    target = json.loads((prod / "server" / "startup" / "fed_server.json").read_text())["servers"][0]["service"]["target"]
    host, port = target.rsplit(":", 1)
    assert host == "127.0.0.1" and port.isdigit()
    server = json.loads((prod / "server" / "local" / "resources.json.default").read_text())
    (scheduler,) = [c for c in server["components"] if c["id"] == "job_scheduler"]
    assert scheduler["args"]["min_schedule_interval"] == 2.0


def test_server_file_builders_name_what_is_missing(tmp_path):
    """A server file builder in a project without a server, or listed before StaticFileBuilder wrote the file, stops
    provisioning with an error naming the builder."""
    from types import SimpleNamespace

    from fedseg.deploy import JobSchedulerBuilder, LoopbackServerBuilder

    ctx = SimpleNamespace(get_kit_dir=lambda server: str(tmp_path), get_local_dir=lambda server: str(tmp_path))
    for builder in (LoopbackServerBuilder(), JobSchedulerBuilder()):
        name = type(builder).__name__
        with pytest.raises(ValueError, match=f"{name}: the project has no server"):
            builder.build(SimpleNamespace(get_server=lambda: None), ctx)
        with pytest.raises(FileNotFoundError, match=f"list {name} after StaticFileBuilder"):
            builder.build(SimpleNamespace(get_server=lambda: object()), ctx)


def deployment_run(root: Path):
    """Shared run ``deployment`` (tests/sim_utils.py): ``deploy_utils.deployment_scenario`` in a process of its own
    (a fork of the session's launcher: ``sim_utils.run_call``), its output in ``ROOT/scenario.log``; the readers get
    what it saw."""
    from sim_utils import run_call

    def run() -> dict:
        run_call(["deploy_utils:scenario_main", root], root / "scenario.log", timeout=900, env={"HOME": str(root / "home")})
        return json.loads((root / "observations.json").read_text())

    return run


def _seen(shared_runs, step: str):
    """What the deployment scenario's ``step`` saw; fails with the step's own error if it failed."""
    seen = shared_runs("deployment")
    if step in seen["errors"]:
        pytest.fail(f"the deployment scenario's step {step!r} failed:\n{seen['errors'][step]}", pytrace=False)
    return seen[step]


@pytest.mark.slow
@pytest.mark.shared_runs("deployment")
def test_server_listens_on_loopback_only(shared_runs):
    seen = _seen(shared_runs, "listening")
    ports, ours = set(seen["ports"]), seen["listening"]
    assert {port for _, port, _ in ours} == ports, f"server not listening on {ports}: {ours}"
    assert {pid for _, _, pid in ours} == {seen["server_pid"]}
    assert all(ip == "127.0.0.1" for ip, _, _ in ours), ours


def _never_registered(watch: dict) -> str:
    """The impostor never appeared in the server's site list while it ran; returns its log (lower case)."""
    assert all("hospital-a" not in sites for sites in watch["seen"]), f"a client of another CA registered: {watch['seen']}"
    return watch["log"]


@pytest.mark.slow
@pytest.mark.shared_runs("deployment")
def test_client_with_a_certificate_from_another_ca_is_refused(shared_runs):
    seen = _seen(shared_runs, "impostors")
    prod, foreign = Path(shared_runs("deployment")["prod"]), Path(shared_runs("deployment")["foreign"])
    assert (foreign / "hospital-a" / "startup" / "rootCA.pem").read_bytes() != (
        prod / "hospital-a" / "startup" / "rootCA.pem").read_bytes()

    # 1. TLS layer, both server ports: the server answers HTTP to the genuine certificate (whose holder also checks
    #    that the server's certificate names fl-server.hospital.example); the impostor's gets no answer at all
    for port, answers in seen["https"].items():
        assert answers["genuine"].startswith("HTTP/1.1 "), port
        assert not answers["impostor"].startswith("HTTP"), (port, answers["impostor"])
    assert len(seen["https"]) == 2
    assert "hospital-a" not in seen["after_tls"]

    # 2. NVFlare client: the impostor's client process never registers
    _never_registered(seen["impostor_client"])

    # 3. the other project's kit as issued does not even trust our server (the client refuses it)
    failure = "certificate verify failed"
    client_log = _never_registered(seen["foreign_client"])
    assert failure in client_log, client_log[-3000:]

    # 4. the genuine hospital-a (this project's CA) registers with the same server: the refusals were the certificates
    genuine = seen["genuine"]
    why = f"exited (rc {genuine['exit']})" if genuine["exit"] is not None else f"not within {START_TIMEOUT:.0f}s"
    assert genuine["registered"], f"hospital-a did not register, {why}:\n{genuine['log']}"


@pytest.mark.slow
@pytest.mark.shared_runs("deployment")
def test_job_with_custom_code_is_refused_and_our_recipe_runs_in_prod_env(shared_runs, capsys):
    """NVFlare checks the byoc right when it deploys a job (at the server, then at each site, each with its own
    authorization.json): a job with app/custom code never runs, whoever submits it; our recipe, submitted by NVFlare's
    ProdEnv with the admin's startup kit, runs to the end and its downloaded result reads like a simulator's."""
    seen = _seen(shared_runs, "jobs")
    prod = Path(shared_runs("deployment")["prod"])
    for admin in (PROJECT_ADMIN, LEAD):  # the two roles NVFlare's default policy lets submit custom code
        meta = seen["with_code"][admin]
        assert meta["status"] == "FINISHED:FAILED_TO_RUN", meta
        assert meta["byoc"] is True and meta["submitter_role"] == _role_of(DEPLOY_PROJECT)[admin]
        assert any("BYOC not permitted" in d for d in meta.get("job_deploy_detail", [])), meta
        assert meta.get("start_time") in ("", None), meta  # it never started anywhere

    # our recipe (configuration only) through NVFlare's ProdEnv, the FLARE API session of the admin's startup kit:
    # accepted by the server and both sites under their own policies, run to the end, its result downloaded
    from fedseg.cli import main as fedseg_main
    from fedseg.recipes.environments import ExecEnvError, prod_env, report_in

    for kit, fix in ((prod / "hospital-a", "not an admin's startup kit"), (prod / LEAD, "log in as")):
        with pytest.raises(ExecEnvError, match=fix):  # a site's kit; a kit whose certificate names someone else
            prod_env(kit, username=PROJECT_ADMIN)
    result, meta = seen["result"], seen["meta"]
    assert seen["status"] == "FINISHED:COMPLETED" and result, (seen["status"], result)
    assert not meta.get("byoc") and not any("BYOC" in d for d in meta.get("job_deploy_detail", [])), meta
    assert sorted(meta["job_deploy_detail"]) == sorted(f"{p}: OK" for p in ["server", *SITES]), meta
    report = json.loads(report_in(result).read_text())
    assert report["method"] == "fedavg" and sorted(report["clients"]) == SITES and len(report["rounds"]) == 1
    fedseg_main(["summarise", str(result)])  # reads the downloaded result as it reads a simulator workspace
    assert "fedavg — final global model (test split)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.shared_runs("deployment")
def test_homomorphic_aggregation_keeps_every_model_from_the_server(shared_runs):
    """FedAvg with he=True through ProdEnv, keys from HEBuilder in the kits: the job completes, each site keeps the
    global model it decrypted, and the server's side (its kit and the job's workspace as its job store keeps it:
    checkpoint, stored model, logs, report) holds none of those models in the clear. A job whose server is given a
    context with the secret key stops with the server's one line."""
    seen = _seen(shared_runs, "homomorphic")
    assert seen["status"] == "FINISHED:COMPLETED" and seen["result"], seen
    assert sorted(Path(p).parts[0] for p in seen["decrypted"]) == SITES
    files = seen["server_files"]
    assert {"FL_global_model.he.pt", "round_checkpoint.pt", "report.json", "log.txt"} <= set(files), files
    assert not [f for f in files if f.endswith("FL_global_model.pt")], files
    assert seen["plaintext_at_server"] == []
    refused = seen["secret_key"]
    assert refused["status"] == "FINISHED:EXECUTION_EXCEPTION" and refused["logged"], refused
