"""The fedseg command line: data generation with the FVAC participant split, export, summary."""

from __future__ import annotations

import json
from pathlib import Path

from fedseg.cli import main
from fedseg.data.datalist import load_datalist


def test_synth_with_domain_to_participant_split(tmp_path, capsys):
    main(["data", "synth", "--family", "vessel", "--sites", "DRIVE", "STARE", "CHASE_DB1", "--out", str(tmp_path),
          "--profile", "tiny", "--participants", "DRIVE=3,STARE=1,CHASE_DB1=1"])
    mapping = json.loads((tmp_path / "site_datalists.json").read_text())
    assert sorted(mapping) == ["CHASE_DB1", "DRIVE_1", "DRIVE_2", "DRIVE_3", "STARE"]
    drive = [load_datalist(mapping[f"DRIVE_{i}"], check_files=False) for i in (1, 2, 3)]
    train_sets = [{e["image"] for e in d["training"]} for d in drive]
    assert all(train_sets) and not (train_sets[0] & train_sets[1] or train_sets[0] & train_sets[2] or train_sets[1] & train_sets[2])
    assert drive[0]["test"] == drive[1]["test"] == drive[2]["test"]  # each participant is tested on its domain's test split
    assert "site_datalists.json" in capsys.readouterr().out


def test_summarise_prints_table_and_writes_summary(tmp_path, capsys):
    report = {
        "method": "fedavg", "config": {"num_rounds": 1}, "clients": ["a", "b"],
        "rounds": [{"round": 0, "metrics": {"a": {"train_loss": 1.0, "val_dice": 0.5}, "b": {"train_loss": 1.0, "val_dice": 0.7}}}],
        "final": {"global": {"a": {"dice": 0.6, "hd95": 3.0, "assd": 1.0}, "b": {"dice": 0.8, "hd95": 5.0, "assd": 2.0}}},
    }
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(report))
    main(["summarise", str(tmp_path)])
    out = capsys.readouterr().out
    assert "0.7000" in out and "4.0000" in out  # mean Dice and mean HD95
    assert (run / "summary.md").is_file() and (run / "plots" / "val_dice.png").is_file()


def test_export_all_writes_every_job(tmp_path):
    main(["export", "--all", "--out", str(tmp_path)])
    for method in ("fedavg", "fedevi", "fvac", "graphfedseg"):
        assert (tmp_path / method / "meta.json").is_file()
        # configuration only: the site entry is the installed fedseg package (no BYOC, deploy/README.md)
        assert not (tmp_path / method / "app" / "custom").exists()


def _server_interval(job_dir):
    return json.loads((job_dir / "app" / "config" / "config_fed_server.json").read_text())["server"]["task_request_interval"]


def test_export_sets_the_task_request_interval(tmp_path):
    import pytest

    from fedseg.recipes.base import TASK_REQUEST_INTERVAL

    main(["export", "--method", "fedevi", "--out", str(tmp_path / "default")])
    assert _server_interval(tmp_path / "default" / "fedevi") == TASK_REQUEST_INTERVAL == 0.05
    main(["export", "--method", "fedevi", "--out", str(tmp_path / "slow"), "--task-request-interval", "0.5"])
    assert _server_interval(tmp_path / "slow" / "fedevi") == 0.5
    for bad in ("0", "-1", "120"):
        with pytest.raises(SystemExit, match="task_request_interval"):
            main(["export", "--method", "fedevi", "--out", str(tmp_path / "bad"), "--task-request-interval", bad])


def test_summarise_names_the_models_and_a_ready_infer_command(tmp_path, capsys, tiny_train_config, tiny_datalist):
    """The global model where NVFlare's persistor writes it (``<run dir>/app_server/``), each personalised model,
    and an infer command that runs as printed once NEW_SCANS/ and MASKS/ are real folders."""
    import shlex

    import torch

    from fedseg.recipes.base import build_initial_network

    run = tmp_path / "server" / "simulate_job"
    (run / "app_server").mkdir(parents=True)
    (run / "personalized_models").mkdir()
    weights = {"model": build_initial_network(tiny_train_config).state_dict(), "train_config": tiny_train_config}
    torch.save(weights, run / "app_server" / "FL_global_model.pt")
    torch.save(weights, run / "personalized_models" / "a.pt")
    report = {
        "method": "graphfedseg", "config": {"num_rounds": 1, "train_config": tiny_train_config}, "clients": ["a"],
        "rounds": [{"round": 0, "metrics": {"a": {"train_loss": 1.0, "val_dice": 0.5}}}],
        "final": {"global": {"a": {"dice": 0.6, "hd95": 3.0, "assd": 1.0}},
                  "personalized": {"a": {"dice": 0.7, "hd95": 2.0, "assd": 1.0}},
                  "personalized_checkpoints": {"a": "personalized_models/a.pt"}},
    }
    (run / "report.json").write_text(json.dumps(report))
    main(["summarise", str(tmp_path)])
    out = capsys.readouterr().out
    assert f"global model: {run / 'app_server' / 'FL_global_model.pt'}" in out
    assert f"personalised model of a: {run / 'personalized_models' / 'a.pt'}" in out
    command = shlex.split(out.split("segment new scans with it:")[1].strip().splitlines()[0])
    assert command[:2] == ["fedseg", "infer"]
    scans = json.loads(tiny_datalist.read_text())["test"][0]["image"]
    argv = [{"NEW_SCANS/": str(tiny_datalist.parent / Path(scans).parent), "MASKS/": str(tmp_path / "masks")}.get(a, a)
            for a in command[1:]]
    main(argv)
    assert list((tmp_path / "masks").glob("*_seg.png"))
