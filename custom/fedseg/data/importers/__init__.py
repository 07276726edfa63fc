"""Importers of public data sets: each reads a licensed data set where it lies and writes datalists that point at it.

    retina.py      DRIVE / STARE / CHASE_DB1 vessel sites; participant_split (FVAC participant shares)
    nuclei.py      MoNuSeg / TNBC H&E nuclei sites, by source or by organ
    xray_angio.py  DCA1 vessel segmentation sites; ARCADE stenosis crops (classification items)
    odoc.py        fundus optic disc / cup and prostate MRI slice samples, one site per domain
    foundation.py  FedEFM phase-1 silos from the real labels above plus the built-in X-ray classes
    sources.py     where a data set is read: the caller's folder (--src), else $FEDSEG_DATASETS/<folder>

No pixel of a licensed data set is copied (derived crops go to the caller's output folder). This package
re-exports each module's public names.
"""

from .foundation import build_foundation, builtin_xray_items, nuclei_items, retina_items
from .nuclei import DEFAULT_NUCLEI_ROOT, DEFAULT_ORGAN_MIN_IMAGES, LAYOUTS, import_nuclei
from .odoc import ODOC_FOLDER, ODOC_TASKS, import_odoc
from .retina import DEFAULT_RESCALE, DEFAULT_RETINA_ROOT, import_retina, participant_split, read_manifest
from .sources import DATA_FOLDERS, DATA_ROOT_ENV, default_data_root, resolve_source
from .xray_angio import ARCADE_CLASSES, DEFAULT_XRAY_ANGIO_ROOT, arcade_crops, import_dca1

__all__ = [
    # retina.py
    "DEFAULT_RETINA_ROOT",
    "DEFAULT_RESCALE",
    "import_retina",
    "participant_split",
    "read_manifest",
    # nuclei.py
    "DEFAULT_NUCLEI_ROOT",
    "DEFAULT_ORGAN_MIN_IMAGES",
    "LAYOUTS",
    "import_nuclei",
    # xray_angio.py
    "DEFAULT_XRAY_ANGIO_ROOT",
    "ARCADE_CLASSES",
    "import_dca1",
    "arcade_crops",
    # odoc.py
    "ODOC_FOLDER",
    "ODOC_TASKS",
    "import_odoc",
    # foundation.py
    "build_foundation",
    "retina_items",
    "nuclei_items",
    "builtin_xray_items",
    # sources.py
    "DATA_ROOT_ENV",
    "DATA_FOLDERS",
    "default_data_root",
    "resolve_source",
]
