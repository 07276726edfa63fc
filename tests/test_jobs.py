"""The committed job folders are exactly what the recipes export (no hand drift), and relocatable."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from fedseg.recipes import available_methods
from fedseg.recipes.export import export_job

JOBS = Path(__file__).resolve().parents[1] / "jobs"


def _files(root: Path):
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


@pytest.mark.parametrize("method", available_methods())
def test_committed_job_matches_recipe_export(method, tmp_path):
    exported = export_job(method, tmp_path, profile="default")
    committed = JOBS / method
    assert committed.is_dir(), f"jobs/{method} missing: run `fedseg export --method {method}`"
    assert _files(exported) == _files(committed), f"file set differs: run `fedseg export --method {method}`"
    for rel in _files(exported):
        assert filecmp.cmp(exported / rel, committed / rel, shallow=False), (
            f"jobs/{method}/{rel} drifted from the recipe; regenerate with `fedseg export --method {method}`"
        )


@pytest.mark.parametrize("method", available_methods())
def test_job_has_no_machine_specific_paths(method):
    for cfg in (JOBS / method).rglob("*.json"):
        text = cfg.read_text()
        assert "/work/" not in text and "/tmp/" not in text and "/root/" not in text, cfg
        json.loads(text)


def test_fvac_default_profile_trains_five_local_epochs_unless_told_otherwise():
    # FVAC's cross-entropy-only loss needs more local steps than Dice+CE (docs/methods.md, FVAC)
    from fedseg.recipes.fvac import DEFAULT_LOCAL_EPOCHS, FVACRecipe

    assert FVACRecipe().train_config["local_epochs"] == DEFAULT_LOCAL_EPOCHS == 5
    assert FVACRecipe(local_epochs=2).train_config["local_epochs"] == 2
    assert FVACRecipe(profile="tiny").train_config["local_epochs"] == 3  # the tiny profile's own value
