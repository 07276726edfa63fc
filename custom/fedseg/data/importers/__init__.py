"""Importers of public data sets: each reads a licensed data set where it lies and writes datalists that point at it.

    retina.py      DRIVE / STARE / CHASE_DB1 vessel sites; participant_split (FVAC participant shares)
    nuclei.py      MoNuSeg / TNBC H&E nuclei sites, by source or by organ
    xray_angio.py  DCA1 vessel segmentation sites; ARCADE stenosis crops (classification items)
    odoc.py        fundus optic disc / cup and prostate MRI slice samples, one site per domain
    foundation.py  FedEFM phase-1 silos from the real labels above plus the built-in X-ray classes
    sources.py     where a data set is read: the caller's folder (--src), else $FEDSEG_DATASETS/<folder>
    common.py      what the importers share: the manifest and the files it lists, seeded group splits, the datalists

No pixel of a licensed data set is copied (derived crops go to the caller's output folder). This package
re-exports each module's public names.
"""

from . import common, foundation, nuclei, odoc, retina, sources, xray_angio
from .common import *  # noqa: F401,F403 -- each module's __all__ is this package's
from .foundation import *  # noqa: F401,F403
from .nuclei import *  # noqa: F401,F403
from .odoc import *  # noqa: F401,F403
from .retina import *  # noqa: F401,F403
from .sources import *  # noqa: F401,F403
from .xray_angio import *  # noqa: F401,F403

__all__ = list(dict.fromkeys(name for module in (retina, nuclei, xray_angio, odoc, foundation, sources, common)
                             for name in module.__all__))
