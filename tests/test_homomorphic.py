"""Homomorphic aggregation (fedseg.fl.homomorphic): encrypted weighted sums against NumPy within the stated CKKS bound
(FedAvg's and FedEvi's weights), keys as NVFlare's HEBuilder provisions them, what the server can and cannot do, the
refusals, and a FedEvi run in the simulator under HE against the same run in the clear."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

ts = pytest.importorskip("tenseal")

from fedseg.fl.homomorphic import (CKKS_ABS_TOL, SLOTS, Ciphertext, HEError, ServerAggregation, SiteEncryption,  # noqa: E402
                                   check_server_context, check_site_context, encrypt_tensor, is_wire_ciphertext,
                                   provision_contexts)
from fedseg.fl.validation import InvalidUpdateError  # noqa: E402
from fedseg.strategies.aggregation import sample_weights, weighted_average  # noqa: E402
from fedseg.strategies.base import ClientUpdate  # noqa: E402
from fedseg.strategies.fedavg import FedAvgStrategy  # noqa: E402
from fedseg.strategies.fedevi import FedEviStrategy  # noqa: E402
from he_utils import plaintext_copies  # noqa: E402
from inprocess import builtin_sites, run_in_process  # noqa: E402

#: entry shapes of a small model: one entry spans several ciphertexts (SLOTS values each), one is a scalar
SHAPES = {"conv.weight": (8, 3, 3, 3), "big.weight": (SLOTS + 517,), "conv.bias": (8,), "scale": (),
          "bn.num_batches_tracked": ()}


@pytest.fixture(scope="module")
def key_files(tmp_path_factory):
    """``(server context file, site context file)``: a key pair written by NVFlare's HEBuilder."""
    return provision_contexts(tmp_path_factory.mktemp("he_keys"))


@pytest.fixture(scope="module")
def keys(key_files):
    """``(server context, site context)`` read from :func:`key_files`."""
    return tuple(ts.context_from(path.read_bytes()) for path in key_files)


