"""Where a site's data comes from: a configured datalist, or built-in synthetic data made from its name.

Resolution order (first hit wins):
  1. ``--datalist PATH`` given to the site's client script (per-site app configs);
  2. ``--site_datalists FILE`` — a JSON map ``{site: datalist path}`` (one app for every site);
  3. the environment variable ``FEDSEG_DATALIST`` (a hospital sets it where it starts its client);
  4. ``<site workspace>/local/fedseg_site.json`` with ``{"datalist": PATH}`` (NVFlare's site-local folder);
  5. otherwise synthetic data of ``train_config["data_family"]`` generated under the data root
     (``--data_root`` / ``FEDSEG_DATA_ROOT`` / ``<cwd>/fedseg_data``), deterministic in (family, site, seed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

DATALIST_ENV = "FEDSEG_DATALIST"
DATA_ROOT_ENV = "FEDSEG_DATA_ROOT"
SITE_CONFIG_NAME = "fedseg_site.json"


def resolve_site_datalist(
    site: str,
    train_config: Dict[str, Any],
    datalist: Optional[str] = None,
    site_datalists: Optional[str] = None,
    data_root: Optional[str] = None,
    workspace: Optional[str] = None,
) -> Path:
    """Return the datalist this site trains on, generating synthetic data if nothing is configured."""
    if datalist:
        return Path(datalist)
    if site_datalists:
        mapping = json.loads(Path(site_datalists).read_text())
        if site not in mapping:
            raise KeyError(f"{site_datalists} has no datalist for site {site!r} (sites: {sorted(mapping)})")
        return Path(mapping[site])
    if os.environ.get(DATALIST_ENV):
        return Path(os.environ[DATALIST_ENV])
    local = Path(workspace or os.getcwd()) / "local" / SITE_CONFIG_NAME
    if local.is_file():
        return Path(json.loads(local.read_text())["datalist"])

    from fedseg.data.synthetic import generate_site_data

    root = Path(data_root or os.environ.get(DATA_ROOT_ENV) or Path(workspace or os.getcwd()) / "fedseg_data")
    return generate_site_data(
        family=train_config.get("data_family", "polyp"),
        site=site,
        out_dir=root,
        seed=int(train_config.get("data_seed", 0)),
        profile=train_config.get("data_profile", "default"),
        image_size=train_config.get("data_image_size"),
    )
