"""The spatial settings a job leaves to the sites' datalists are recorded with its models: each segmentation site
sends ``spatial = [mode code, rescale]`` (``protocol.SPATIAL_MODE_CODES``: resize 0, patch 1, slices 2) with its weights (``fedseg.fl.protocol.SPATIAL_KEY``) and the server stores
what they agree on in the ``train_config`` saved next to the model, so ``fedseg infer`` runs it as trained."""

from __future__ import annotations

import logging

import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel

from fedseg.fl.controller import FedSegController
from fedseg.fl.protocol import SPATIAL_KEY


def _controller(**train_config):
    controller = FedSegController(train_config={"spatial_mode": None, "rescale": None, **train_config})
    controller._reference = {"w": torch.zeros(2)}
    return controller


def _result(spatial, round_=0):
    meta = {"n_samples": 3, "round": round_, **({SPATIAL_KEY: spatial} if spatial is not None else {})}
    return FLModel(params={"w": torch.ones(2)}, meta=meta, current_round=round_)


@pytest.mark.parametrize(
    "reported, expected",
    [
        ({"a": [0.0, 1.0], "b": [0.0, 1.0]}, {"spatial_mode": "resize", "rescale": 1.0}),
        ({"a": [1.0, 0.5], "b": [1.0, 0.5]}, {"spatial_mode": "patch", "rescale": 0.5}),
        # the retina federation: every site in patch mode, CHASE_DB1 rescaled by 0.5: the mode is recorded, no rescale
        ({"a": [1.0, 1.0], "b": [1.0, 0.5]}, {"spatial_mode": "patch", "rescale": None}),
        ({"a": [1.0, 1.0], "b": [0.0, 1.0]}, {"spatial_mode": None, "rescale": 1.0}),
        ({"a": [2.0, 1.0], "b": [2.0, 1.0]}, {"spatial_mode": "slices", "rescale": 1.0}),  # volumes as 2-D slices
        ({}, {"spatial_mode": None, "rescale": None}),  # nothing reported (e.g. classification sites)
    ],
)
def test_saved_train_config_records_what_the_sites_agree_on(reported, expected):
    controller = _controller(image_size=32)
    for site, spatial in reported.items():
        controller._to_update(site, _result(spatial), require_params=True, round_=0)
    saved = controller.saved_train_config()
    assert {k: saved[k] for k in expected} == expected and saved["image_size"] == 32
    assert controller.train_config["spatial_mode"] is None  # the job's own config (sent to sites) is unchanged


def test_a_job_setting_wins_and_a_rejected_result_counts_for_nothing():
    controller = _controller(spatial_mode="resize", rescale=1.0)
    controller._to_update("a", _result([1.0, 0.5]), require_params=True, round_=0)
    assert controller.saved_train_config()["spatial_mode"] == "resize"
    controller = _controller()
    with pytest.raises(Exception):
        controller._to_update("a", _result([1.0, float("nan")]), require_params=True, round_=0)
    bad_count = FLModel(params={"w": torch.ones(2)}, meta={"n_samples": 0, "round": 0, SPATIAL_KEY: [1.0, 1.0]}, current_round=0)
    with pytest.raises(Exception, match="how many training images"):
        controller._to_update("b", bad_count, require_params=True, round_=0)
    assert controller.saved_train_config()["spatial_mode"] is None


def test_infer_reads_the_recorded_mode_without_a_warning(tmp_path, caplog):
    from fedseg.inference import _merged_overrides

    controller = _controller(image_size=32)
    controller._to_update("a", _result([0.0, 1.0]), require_params=True, round_=0)
    path = tmp_path / "FL_global_model.pt"
    torch.save({"model": {"w": torch.ones(2)}, "train_config": controller.saved_train_config()}, path)
    with caplog.at_level(logging.WARNING, logger="fedseg.inference"):
        merged = _merged_overrides(path, None)
    assert merged["spatial_mode"] == "resize" and "does not record the spatial mode" not in caplog.text
    torch.save({"model": {"w": torch.ones(2)}, "train_config": _controller(image_size=32).saved_train_config()}, path)
    with caplog.at_level(logging.WARNING, logger="fedseg.inference"):
        _merged_overrides(path, None)
    assert "does not record the spatial mode" in caplog.text