def _model(seed: int, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    model = {k: scale * torch.randn(s, generator=g) for k, s in SHAPES.items() if not k.endswith("tracked")}
    model["bn.num_batches_tracked"] = torch.tensor(seed, dtype=torch.long)
    return model


def _through_the_server(keys, models):
    """Each model encrypted by its site, read by the server (ciphertexts, no secret key)."""
    server_ctx, site_ctx = keys
    reference = models[0]
    server = ServerAggregation(server_ctx)
    return [server.read(f"site-{i}", SiteEncryption(site_ctx, f"site-{i}").encrypt(m), reference)
            for i, m in enumerate(models)], server


def _decrypted(keys, params, reference):
    """What a site receives and decrypts."""
    return SiteEncryption(keys[1], "site-0").decrypt(ServerAggregation.to_wire(params), reference)


def _assert_within_bound(got, expected):
    for key, value in expected.items():
        bound = CKKS_ABS_TOL * max(1.0, float(value.abs().max()))
        assert torch.allclose(got[key].double(), value.double(), rtol=0, atol=bound), key


def _numpy_weighted_sum(models, weights):
    return {k: torch.as_tensor(np.sum([w * m[k].double().numpy() for w, m in zip(weights, models)], axis=0))
            for k in models[0] if torch.is_floating_point(models[0][k])}


@settings(max_examples=6, deadline=None)
@given(n=st.lists(st.integers(1, 500), min_size=2, max_size=4), scale=st.sampled_from([0.05, 1.0, 30.0]))
def test_encrypted_fedavg_equals_numpy_weighted_sum_within_the_ckks_bound(keys, n, scale):
    models = [_model(i, scale) for i in range(len(n))]
    weights = sample_weights({str(i): k for i, k in enumerate(n)}, [str(i) for i in range(len(n))])
    encrypted, _ = _through_the_server(keys, models)
    aggregated = weighted_average(encrypted, weights)
    assert all(isinstance(aggregated[k], Ciphertext) for k in SHAPES if not k.endswith("tracked"))
    got = _decrypted(keys, aggregated, models[0])
    _assert_within_bound(got, _numpy_weighted_sum(models, weights))
    # integer entries travel in the clear and are taken from the first model, as in the clear
    assert got["bn.num_batches_tracked"].item() == 0


def test_fedavg_strategy_under_he_reports_the_same_weights(keys):
    models = [_model(i) for i in range(3)]
    encrypted, _ = _through_the_server(keys, models)
    plain, enc = FedAvgStrategy(), FedAvgStrategy()
    for strategy in (plain, enc):
        strategy.start(["site-0", "site-1", "site-2"], models[0])
    n = [10, 30, 60]
    fp = plain.aggregate(0, {f"site-{i}": ClientUpdate(f"site-{i}", models[i], n[i]) for i in range(3)}, None)
    fe = enc.aggregate(0, {f"site-{i}": ClientUpdate(f"site-{i}", encrypted[i], n[i]) for i in range(3)}, None)
    assert fe == fp and fp["aggregation_weight"] == pytest.approx({"site-0": 0.1, "site-1": 0.3, "site-2": 0.6})
    _assert_within_bound(_decrypted(keys, enc.global_params(), models[0]), _numpy_weighted_sum(models, [0.1, 0.3, 0.6]))


def _fedevi_round(strategy, updates, decrypt):
    """One FedEvi aggregation whose surrogate task answers as a site would: G from the surrogate it received
    (decrypted at the site), so the surrogate itself is checked too."""

    def exchange(task, payloads):
        out = {}
        for site, payload in payloads.items():
            surrogate = decrypt(payload.params)
            g = float(surrogate["conv.weight"].abs().mean()) * (1 + int(site[-1]))
            out[site] = ClientUpdate(site, {}, meta={"G": g})
        return out

    return strategy.aggregate(0, updates, exchange)


def test_encrypted_fedevi_equals_numpy_with_its_weights(keys):
    models = [_model(10 + i) for i in range(3)]
    encrypted, _ = _through_the_server(keys, models)
    sites = [f"site-{i}" for i in range(3)]
    stats = [{"A": 0.2, "n": 12}, {"A": 0.5, "n": 40}, {"A": 0.1, "n": 20}]
    plain, enc = FedEviStrategy(), FedEviStrategy()
    for strategy in (plain, enc):
        strategy.start(sites, models[0])
    fp = _fedevi_round(plain, {s: ClientUpdate(s, models[i], stats[i]["n"], meta={"A": stats[i]["A"]})
                               for i, s in enumerate(sites)}, lambda p: p)
    fe = _fedevi_round(enc, {s: ClientUpdate(s, encrypted[i], stats[i]["n"], meta={"A": stats[i]["A"]})
                             for i, s in enumerate(sites)}, lambda p: _decrypted(keys, p, models[0]))
    # the weights come from the same statistics (G from a surrogate decrypted at the sites): equal to CKKS precision
    assert fe["beta"] == pytest.approx(fp["beta"], abs=1e-6) and fe["G"] == pytest.approx(fp["G"], rel=1e-5)
    beta = [fp["beta"][s] for s in sites]
    assert beta != pytest.approx(sample_weights({s: st_["n"] for s, st_ in zip(sites, stats)}, sites))  # weights moved
    _assert_within_bound(_decrypted(keys, enc.global_params(), models[0]), _numpy_weighted_sum(models, beta))


def test_provisioned_keys_separate_the_server_from_the_sites(keys, tmp_path):
    server_ctx, site_ctx = keys
    assert not server_ctx.is_private() and site_ctx.is_private()
    check_server_context(server_ctx)
    check_site_context(site_ctx, "site-1")
    with pytest.raises(HEError, match="server's HE context holds a secret key"):
        ServerAggregation(site_ctx)
    with pytest.raises(HEError, match="site-1: its HE context holds no secret key"):
        SiteEncryption(server_ctx, "site-1")
    # what leaves a site is ciphertext only: the server's context reads it but cannot decrypt it
    sent = SiteEncryption(site_ctx, "site-1").encrypt({"w": torch.ones(10)})
    assert is_wire_ciphertext(sent["w"])
    at_server = ts.ckks_vector_from(server_ctx, sent["w"][0])
    with pytest.raises(ValueError, match="secret_key"):
        at_server.decrypt()
    # the ciphertext carries no context of its own (NVFlare's CKKSVector decomposer ships the context's public part,
    # 0.66 MB, with every vector): the server reads it with its own public context
    assert not at_server.context().is_private()


def test_a_site_refuses_to_encrypt_nan_and_a_selection_of_nothing(keys):
    site = SiteEncryption(keys[1], "site-1")
    with pytest.raises(HEError, match="'w' contains NaN or Inf; nothing is sent"):
        site.encrypt({"w": torch.tensor([1.0, float("nan")])})
    with pytest.raises(HEError, match="selects no floating-point entry"):
        SiteEncryption(keys[1], "site-1", encrypt_layers="no_such_layer").encrypt({"w": torch.ones(3)})
    only_conv = SiteEncryption(keys[1], "site-1", encrypt_layers="conv").encrypt({"conv.w": torch.ones(3), "fc.w": torch.ones(2)})
    assert is_wire_ciphertext(only_conv["conv.w"]) and isinstance(only_conv["fc.w"], torch.Tensor)


def test_the_server_rejects_a_malformed_encrypted_update(keys):
    server_ctx, site_ctx = keys
    server = ServerAggregation(server_ctx)
    reference = {"w": torch.zeros(6), "b": torch.zeros(2)}
    good = SiteEncryption(site_ctx, "site-1").encrypt({"w": torch.ones(6), "b": torch.ones(2)})
    assert set(server.read("site-1", good, reference)) == {"w", "b"}
    with pytest.raises(InvalidUpdateError, match="'w' holds 5 encrypted values, expected shape"):
        server.read("site-1", {**good, "w": encrypt_tensor(torch.ones(5), site_ctx)}, reference)
    with pytest.raises(InvalidUpdateError, match="'w' is not a ciphertext of this federation's context"):
        server.read("site-1", {**good, "w": [b"not a ciphertext"]}, reference)
    with pytest.raises(InvalidUpdateError, match="parameter names differ"):
        server.read("site-1", {"w": good["w"]}, reference)
    with pytest.raises(InvalidUpdateError, match="contains NaN or Inf"):  # an entry in the clear is checked as always
        server.read("site-1", {**good, "b": torch.tensor([1.0, float("inf")])}, reference)


def test_ciphertexts_survive_a_checkpoint_read_with_weights_only(keys):
    models = [_model(i) for i in range(2)]
    encrypted, server = _through_the_server(keys, models)
    state = {"global": weighted_average(encrypted, [0.5, 0.5]), "beta": {"site-0": 0.5}}
    buffer = io.BytesIO()
    torch.save(server.encode(state), buffer)
    buffer.seek(0)
    restored = server.decode(torch.load(buffer, weights_only=True))
    assert restored["beta"] == {"site-0": 0.5}
    _assert_within_bound(_decrypted(keys, restored["global"], models[0]), _numpy_weighted_sum(models, [0.5, 0.5]))


ACCEPTING = {"fedavg": {}, "fedprox": {}, "fedevi": {}, "fvac": {}, "fedbn": {"norm": "batch"}, "ditto": {},
             "moon": {}, "fedrep": {}, "pathfl": {"use_ssa": False}}
REFUSING = {
    "graphfedseg": ({}, "collaboration graph is solved from the cosine similarity"),
    "fedce": ({}, "contribution estimate"),
    "fedadam": ({}, "FedAdam and FedAvgM step the global model"),
    "fedavgm": ({}, "FedAdam and FedAvgM step the global model"),
    "fedavg": ({"aggregation": "median"}, "aggregation=median sorts the sites' values"),
    "fedevi": ({"server_optimizer": "adam"}, "a server optimiser"),
    "pathfl": ({}, "SSA weighs each site by running its model on noise"),
    "scaffold": ({}, "control variates"),
    "feddyn": ({}, "correction state"),
    "fedefm": ({}, "no global model"),
}


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    return builtin_sites("polyp", ["site-1", "site-2"], tmp_path_factory.mktemp("he_data"))


@pytest.mark.parametrize("method", sorted(ACCEPTING))
def test_methods_whose_server_step_is_a_weighted_sum_run_a_round_under_he(method, key_files, two_sites, tmp_path):
    """One round through the real server workflow (in process): the server's global model is ciphertexts, every
    site decrypts what it receives, the final evaluation is scores, and each site keeps the decrypted model."""
    server_key, site_key = key_files
    report = run_in_process(method, two_sites, tmp_path, num_rounds=1, local_epochs=1, he=True,
                            he_server_context=str(server_key), he_site_context=str(site_key), **ACCEPTING[method])
    controller = report["_controller"]
    assert report["rounds"][0]["missing"] == [] and report["rounds"][0]["rejected"] == {}, report["rounds"][0]
    assert report["config"]["he"]["model_screening"].startswith("off")
    shared = controller._strategy._global  # the entries the sites share (FedBN / FedRep: without their local layers)
    # PathFL's AFA target moments are set by the server from declared statistics, in the clear
    floats = [k for k, v in controller._reference.items()
              if k in shared and torch.is_floating_point(v) and not k.startswith("bottleneck_alignment.")]
    assert floats and all(isinstance(shared[k], Ciphertext) for k in floats)
    assert controller.saved == []  # nothing went to NVFlare's plaintext persistor
    sent = [t for t in controller.sent if t["task"] == "train"]
    assert all(t["meta"]["fedseg"]["he"] == {"encrypt_layers": None} for t in sent)
    final = report["final"].get("global") or report["final"].get("personalized")
    assert set(final) == {"site-1", "site-2"} and all(0 <= m["dice"] <= 1 for m in final.values())
    if "global" in report["final"]:
        for site in ("site-1", "site-2"):
            kept = torch.load(tmp_path / "sites" / site / "fedseg_outputs" / site / "global_model.pt", weights_only=True)
            assert set(kept["model"]) == set(controller._reference)


@pytest.mark.parametrize("method", sorted(REFUSING))
def test_methods_that_read_the_models_refuse_he_with_their_reason(method, tmp_path):
    from fedseg.recipes.export import export_job

    options, reason = REFUSING[method]
    with pytest.raises(HEError, match=f"cannot aggregate encrypted models \\(he\\): .*{reason}"):
        export_job(method, tmp_path, "tiny", he=True, **options)


# ------------------------------------------------------------------------------------------------ in the simulator
def fedevi_he_run(root: Path):
    """Shared run ``fedevi_he`` (tests/sim_utils.py): the shared run ``fedevi``'s configuration (3 vessel sites, 2 rounds,
    no augmentation) with homomorphic aggregation, keys written by NVFlare's HEBuilder for the simulated
    participants."""
    from fedseg.recipes.export import export_job
    from sim_utils import FEDEVI, SimRun, run_simulator

    server_key, site_key = provision_contexts(root / "keys")
    spec = FEDEVI.but(he=True, he_server_context=str(server_key), he_site_context=str(site_key))
    job = export_job(spec.method, root / "jobs", profile=spec.profile, **spec.options)
    return lambda: SimRun("fedevi_he", spec, job, root / "ws", run_simulator(job, root / "ws", clients=list(spec.sites)))


@pytest.mark.slow
@pytest.mark.shared_runs("fedevi", "fedevi_he")
def test_fedevi_under_he_in_the_simulator_equals_the_run_in_the_clear_and_the_server_holds_no_model(shared_runs):
    """The same seeds and data: FedEvi's weights and final Dice equal the plaintext run's within CKKS precision; the
    server's workspace (checkpoints, stored model, logs, report) holds none of the models the sites decrypted,
    while the plaintext run's server holds them (the check can fail)."""
    plain, he = shared_runs("fedevi"), shared_runs("fedevi_he")
    for a, b in zip(plain.report["rounds"], he.report["rounds"]):
        assert b["missing"] == [] and b["rejected"] == {}, b
        # one CKKS aggregation moves the model by ~1e-7; training amplifies it round by round, and two HE runs differ
        # too (fresh encryption noise): the weights and the Dice agree to 1e-3 and 5e-3 here (docs/results/cost.md)
        assert b["beta"] == pytest.approx(a["beta"], abs=1e-3) and b["G"] == pytest.approx(a["G"], rel=1e-2)
        assert b["bytes_received"] > 5 * a["bytes_received"]  # ciphertexts are an order of magnitude larger
    for site, metrics in plain.report["final"]["global"].items():
        assert he.report["final"]["global"][site]["dice"] == pytest.approx(metrics["dice"], abs=5e-3), site
    # what the server's audit saw arrive: ciphertexts (count and bytes) for every floating-point entry
    sent = [d for record in he.audit() for d in (record.get("params") or {}).values()]
    assert sent and all(d["type"] == "ckks" or "int" in d.get("dtype", "") for d in sent), sent[:3]
    decrypted = [torch.load(he.site_outputs(s) / "global_model.pt", weights_only=True)["model"] for s in he.sites]
    assert not list(he.workspace.joinpath("server").rglob("FL_global_model.pt"))
    assert (he.run_dir / "FL_global_model.he.pt").is_file() and (he.run_dir / "round_checkpoint.pt").is_file()
    assert plaintext_copies(he.workspace / "server", decrypted) == []
    assert plaintext_copies(plain.workspace / "server", decrypted)  # the plaintext server holds the same model


def test_a_restarted_server_continues_from_its_encrypted_checkpoint(key_files, two_sites, tmp_path):
    """The round checkpoint holds ciphertexts (no tensor of a model in the clear); a server started again with the same
    job reads them back and its final evaluation of the restored model gives the first server's scores."""
    from fedseg.bench.inprocess import InProcessController, controller_args

    server_key, site_key = key_files
    options = dict(num_rounds=1, local_epochs=1, he=True, he_server_context=str(server_key),
                   he_site_context=str(site_key), checkpoint_dir=str(tmp_path / "ckpt"))
    first = run_in_process("fedevi", two_sites, tmp_path / "first", **options)
    stored = torch.load(tmp_path / "ckpt" / "round_checkpoint.pt", weights_only=True)
    floats = [k for k, v in first["_controller"]._reference.items() if torch.is_floating_point(v)]
    assert all(set(stored["global"][k]) == {"ckks", "shape"} for k in floats)
    args = controller_args("fedevi", tmp_path / "second", **options)
    again = InProcessController(two_sites, tmp_path / "second" / "server", tmp_path / "first" / "sites",
                                he_site_context=str(site_key), **args)
    again.run()
    report = json.loads((tmp_path / "second" / "server" / "report.json").read_text())
    assert report["resumed_at"] == [1] and [r["round"] for r in report["rounds"]] == [0]
    for site, metrics in first["final"]["global"].items():
        assert report["final"]["global"][site]["dice"] == pytest.approx(metrics["dice"], abs=1e-6)


def test_fedseg_run_he_refuses_a_method_that_reads_the_models_in_one_line(tmp_path):
    from fedseg.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["run", "graphfedseg", "--he", "-n", "2", "--profile", "tiny", "-w", str(tmp_path / "ws")])
    message = str(stop.value)
    assert message.startswith("fedseg run: graphfedseg cannot aggregate encrypted models (he): ") and "\n" not in message
    assert not (tmp_path / "ws").exists()  # nothing started


