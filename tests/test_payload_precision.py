"""Weights sent in float16/bfloat16 (train_config ``payload_dtype``, ``fedseg.fl.payload``).

* the wire cast against NumPy's own float16 rounding and against bfloat16's definition (float32 with the low
  16 bits rounded off), integer buffers untouched, float32 a no-op;
* a site given a half-precision task trains in float32 and answers in the wire dtype;
* in NVFlare's simulator a float16 round moves half the bytes of a float32 round, and the server's global
  model comes back in float32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from fedseg.fl.payload import from_wire, payload_dtype, to_wire
from fedseg.fl.protocol import META_KEY, TRAIN_TASK
from fedseg.recipes.base import build_initial_network
from inprocess import builtin_sites, run_in_process


def test_float16_wire_copy_is_numpys_float16_rounding():
    rng = np.random.default_rng(0)
    x = rng.normal(scale=3.0, size=(64, 9)).astype(np.float32)
    wire = to_wire({"w": torch.from_numpy(x)}, torch.float16)["w"]
    assert wire.dtype == torch.float16
    np.testing.assert_array_equal(wire.numpy(), x.astype(np.float16))
    back = from_wire({"w": wire})["w"]
    assert back.dtype == torch.float32
    # round to nearest with 10 mantissa bits: relative error at most 2**-11 for normal numbers
    assert np.all(np.abs(back.numpy() - x) <= np.abs(x) * 2.0**-11 + 1e-30)


def test_bfloat16_wire_copy_keeps_the_top_16_bits_rounded():
    rng = np.random.default_rng(1)
    x = (rng.normal(size=1000) * 10.0 ** rng.uniform(-20, 20, size=1000)).astype(np.float32)
    back = from_wire(to_wire({"w": torch.from_numpy(x)}, torch.bfloat16))["w"].numpy()
    # bfloat16 = float32 with its low 16 bits rounded (to nearest, ties to even): compute it from the bits
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    np.testing.assert_array_equal(back, rounded.view(np.float32))


def test_integer_buffers_arrays_and_float32_are_handled():
    counts = torch.tensor(7, dtype=torch.int64)
    params = {"bn.num_batches_tracked": counts, "w": np.ones((2, 2), dtype=np.float64), "b": torch.zeros(3)}
    wire = to_wire(params, torch.bfloat16)
    assert wire["bn.num_batches_tracked"] is counts
    assert wire["w"].dtype == torch.bfloat16 and wire["b"].dtype == torch.bfloat16
    same = to_wire(params, torch.float32)
    assert all(same[k] is params[k] for k in params)
    assert payload_dtype({}) == torch.float32 and payload_dtype({"payload_dtype": "float16"}) == torch.float16
    with pytest.raises(ValueError, match="payload_dtype"):
        payload_dtype({"payload_dtype": "int8"})


def test_site_answers_in_the_wire_dtype_and_trains_in_float32(tmp_path, monkeypatch, tiny_datalist, tiny_train_config):
    from nvflare.apis.event_type import EventType
    from nvflare.apis.fl_constant import ReservedKey
    from nvflare.apis.fl_context import FLContext

    from fedseg.fl.site_executor import FedSegSiteExecutor

    monkeypatch.chdir(tmp_path)
    cfg = {**tiny_train_config, "payload_dtype": "bfloat16", "local_epochs": 1}
    executor = FedSegSiteExecutor(f"--datalist {tiny_datalist}")
    ctx = FLContext()
    ctx.set_prop(ReservedKey.IDENTITY_NAME, "site-a", private=False, sticky=True)
    executor.handle_event(EventType.START_RUN, ctx)
    sent = to_wire(build_initial_network(cfg).state_dict(), torch.bfloat16)
    meta = {META_KEY: {"method": "fedavg", "objective": "fedavg", "objective_args": {}, "train_config": cfg,
                       "round": 0, "total_rounds": 2}}
    task = FLModelUtils.to_shareable(FLModel(params=sent, params_type=ParamsType.FULL, meta=meta, current_round=0))
    answer = FLModelUtils.from_shareable(executor.execute(TRAIN_TASK, task, ctx, Signal()))
    assert "error" not in answer.meta, answer.meta
    model = executor._service.runner.model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for key, value in answer.params.items():
        live = model.state_dict()[key]
        if torch.is_floating_point(live):
            assert value.dtype == torch.bfloat16, key
            torch.testing.assert_close(value.float(), live, rtol=2.0**-8, atol=0.0)
        else:
            assert value.dtype == live.dtype, key


@pytest.fixture(scope="module")
def polyp_sites(tmp_path_factory):
    return builtin_sites("polyp", ["site-1", "site-2"], tmp_path_factory.mktemp("polyp"))


def test_float16_round_moves_half_the_bytes(polyp_sites, tmp_path):
    """One FedAvg round, 2 sites, float32 vs float16 wire: bytes halve, the model stays float32 and close.

    The real server workflow with in-process sites (``fedseg.bench.inprocess``; the conversion to and from the wire
    is the controller's and the sites' own code, so NVFlare's transport adds nothing to check here): plain SGD, one
    epoch, no augmentation, so the update is the gradient and the comparison sees the wire rounding rather than
    Adam's sign-like first steps (which turn tiny input differences on near-zero gradients into full steps)."""
    reports, models = {}, {}
    for dtype in ("float32", "float16"):
        report = run_in_process("fedavg", polyp_sites, tmp_path / dtype, num_rounds=1, augment=False, optimizer_name="SGD",
                                learning_rate=0.1, local_epochs=1, payload_dtype=dtype)
        assert report["config"]["train_config"]["payload_dtype"] == dtype
        assert report["config"]["train_config"]["optimizer_name"] == "SGD" and len(report["rounds"]) == 1
        reports[dtype] = report
        assert report["rounds"][0]["rejected"] == {} and report["rounds"][0]["missing"] == []
        models[dtype] = report["_controller"].saved[-1]
    full, half = reports["float32"]["rounds"][0], reports["float16"]["rounds"][0]
    # weights dominate both directions; meta (a few scalars and the job settings' numbers) adds a little
    assert 0.49 < half["bytes_received"] / full["bytes_received"] < 0.52
    assert 0.49 < half["bytes_sent"] / full["bytes_sent"] < 0.52
    initial = build_initial_network(reports["float32"]["config"]["train_config"]).state_dict()
    updates = {}
    for dtype, model in models.items():
        for key, value in model.items():
            assert torch.as_tensor(value).dtype == initial[key].dtype, (dtype, key)
        updates[dtype] = torch.cat([(torch.as_tensor(model[k]) - v).flatten() for k, v in initial.items() if v.is_floating_point()])
    # one rounding of the start model and of each site's result: the round's update keeps direction and size
    cosine = float(torch.nn.functional.cosine_similarity(updates["float16"], updates["float32"], dim=0))
    ratio = float(updates["float16"].norm() / updates["float32"].norm())
    assert cosine > 0.99 and 0.98 < ratio < 1.02, (cosine, ratio)
