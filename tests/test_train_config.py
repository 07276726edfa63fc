"""The typed train_config (``fedseg.config.TrainConfig``): every option's default written once, the plain dict derived
from it in job-file order, the site's typed config resolved by one function, and unknown keys refused by name."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

import fedseg
from fedseg.config import (BASE_TRAIN_CONFIG, BUNDLE_DEFAULTED_KEYS, TrainConfig, as_train_config, resolve_profile,
                           site_train_config)

PACKAGE = Path(fedseg.__file__).parent


def test_the_dict_is_the_groups_defaults_in_their_order():
    assert tuple(BASE_TRAIN_CONFIG) == TrainConfig.keys()
    assert TrainConfig().as_dict() == BASE_TRAIN_CONFIG
    assert len(set(TrainConfig.keys())) == len(TrainConfig.keys())  # no option in two groups
    # a list default is a fresh copy per config: changing one job's channels leaves the defaults alone
    first = TrainConfig()
    first.network.channels.append(512)
    assert TrainConfig().network.channels == BASE_TRAIN_CONFIG["channels"] != first.network.channels


def test_every_option_has_a_type_and_a_meaning():
    for group in fields(TrainConfig):
        for f in fields(group.default_factory):
            assert f.type and f.metadata.get("doc", "").strip(), f"{group.name}.{f.name} has no type or doc"


def test_from_dict_reads_given_values_and_defaults_the_rest():
    config = TrainConfig.from_dict({"batch_size": "2", "num_workers": None, "cache_max_mb": None, "dp_target_epsilon": 3,
                                    "bundle_writers_dir": "elsewhere"})
    assert config.training.batch_size == 2  # converted
    assert config.runtime.num_workers == 0  # None of a field that cannot be None: its default
    assert config.cache.cache_max_mb is None  # None is a value of an Optional field (unbounded)
    assert config.privacy.dp_target_epsilon == 3.0 and config.training.learning_rate == BASE_TRAIN_CONFIG["learning_rate"]
    assert TrainConfig.from_dict(BASE_TRAIN_CONFIG).as_dict() == BASE_TRAIN_CONFIG
    assert as_train_config(config) is config and as_train_config({"seed": 7}).training.seed == 7


def test_the_site_config_takes_the_bundles_values_only_where_the_job_is_silent():
    bundle = {"patch_size": 48, "sw_overlap": 0.5, "learning_rate": 0.5}
    config = site_train_config({"patch_size": 32}, bundle)
    assert config.spatial.patch_size == 32  # the job's
    assert config.sliding_window.sw_overlap == 0.5  # the bundle's
    assert config.training.learning_rate == BASE_TRAIN_CONFIG["learning_rate"]  # not a bundle-defaulted key
    assert set(BUNDLE_DEFAULTED_KEYS) <= set(BASE_TRAIN_CONFIG)
    assert site_train_config(resolve_profile("tiny")["train_config"]).network.image_size == 32


def test_an_unknown_key_is_refused_with_the_nearest_name():
    with pytest.raises(ValueError, match=r"unknown train_config keys \['batchsize'\].*did you mean 'batch_size'"):
        resolve_profile("default", batchsize=8)


#: the modules that read the typed config instead of repeating defaults at the reads
TYPED_READERS = sorted((PACKAGE / "engine").glob("*.py")) + [PACKAGE / "fl" / "site_data.py"]


@pytest.mark.parametrize("path", TYPED_READERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_default_is_repeated_where_the_engine_reads_an_option(path):
    """``train_config.get("batch_size", 4)`` would be a second copy of a default: the engines read ``self.config``."""
    repeated = [m.group(0) for m in re.finditer(r"(?:config|cfg)\.get\(\"([a-z_0-9]+)\",\s*[^)]", path.read_text())
                if m.group(1) in BASE_TRAIN_CONFIG]
    assert not repeated, f"{path.name} repeats defaults: {repeated}"