def test_only_the_layers_named_are_encrypted(key_files, two_sites, tmp_path):
    """``he_encrypt_layers`` as NVFlare's: a regular expression; the other entries travel and are averaged in the clear."""
    server_key, site_key = key_files
    report = run_in_process("fedavg", two_sites, tmp_path, num_rounds=1, local_epochs=1, he=True,
                            he_server_context=str(server_key), he_site_context=str(site_key),
                            he_encrypt_layers=r"\.weight$")
    controller = report["_controller"]
    assert report["rounds"][0]["rejected"] == {} and report["config"]["he"]["encrypt_layers"] == r"\.weight$"
    kinds = {k: isinstance(v, Ciphertext) for k, v in controller._strategy.global_params().items()
             if torch.is_floating_point(controller._reference[k])}
    assert kinds and all(encrypted == k.endswith(".weight") for k, encrypted in kinds.items()), kinds
    assert any(not encrypted for encrypted in kinds.values())


def test_a_site_without_the_secret_key_answers_with_the_error_and_sends_nothing(key_files, two_sites, tmp_path, caplog):
    """Both sites given the server's public context: each logs its one line, sends only the error's type, and the round
    cannot go on (no valid result)."""
    server_key, _ = key_files
    with pytest.raises(RuntimeError, match="only 0 valid results"):
        run_in_process("fedavg", two_sites, tmp_path, num_rounds=1, local_epochs=1, he=True,
                       he_server_context=str(server_key), he_site_context=str(server_key))
    assert "site-1: its HE context holds no secret key" in caplog.text
    assert "the site could not run the task (HEError" in caplog.text
