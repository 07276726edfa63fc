"""Mixed-precision training (train_config ``amp``) and the training loader options, on CPU.

CPU autocast is bfloat16, so the accelerator path runs in CI without a GPU: one local epoch in bfloat16 must
give a finite loss close to float32's and an update pointing the same way, with the convolutions really
computed in bfloat16 and the weights kept in float32.
"""

from __future__ import annotations

import pytest
import torch

from fedseg.objectives.base import ClientObjective, RoundContext


def _one_epoch(datalist, cfg):
    from fedseg.engine import SegEngine

    engine = SegEngine("site-a", datalist, cfg)
    torch.manual_seed(0)
    model = engine.build_network()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    dtypes = []
    hook = conv.register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    out = engine.train(model, ClientObjective(), RoundContext("site-a", 0, 1))
    hook.remove()
    update = torch.cat([(v - start[k]).flatten() for k, v in model.state_dict().items() if v.is_floating_point()])
    return out["train_loss"], update, set(dtypes), model


def test_bfloat16_epoch_matches_float32(tiny_datalist, tiny_train_config):
    # plain SGD: its update is the gradient itself, so the comparison sees autocast's rounding, not Adam's
    # sign-like first steps (which turn tiny rounding differences of near-zero gradients into full steps)
    cfg = {**tiny_train_config, "augment": False, "local_epochs": 1, "optimizer_name": "SGD", "learning_rate": 0.1}
    loss32, update32, dtypes32, _ = _one_epoch(tiny_datalist, {**cfg, "amp": None})
    loss16, update16, dtypes16, model16 = _one_epoch(tiny_datalist, {**cfg, "amp": "bfloat16"})
    assert dtypes32 == {torch.float32} and dtypes16 == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model16.parameters())
    assert torch.isfinite(torch.tensor(loss16)) and abs(loss16 - loss32) < 0.01 * abs(loss32)
    assert torch.nn.functional.cosine_similarity(update16, update32, dim=0) > 0.9
    assert 0.9 < float(update16.norm() / update32.norm()) < 1.1


def test_amp_options_are_checked(tiny_datalist, tiny_train_config):
    from fedseg.engine import SegEngine

    for bad, match in (({"amp": "float8"}, "amp"), ({"amp": "float16"}, "CUDA"),
                       ({"amp": "bfloat16", "dp_target_epsilon": 5.0}, "differential privacy")):
        engine = SegEngine("site-a", tiny_datalist, {**tiny_train_config, **bad}, device=torch.device("cpu"))
        with pytest.raises(ValueError, match=match):
            engine.autocast_dtype()


def test_loader_workers_give_the_same_batches(tiny_datalist, tiny_train_config):
    from fedseg.engine import SegEngine

    batches = {}
    for workers in (0, 2):
        engine = SegEngine("site-a", tiny_datalist, {**tiny_train_config, "augment": False, "num_workers": workers})
        batches[workers] = [b["image"] for b in engine.loader("training", shuffle=True, train=True)]
    assert len(batches[0]) == len(batches[2])
    for a, b in zip(batches[0], batches[2]):
        torch.testing.assert_close(a, b)
    engine = SegEngine("site-a", tiny_datalist, {**tiny_train_config, "num_workers": -1})
    with pytest.raises(ValueError, match="num_workers"):
        engine.loader("training", train=True)
