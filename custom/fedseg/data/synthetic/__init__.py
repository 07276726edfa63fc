"""Built-in synthetic data: generators that draw whole multi-site federations from a seed (no licensed data needed).

    families.py      the 2-D families (FAMILIES: vessel, polyp, nuclei, xray, fundus), profiles, generate_site_data /
                     generate_federation; vessel and polyp are drawn here
    nuclei.py        H&E nuclei tiles            fundus.py   optic disc / cup crops (three classes)
    xray.py          fluoroscopy frames with catheter / guidewire (and FedEFM's device classes)
    volumes.py       the 3-D prostate3d family (NIfTI volumes with real affines)
    xray_builtin.py  FedEFM's built-in phase-1 classification silos and phase-2 downstream / probe sites
    drawing.py       shared drawing primitives (noise, vessel trees, scanner style)
    files.py         site folders, seeds, split counts and atomic PNG writes every generator shares

Every image is a pure function of its (family, site, seed, profile, ...), so each site process regenerates its own
data byte for byte. This package re-exports each module's public names.
"""

from . import drawing, families, files, fundus, nuclei, volumes, xray, xray_builtin
from .drawing import *  # noqa: F401,F403 -- each module's __all__ is this package's
from .families import *  # noqa: F401,F403
from .files import *  # noqa: F401,F403
from .fundus import *  # noqa: F401,F403
from .nuclei import *  # noqa: F401,F403
from .volumes import *  # noqa: F401,F403
from .xray import *  # noqa: F401,F403
from .xray_builtin import *  # noqa: F401,F403

__all__ = list(dict.fromkeys(name for module in (families, files, fundus, nuclei, xray, volumes, xray_builtin, drawing)
                             for name in module.__all__))
