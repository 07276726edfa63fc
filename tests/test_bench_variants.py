"""Variant rows of ``fedseg bench``: a value naming each seed's own file (``{seed}``)."""

from __future__ import annotations

import pytest

from fedseg.bench.bench import plan
from fedseg.bench.runs import Budget, parse_variant, seeded_args


def test_seed_field_becomes_each_runs_seed_and_nothing_else_changes():
    row = "fedefm_init=fedefm_downstream:foundation_ckpt=/o/method-fedefm-seed{seed}/m.pt,partial_depth=true,tag={x}"
    specs = plan([row, "fedavg"], [], seeds=[0, 2])
    runs = [(s.label, s.seed, s.variant_args) for s in specs]
    assert runs == [
        ("fedefm_init", 0, {"foundation_ckpt": "/o/method-fedefm-seed0/m.pt", "partial_depth": True, "tag": "{x}"}),
        ("fedavg", 0, {}),
        ("fedefm_init", 2, {"foundation_ckpt": "/o/method-fedefm-seed2/m.pt", "partial_depth": True, "tag": "{x}"}),
        ("fedavg", 2, {}),
    ]
    # one label across seeds (the tables pair it seed by seed), one run id per seed
    assert [s.id for s in specs if s.label == "fedefm_init"] == ["method-fedefm_init-seed0", "method-fedefm_init-seed2"]


def test_seed_field_is_part_of_the_run_configuration_a_resume_compares():
    label, method, args = parse_variant("a=fedavg:note=run{seed}")
    budget, mapping = Budget(rounds=2), {"site-1": "/d/site-1.json"}
    configs = [s.run_config(budget, mapping)["variant_args"] for s in plan(["a=fedavg:note=run{seed}"], [], seeds=[0, 1])]
    assert configs == [{"note": "run0"}, {"note": "run1"}]
    assert parse_variant("a=fedavg:note=run{seed}")[2] == args == {"note": "run{seed}"}  # parsing keeps the field


@pytest.mark.parametrize("value", [3, 0.5, True, None, [1, 2], {"k": "{seed}"}])
def test_values_that_are_not_strings_are_kept(value):
    assert seeded_args({"v": value}, 7) == {"v": value}


@pytest.mark.parametrize("timeout", [None, 1800])
def test_task_timeout_reaches_the_job_and_not_the_run_configuration(timeout, tmp_path, monkeypatch):
    """``fedseg bench --task-timeout``: the exported job gets it (None: the recipe's own default); a run made with
    it resumes one made without, since a late site fails a run rather than changing its result."""
    import fedseg.bench.runs as runs
    import fedseg.recipes.export as export
    from fedseg.bench.runs import RunSpec, run_method
    from fedseg.cli import build_parser

    exported = {}
    monkeypatch.setattr(export, "export_job", lambda method, out, profile, **kw: exported.update(kw) or out)
    monkeypatch.setattr(runs, "patch_job", lambda job, interval: None)
    monkeypatch.setattr(runs, "run_simulator", lambda *a, **kw: {"report": {}, "command": "", "report_path": "r",
                                                                  "total_wall_s": 1.0})
    monkeypatch.setattr(runs, "method_record", lambda *a: {"ok": True})
    budget = Budget(rounds=2, task_timeout=timeout)
    assert run_method(RunSpec("method", "fedavg", "fedavg", 0), budget, {"s": "/d/s.json"}, tmp_path, tmp_path / "m.json") == {"ok": True}
    assert exported.get("task_timeout") == timeout and ("task_timeout" in exported) == (timeout is not None)
    assert "task_timeout" not in budget.to_dict() and budget.to_dict() == Budget(rounds=2).to_dict()
    args = build_parser().parse_args(["bench", "--out", "o"] + (["--task-timeout", str(timeout)] if timeout else []))
    assert args.task_timeout == timeout
