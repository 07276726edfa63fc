"""Where an importer reads its data set: the caller's folder (the CLI's ``--src``), else ``$FEDSEG_DATASETS/<folder>``.

``FEDSEG_DATASETS`` names the folder holding the real data sets side by side, one subfolder each
(:data:`DATA_FOLDERS`)::

    $FEDSEG_DATASETS/retina_vessels/manifest.csv          DRIVE / STARE / CHASE_DB1
    $FEDSEG_DATASETS/nuclei_he/manifest.csv               MoNuSeg / TNBC
    $FEDSEG_DATASETS/xray_angio/manifest.csv              DCA1 / ARCADE
    $FEDSEG_DATASETS/odoc_prostate_samples/manifest.csv   fundus OD/OC and prostate MRI samples

Nothing is assumed about where a machine keeps them: with neither a folder nor the variable an importer
stops with one line naming both ways, and a folder that does not exist is named with what it should hold.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional

from ..errors import DatalistError

__all__ = ["DATA_ROOT_ENV", "DATA_FOLDERS", "default_data_root", "resolve_source"]

#: the environment variable naming the folder that holds the real data sets' folders
DATA_ROOT_ENV = "FEDSEG_DATASETS"

#: each data set's folder under ``$FEDSEG_DATASETS`` and what it holds (for error messages)
DATA_FOLDERS: Dict[str, str] = {
    "retina_vessels": "manifest.csv and the DRIVE / STARE / CHASE_DB1 images it lists",
    "nuclei_he": "manifest.csv and the MoNuSeg / TNBC H&E tiles it lists",
    "xray_angio": "manifest.csv and the DCA1 / ARCADE angiograms it lists",
    "odoc_prostate_samples": "manifest.csv and the fundus OD/OC and prostate MRI samples it lists",
}


def default_data_root(folder: str) -> Optional[Path]:
    """``$FEDSEG_DATASETS/<folder>`` (e.g. ``folder="retina_vessels"``), or ``None`` when the variable is unset or empty."""
    root = os.environ.get(DATA_ROOT_ENV, "").strip()
    return Path(root) / folder if root else None


def resolve_source(src: Optional[str | os.PathLike], folder: str, what: str) -> Path:
    """The absolute folder an importer reads: ``src`` when given, else ``$FEDSEG_DATASETS/<folder>``.

    Args:
        src: the caller's folder (``--src``); ``None`` or ``""`` falls back to the environment variable.
        folder: the data set's folder name under ``$FEDSEG_DATASETS`` (a key of :data:`DATA_FOLDERS`).
        what: the data set's name for messages (``"retina"``, ``"nuclei"``, ...).

    Raises:
        DatalistError: neither ``src`` nor ``FEDSEG_DATASETS`` is given, or the folder does not exist.
    """
    origin = ""
    if src is None or str(src) == "":
        path = default_data_root(folder)
        if path is None:
            raise DatalistError(
                f"no {what} data folder: pass --src DIR or set {DATA_ROOT_ENV} (the folder holding {folder}/)"
            )
        origin = f" (from {DATA_ROOT_ENV}={os.environ[DATA_ROOT_ENV].strip()})"
    else:
        path = Path(src)
    path = path.absolute()
    if not path.is_dir():
        state = "is not a folder" if path.exists() else "does not exist"
        holds = DATA_FOLDERS.get(folder, "manifest.csv and the files it lists")
        raise DatalistError(f"{what} data folder {path}{origin} {state}; it should hold {holds} ({folder}/)")
    return path
