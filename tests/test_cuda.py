"""The CUDA paths (marker ``cuda``; every test skips, with the reason, where torch sees no CUDA device).

``benchmarks/gpu/gpu_check.py`` runs them first on a GPU machine: 2-D and 3-D engine training and evaluation on CUDA (the
same numbers as on CPU), float16 autocast with the gradient scaler, DP-SGD, a 2-site simulator job with
``-gpu 0`` (NVFlare's simulator option) and a GPU-trained model and site state read back on a CPU-only reader.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedseg.objectives.base import ClientObjective, RoundContext
from fedseg.recipes.base import build_initial_network

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def _engine(datalist, cfg, device, **kwargs):
    from fedseg.engine import SegEngine

    return SegEngine("site-a", datalist, cfg, device=device, **kwargs)


def _flat_update(model, start):
    return torch.cat([(v.detach().float().cpu() - start[k]).flatten() for k, v in model.state_dict().items()
                      if v.is_floating_point()])


def test_engine_trains_and_evaluates_on_cuda_like_on_cpu(tiny_datalist, tiny_train_config):
    """One local epoch on CUDA: weights stay on the GPU, the loss is finite and falls over epochs; the trained
    model's class scores on the GPU equal the CPU's for the same weights, and so do its test metrics."""
    cfg = {**tiny_train_config, "augment": False}
    engine = _engine(tiny_datalist, cfg, CUDA)
    assert engine.device.type == "cuda"
    torch.manual_seed(0)
    model = engine.build_network()
    assert all(p.device.type == "cuda" for p in model.parameters())
    ctx = RoundContext("site-a", 0, 1)
    losses = [engine.train(model, ClientObjective(), ctx)["train_loss"] for _ in range(3)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
    assert all(p.device.type == "cuda" for p in model.parameters())

    cpu_engine = _engine(tiny_datalist, cfg, CPU)
    cpu_model = cpu_engine.build_network()
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    batch = next(iter(engine.loader("test")))
    with torch.no_grad():
        on_gpu = torch.softmax(engine.predict(model, batch["image"].to(CUDA)).float(), 1).cpu()
        on_cpu = torch.softmax(cpu_engine.predict(cpu_model, batch["image"]).float(), 1)
    # TF32 convolutions on recent GPUs round differently from CPU float32: probabilities agree to ~1e-3
    torch.testing.assert_close(on_gpu, on_cpu, atol=2e-2, rtol=0)
    gpu_metrics = engine.evaluate(model, "test")
    cpu_metrics = cpu_engine.evaluate(cpu_model, "test")
    assert set(gpu_metrics) == {"dice", "hd95", "assd"} and all(math.isfinite(v) for v in gpu_metrics.values())
    assert gpu_metrics["dice"] == pytest.approx(cpu_metrics["dice"], abs=0.02)


def test_float16_autocast_uses_the_gradient_scaler(tiny_datalist, tiny_train_config, monkeypatch):
    """amp='float16' on CUDA: convolutions run in float16, weights stay float32, a GradScaler scales every
    step's loss, and the epoch's update points the way float32's does (plain SGD: the update is the gradient)."""
    scaled = []

    class RecordingScaler(torch.amp.GradScaler):
        def scale(self, outputs):
            scaled.append(float(self.get_scale()))
            return super().scale(outputs)

    monkeypatch.setattr(torch.amp, "GradScaler", RecordingScaler)
    cfg = {**tiny_train_config, "augment": False, "local_epochs": 1, "optimizer_name": "SGD", "learning_rate": 0.1}
    results = {}
    for amp in (None, "float16"):
        engine = _engine(tiny_datalist, {**cfg, "amp": amp}, CUDA)
        torch.manual_seed(0)
        model = engine.build_network()
        start = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
        conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
        dtypes = set()
        hook = conv.register_forward_hook(lambda module, inputs, output: dtypes.add(output.dtype))
        out = engine.train(model, ClientObjective(), RoundContext("site-a", 0, 1))
        hook.remove()
        results[amp] = (out, dtypes, model, _flat_update(model, start))
        if amp is None:
            assert not scaled, "a gradient scaler was used without float16"
    (out32, dtypes32, _, update32), (out16, dtypes16, model16, update16) = results[None], results["float16"]
    assert dtypes32 == {torch.float32} and dtypes16 == {torch.float16}
    assert all(p.dtype == torch.float32 for p in model16.parameters())
    assert len(scaled) == int(out16["steps"]) > 0 and all(s > 1 for s in scaled), scaled
    assert math.isfinite(out16["train_loss"]) and abs(out16["train_loss"] - out32["train_loss"]) < 0.02 * abs(out32["train_loss"])
    assert torch.nn.functional.cosine_similarity(update16, update32, dim=0) > 0.9
    assert 0.9 < float(update16.norm() / update32.norm()) < 1.1


def test_dp_sgd_on_cuda(tiny_datalist, tmp_path):
    """Opacus DP-SGD on the GPU: epsilon is spent and stays within the budget, the model stays a plain network
    on the GPU with finite weights."""
    from fedseg.config import resolve_profile

    target = 5.0
    cfg = resolve_profile("tiny", dp_target_epsilon=target, local_epochs=1)["train_config"]
    engine = _engine(tiny_datalist, cfg, CUDA, dp_seed=0)
    model = engine.build_network()
    keys = list(model.state_dict())
    spent = []
    for round_ in range(2):
        out = engine.train(model, ClientObjective(), RoundContext("site-a", round_, 2, state_dir=str(tmp_path)))
        spent.append(out["dp_epsilon"])
        assert math.isfinite(out["train_loss"]) and out["dp_delta"] == pytest.approx(cfg["dp_delta"])
    assert 0 < spent[0] < spent[1] <= target + 0.05, spent
    assert list(model.state_dict()) == keys  # no Opacus wrapper left in the weights' names
    assert all(p.device.type == "cuda" and torch.isfinite(p).all() for p in model.parameters())


