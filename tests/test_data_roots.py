"""Where the real-data importers read: the caller's folder (``--src``), else ``$FEDSEG_DATASETS/<folder>``, else one
line naming both ways; a folder that does not exist is named with what it should hold."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedseg.cli import main
from fedseg.data import DatalistError, default_data_root, import_retina
from fedseg.data.importers.sources import DATA_ROOT_ENV

#: ``fedseg data`` importers and the folder each reads under ``$FEDSEG_DATASETS``
IMPORTERS = {"retina": "retina_vessels", "nuclei": "nuclei_he", "odoc": "odoc_prostate_samples", "dca1": "xray_angio"}


def _retina_layout(root: Path) -> Path:
    """Three tiny sites without official splits (3 images each), PNG images and 0/255 masks, and their manifest."""
    rows = []
    for site in ("DRIVE", "STARE", "CHASE_DB1"):
        for folder in ("images", "masks"):
            (root / site / folder).mkdir(parents=True, exist_ok=True)
        for i in range(3):
            Image.fromarray(np.full((8, 10, 3), 40 * i, np.uint8)).save(root / site / "images" / f"{i}.png")
            Image.fromarray(np.zeros((8, 10), np.uint8)).save(root / site / "masks" / f"{i}.png")
            rows.append([site, f"{site}-{i}", "", f"{site}/images/{i}.png", f"{site}/masks/{i}.png"])
    with open(root / "manifest.csv", "w", newline="") as f:
        csv.writer(f).writerows([["site", "id", "split", "image", "mask"], *rows])
    return root


def _sources(index: Path) -> set:
    """The ``"source"`` folder of every datalist a ``site_datalists.json`` names."""
    return {json.loads(Path(p).read_text())["source"] for p in json.loads(index.read_text()).values()}


def test_without_src_the_cli_reads_the_data_set_under_fedseg_data_root(tmp_path, monkeypatch):
    root = tmp_path / "data"
    _retina_layout(root / "retina_vessels")
    monkeypatch.setenv(DATA_ROOT_ENV, str(root))
    main(["data", "retina", "--out", str(tmp_path / "out")])
    assert _sources(tmp_path / "out" / "site_datalists.json") == {str((root / "retina_vessels").absolute())}
    assert default_data_root("retina_vessels") == root / "retina_vessels"


def test_src_wins_over_fedseg_data_root(tmp_path, monkeypatch):
    src = _retina_layout(tmp_path / "mine")
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path / "elsewhere"))  # does not even exist: never looked at
    main(["data", "retina", "--src", str(src), "--out", str(tmp_path / "out")])
    assert _sources(tmp_path / "out" / "site_datalists.json") == {str(src.absolute())}


@pytest.mark.parametrize("unset", ["absent", "empty"])
@pytest.mark.parametrize("command", sorted(IMPORTERS))
def test_without_src_or_fedseg_data_root_one_line_names_both(tmp_path, monkeypatch, command, unset):
    if unset == "absent":
        monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    else:
        monkeypatch.setenv(DATA_ROOT_ENV, "")
    with pytest.raises(SystemExit) as exc:
        main(["data", command, "--out", str(tmp_path / "out")])
    message = str(exc.value.code)
    what = "xray_angio" if command == "dca1" else command
    assert message == (f"fedseg data {command}: no {what} data folder: pass --src DIR or set FEDSEG_DATASETS "
                       f"(the folder holding {IMPORTERS[command]}/)")
    assert not (tmp_path / "out").exists()
    assert default_data_root(IMPORTERS[command]) is None


def test_the_python_api_falls_back_the_same_way(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DatalistError, match=r"^no retina data folder: pass --src DIR or set FEDSEG_DATASETS"):
        import_retina(None, tmp_path / "out")
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path))
    _retina_layout(tmp_path / "retina_vessels")
    paths = import_retina(None, tmp_path / "out", sites=("STARE",))
    assert json.loads(paths["STARE"].read_text())["source"] == str((tmp_path / "retina_vessels").absolute())


@pytest.mark.parametrize("command", sorted(IMPORTERS))
def test_a_src_that_does_not_exist_is_named_with_what_it_should_hold(tmp_path, monkeypatch, command):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    missing = tmp_path / "no_such_folder"
    with pytest.raises(SystemExit) as exc:
        main(["data", command, "--src", str(missing), "--out", str(tmp_path / "out")])
    message = str(exc.value.code)
    assert "\n" not in message
    assert f"data folder {missing} does not exist" in message
    assert "manifest.csv" in message and f"({IMPORTERS[command]}/)" in message
    assert not (tmp_path / "out").exists()


def test_a_missing_folder_under_fedseg_data_root_names_the_folder_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path))  # exists, but holds no nuclei_he/
    with pytest.raises(SystemExit) as exc:
        main(["data", "nuclei", "--out", str(tmp_path / "out")])
    message = str(exc.value.code)
    assert f"nuclei data folder {tmp_path / 'nuclei_he'} (from FEDSEG_DATASETS={tmp_path}) does not exist" in message
    assert "MoNuSeg / TNBC" in message


def test_a_file_given_as_src_is_not_a_folder(tmp_path):
    a_file = tmp_path / "manifest.csv"
    a_file.write_text("site,id,split,image,mask\n")
    with pytest.raises(DatalistError, match=rf"retina data folder {a_file} is not a folder; it should hold manifest.csv"):
        import_retina(a_file, tmp_path / "out")


def test_no_build_machine_paths_remain_in_the_importers():
    package = Path(__file__).resolve().parents[1] / "custom" / "fedseg" / "data"
    offenders = [str(p) for p in package.rglob("*.py") if "/work/shared" in p.read_text() or "shared/data" in p.read_text()]
    assert offenders == []
