"""A site that dies or hangs: the task timeout ends the round without it; a restarted site resumes its state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedseg.config import BASE_TRAIN_CONFIG, TASK_TIMEOUT_RANGE, default_task_timeout, resolve_profile
from fedseg.fl.controller import FedSegController
from fedseg.recipes import available_methods

JOBS = Path(__file__).resolve().parents[1] / "jobs"


# ------------------------------------------------------------------------------------ task timeout
@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({}, 300),  # 64 px, 1 epoch
        ({"local_epochs": 3, "image_size": 32}, 900),  # smaller images take no less than the 64 px floor
        ({"local_epochs": 2, "image_size": 384}, 300 * 2 * 36),
        ({"image_size": 512, "spatial_mode": "patch", "patch_size": 128}, 300 * 4),  # patches, not images
        ({"local_epochs": 50, "image_size": 1024}, TASK_TIMEOUT_RANGE[1]),  # capped at a day
    ],
)
def test_default_task_timeout_by_hand(overrides, expected):
    assert default_task_timeout({**BASE_TRAIN_CONFIG, **overrides}) == expected


def test_default_task_timeout_of_the_profiles():
    assert default_task_timeout(resolve_profile("tiny")["train_config"]) == 900
    assert default_task_timeout(resolve_profile("default")["train_config"]) == 300


@pytest.mark.parametrize("key, bad", [("local_epochs", 0), ("image_size", "64"), ("patch_size", 2.5), ("local_epochs", True)])
def test_default_task_timeout_names_a_bad_value(key, bad):
    with pytest.raises(ValueError, match=key):
        default_task_timeout({**BASE_TRAIN_CONFIG, key: bad})


def test_controller_never_waits_for_ever_unless_told():
    tiny = resolve_profile("tiny")["train_config"]
    assert FedSegController(train_config=tiny).task_timeout == 900
    assert FedSegController(train_config=tiny, task_timeout=0).task_timeout == 0
    with pytest.raises(ValueError, match="task_timeout"):
        FedSegController(train_config=tiny, task_timeout=-1)
    with pytest.raises(ValueError, match="absolute"):
        FedSegController(train_config=tiny, checkpoint_dir="relative/ckpt")


@pytest.mark.parametrize("method", available_methods())
def test_exported_jobs_carry_the_default_timeout(method):
    config = json.loads((JOBS / method / "app" / "config" / "config_fed_server.json").read_text())
    (controller,) = [w["args"] for w in config["workflows"] if w["path"].endswith("FedSegController")]
    assert controller["task_timeout"] == default_task_timeout(controller["train_config"]) > 0