def test_checkpoint_saved_on_gpu_loads_on_cpu(tiny_datalist, tiny_train_config, tmp_path):
    """A model and a site state written by a GPU site are read by a CPU-only reader: ``fedseg infer``'s loader
    and the bundle's inference on CPU, and the site state restored into a CPU optimiser."""
    from fedseg.engine.site_state import SiteState, job_key
    from fedseg.inference import load_state_dict, run_inference

    cfg = {**tiny_train_config, "augment": False, "local_epochs": 1}
    engine = _engine(tiny_datalist, cfg, CUDA)
    torch.manual_seed(0)
    model = engine.build_network()
    engine.train(model, ClientObjective(), RoundContext("site-a", 0, 1))
    path = tmp_path / "FL_global_model.pt"
    torch.save({"model": model.state_dict(), "train_config": cfg}, path)  # the server's format, CUDA tensors inside
    assert all(v.device.type == "cuda" for v in torch.load(path, weights_only=True)["model"].values())

    state = load_state_dict(path)
    assert all(v.device.type == "cpu" for v in state.values())
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value.cpu()), key
    masks = run_inference(path, tmp_path / "masks", datalist=tiny_datalist, overrides={"device": "$torch.device('cpu')"})
    assert masks and all(m.is_file() for m in masks)

    # the site state (optimiser moments on the GPU, data-order generator) restored on a CPU-only machine
    optimizer = engine.make_optimizer(model)
    site_state = SiteState(tmp_path / "state", job_key("fedavg", {}, cfg))
    site_state.save(0, optimizer, torch.Generator().manual_seed(3))
    cpu_engine = _engine(tiny_datalist, cfg, CPU)
    cpu_model = cpu_engine.build_network()
    cpu_model.load_state_dict(state)
    cpu_optimizer = cpu_engine.make_optimizer(cpu_model)
    assert SiteState(tmp_path / "state", job_key("fedavg", {}, cfg)).restore(1, cpu_optimizer, torch.Generator()) == 0
    gpu_moments = [s["exp_avg"].cpu() for s in optimizer.state.values()]
    cpu_moments = [s["exp_avg"] for s in cpu_optimizer.state.values()]
    assert len(cpu_moments) == len(gpu_moments) > 0
    assert all(m.device.type == "cpu" and torch.equal(m, g) for m, g in zip(cpu_moments, gpu_moments))


@pytest.mark.shared_runs("fedavg_gpu")
def test_simulator_job_on_gpu_0(shared_runs):
    """FedAvg, 2 sites, 1 round, ``nvflare simulator -gpu 0``: both sites train on the GPU, the job finishes
    with finite metrics and a global model on the server."""
    run = shared_runs("fedavg_gpu")
    report = run.report
    assert report["rounds"][0]["missing"] == [] and report["rounds"][0]["rejected"] == {}
    for site in run.sites:
        assert "engine on device cuda" in run.site_log(site)
        assert all(math.isfinite(v) for v in report["final"]["global"][site].values())
    initial = build_initial_network(report["config"]["train_config"]).state_dict()
    trained = run.global_model()["model"]
    assert set(trained) == set(initial)
    assert any(not torch.equal(torch.as_tensor(trained[k]).cpu(), v) for k, v in initial.items()), "nothing trained"


def test_volume_engine_trains_and_evaluates_on_cuda(tmp_path):
    """3-D: a volume site (built-in prostate3d, tiny) trains a 3-D U-Net on CUDA (weights stay on the GPU, the loss
    is finite) and evaluates per volume in the scan's geometry (Invertd) with the same Dice as on CPU for the same
    weights; slice mode does the same with its 2-D network."""
    from fedseg.config import resolve_profile
    from fedseg.data.checks import check_federation
    from fedseg.data.synthetic import generate_federation

    datalist = generate_federation("prostate3d", ["site-1"], tmp_path, profile="tiny")["site-1"]
    fields = check_federation(family="prostate3d", explicit={"data_profile": "tiny"})
    for mode in ("patch", "slices"):
        cfg = resolve_profile("tiny", spatial_mode=mode, augment=False, local_epochs=1, **fields)["train_config"]
        engine = _engine(datalist, cfg, CUDA)
        torch.manual_seed(0)
        model = engine.build_network()
        out = engine.train(model, ClientObjective(), RoundContext("site-a", 0, 1))
        assert math.isfinite(out["train_loss"]) and all(p.device.type == "cuda" for p in model.parameters())
        gpu_metrics = engine.evaluate(model, "test")
        cpu_engine = _engine(datalist, cfg, CPU)
        cpu_model = cpu_engine.build_network()
        cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
        cpu_metrics = cpu_engine.evaluate(cpu_model, "test")
        assert "hd95_mm" in gpu_metrics and math.isfinite(gpu_metrics["dice"]), (mode, gpu_metrics)
        assert gpu_metrics["dice"] == pytest.approx(cpu_metrics["dice"], abs=0.02), mode
