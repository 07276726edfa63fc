"""The in-process server workflow for tests (``fedseg.bench.inprocess``), and the built-in sites it runs on."""

from pathlib import Path
from typing import Dict, Sequence

from fedseg.bench.inprocess import InProcessController, controller_args, run_in_process  # noqa: F401


def builtin_sites(family: str, sites: Sequence[str], folder: Path) -> Dict[str, str]:
    """``{site: datalist path}`` of tiny built-in ``family`` data under ``folder`` (what a simulator job's sites
    generate themselves; in process the controller is given the datalists)."""
    from fedseg.data.synthetic import generate_federation

    return {s: str(p) for s, p in generate_federation(family, list(sites), folder, profile="tiny").items()}
