"""Which job components a site lets NVFlare build: NVFlare's default allow list + fedseg's own components.

fedseg jobs carry no code (``meta.json`` + ``app/config/*.json``); NVFlare 2.9 then treats them as non-BYOC
and builds a component only if its class path is in the site's ``class_allow_list`` (``local/resources.json``;
without one, NVFlare's built-in default list, which has no fedseg classes). Every participant that runs
fedseg jobs — simulator workspace, POC kit, provisioned server and sites — needs this list. It is the
site's statement "I run the fedseg package I installed": a job can configure these classes, never bring
its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, List, Optional

from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

#: fedseg job components (prefixes end with "."; other entries are exact class paths)
FEDSEG_COMPONENTS = (
    "fedseg.fl.",  # FedSegController, FedSegSiteExecutor, ResultAuditFilter
    "fedseg.networks.",  # the model the server's persistor builds (FeatureUNet)
    "fedseg.foundation.",  # foundation-model backbones (FedEFM)
    # NVFlare classes our recipes use that NVFlare's default list lacks
    "nvflare.app_opt.pt.file_model_persistor.PTFileModelPersistor",
)

RESOURCES_FILE = "resources.json"
CLASS_ALLOW_LIST = "class_allow_list"


def class_allow_list(extra: Iterable[str] = ()) -> List[str]:
    """NVFlare's default allow list + :data:`FEDSEG_COMPONENTS` + ``extra``, without duplicates, in that order."""
    merged: List[str] = []
    for entry in (*DEFAULT_CLASS_ALLOW_LIST, *FEDSEG_COMPONENTS, *extra):
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"class_allow_list entries must be non-empty strings, got {entry!r}")
        if entry not in merged:
            merged.append(entry)
    return merged


def add_to_resources(resources_path: os.PathLike, extra: Iterable[str] = ()) -> List[str]:
    """Merge :func:`class_allow_list` into a site's resources JSON (created if absent); returns the list written.

    Entries the site already allows are kept (a site may allow more than fedseg needs).
    """
    path = Path(resources_path)
    resources = {"format_version": 2}
    if path.is_file():
        try:
            resources = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(resources, dict):
            raise ValueError(f"{path} must hold a JSON object, got {type(resources).__name__}")
    existing = resources.get(CLASS_ALLOW_LIST) or []
    if not isinstance(existing, list):
        raise ValueError(f"{path}: {CLASS_ALLOW_LIST} must be a list, got {type(existing).__name__}")
    resources[CLASS_ALLOW_LIST] = class_allow_list([*existing, *extra])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(resources, indent=2) + "\n")
    return resources[CLASS_ALLOW_LIST]


def allow_in_kit(kit_dir: os.PathLike) -> Path:
    """Allow fedseg's components in a provisioned participant folder (``<kit>/local/``), in the file NVFlare reads:
    ``resources.json`` when the site has one (it replaces the default), else ``resources.json.default``."""
    local = Path(kit_dir) / "local"
    if not local.is_dir():
        raise FileNotFoundError(f"{kit_dir} is not a provisioned server/site folder (no local/)")
    path = local / RESOURCES_FILE
    if not path.is_file():
        path = local / (RESOURCES_FILE + ".default")
    add_to_resources(path)
    return path


def prepare_simulator_workspace(workspace: os.PathLike) -> Path:
    """Write ``<workspace>/local/resources.json`` with the fedseg allow list before ``nvflare simulator -w``."""
    path = Path(workspace) / "local" / RESOURCES_FILE
    add_to_resources(path)
    return path


#: what NVFlare logs when a participant refuses to build a job component (``ComponentPathAuthorizer``)
REFUSAL_MARKERS = ("is not in allow_list", "ComponentNotAuthorized")


def refused_components_hint(workspace: os.PathLike) -> Optional[str]:
    """If NVFlare's logs under a simulator ``workspace`` show that a fedseg component was refused (the workspace
    has no allow list: ``nvflare simulator`` reads only ``WS/local/resources.json``), the one step that fixes it;
    else None."""
    root = Path(workspace)
    for log in sorted(root.rglob("log*.txt")) if root.is_dir() else []:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        if "fedseg." in text and any(marker in text for marker in REFUSAL_MARKERS):
            return (
                f"NVFlare refused to build fedseg's components ({log}): jobs carry no code, so a site builds only the "
                f"classes its allow list names, and this simulator workspace has none. Run once\n"
                f"  python -m fedseg.fl.component_policy --simulator {root}\n"
                f"then the same nvflare simulator command again (jobs/README.md)."
            )
    return None


def main(argv=None) -> None:
    """``python -m fedseg.fl.component_policy [--simulator] DIR...``: allow fedseg's components in provisioned
    participant folders, or (``--simulator``) in ``nvflare simulator -w`` workspaces before the run."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fedseg.fl.component_policy", description=main.__doc__)
    parser.add_argument("dirs", nargs="+", help="participant folders (<kit>/local/ exists) or simulator workspaces")
    parser.add_argument("--simulator", action="store_true", help="the folders are `nvflare simulator -w` workspaces")
    args = parser.parse_args(argv)
    for folder in args.dirs:
        path = prepare_simulator_workspace(folder) if args.simulator else allow_in_kit(folder)
        print(f"fedseg components allowed in {path}")


if __name__ == "__main__":
    main()
