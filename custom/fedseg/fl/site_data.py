"""Where a site's data comes from: a configured datalist, or built-in synthetic data made from its name.

Resolution order (first hit wins):
  1. ``--datalist PATH`` given to the site's client script (per-site app configs);
  2. ``--site_datalists FILE`` — a JSON map ``{site: datalist path}`` (one app for every site);
  3. the environment variable ``FEDSEG_DATALIST`` (a hospital sets it where it starts its client);
  4. ``<site workspace>/local/fedseg_site.json`` with ``{"datalist": PATH}`` (NVFlare's site-local folder);
  5. otherwise synthetic data of ``train_config["data_family"]`` generated under the data root
     (``--data_root`` / ``FEDSEG_DATA_ROOT`` / ``<cwd>/fedseg_data``), deterministic in (family, site, seed).
     ``xray_foundation`` (FedEFM's phase-1 silos) depends on the whole federation: which classes a silo
     holds follows from its place in ``clients`` (sent by the server) and ``data_unseen``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from fedseg.config import TrainConfig

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
    clients: Optional[Sequence[str]] = None,
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

    root = Path(data_root or os.environ.get(DATA_ROOT_ENV) or Path(workspace or os.getcwd()) / "fedseg_data")
    if train_config.get("data_family") == FOUNDATION_FAMILY:
        return builtin_foundation_datalist(site, train_config, root, clients)

    from fedseg.data.synthetic import generate_site_data

    data = TrainConfig.from_dict(train_config).data
    return generate_site_data(
        family=data.data_family,
        site=site,
        out_dir=root,
        seed=data.data_seed,
        profile=data.data_profile,
    )


#: built-in data family of FedEFM's phase 1 (classification silos of synthetic X-ray frames)
FOUNDATION_FAMILY = "xray_foundation"


def builtin_foundation_datalist(
    site: str, train_config: Dict[str, Any], root: Path, clients: Optional[Sequence[str]]
) -> Path:
    """This silo's built-in classification datalist; every site process generates only its own silo,
    and all agree on the label space (``data_scanners`` x 4 device classes)."""
    from fedseg.data.synthetic.xray_builtin import builtin_foundation_silos

    sites = list(clients or [])
    if site not in sites:
        raise ValueError(
            f"built-in {FOUNDATION_FAMILY!r} silos need the federation's site list, which the server sends; "
            f"{site!r} is not in {sites}"
        )
    config = TrainConfig.from_dict(train_config)
    out = builtin_foundation_silos(
        root / FOUNDATION_FAMILY,
        sites,
        unseen=config.data.data_unseen,
        seed=config.data.data_seed,
        profile=config.data.data_profile,
        only_site=site,
        n_scanners=train_config.get("data_scanners"),
        image_size=config.classifier.vit_image_size,
    )
    return Path(out[site])
