"""Where the tests that read a real data set find it (each such test is skipped where its folder is absent).

A data set's folder is ``$FEDSEG_<NAME>_ROOT`` when that override is set (e.g. ``FEDSEG_RETINA_ROOT``), else
``$FEDSEG_DATASETS/<folder>`` (the importers' own default, :func:`fedseg.data.default_data_root`), else
``<checkout>/../shared/data/<folder>``, where project machines keep the shared copies beside the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from fedseg.data import default_data_root

#: the shared copies' folder on project machines, relative to this checkout
BESIDE_CHECKOUT = Path(__file__).resolve().parents[2] / "shared" / "data"


def real_data_folder(folder: str, override_env: Optional[str] = None) -> Path:
    """The folder of the real data set ``folder`` (``"retina_vessels"``, ``"nuclei_he"``, ``"xray_angio"``, ...)."""
    if override_env and os.environ.get(override_env):
        return Path(os.environ[override_env])
    return default_data_root(folder) or BESIDE_CHECKOUT / folder
