"""``validate_every``: which rounds a site computes its validation metric in."""

from __future__ import annotations

import argparse

import pytest

from fedseg.config import validation_due
from fedseg.fl.client import SiteRunner
from fedseg.fl.protocol import META_KEY, TRAIN_TASK
from fedseg.recipes.base import build_initial_network


@pytest.mark.parametrize("every,total,expected", [
    (1, 4, [0, 1, 2, 3]),
    (2, 5, [1, 3, 4]),  # every second round, and always the last
    (10, 20, [9, 19]),
    (30, 20, [19]),
])
def test_rounds_with_validation(every, total, expected):
    assert [r for r in range(total) if validation_due({"validate_every": every}, r, total)] == expected


def test_default_is_every_round_and_bad_values_are_refused():
    assert all(validation_due({}, r, 5) for r in range(5))
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="validate_every"):
            validation_due({"validate_every": bad}, 0, 5)


def test_site_sends_val_dice_only_in_due_rounds(tmp_path, tiny_datalist, tiny_train_config):
    cfg = {**tiny_train_config, "validate_every": 2, "local_epochs": 1}
    runner = SiteRunner("site-a", argparse.Namespace(datalist=str(tiny_datalist), site_datalists=None,
                                                     data_root=None, bundle_dir=None), workspace=str(tmp_path))
    params = build_initial_network(cfg).state_dict()
    sent = []
    for r in range(3):
        meta = {META_KEY: {"method": "fedavg", "objective": "fedavg", "objective_args": {}, "train_config": cfg,
                           "round": r, "total_rounds": 3}}
        sent.append("val_dice" in runner.handle(TRAIN_TASK, {k: v.clone() for k, v in params.items()}, meta)["metrics"])
    assert sent == [False, True, True]
