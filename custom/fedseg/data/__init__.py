"""Data layer: datalists, built-in synthetic multi-site generators and the real-data importers.

    generate_site_data / generate_federation   synthetic "vessel" / "polyp" / "nuclei" sites as PNG + datalist
    load_datalist / validate_pair              strict loading with absolute paths (DatalistError)
    summarise_datalist                         aggregate numbers for reports
    import_retina / participant_split          DRIVE/STARE/CHASE_DB1 datalists, FVAC participant shares
    import_nuclei                              MoNuSeg/TNBC H&E nuclei datalists (by source or by organ)
"""

from .datalist import (
    SPLITS,
    DatalistError,
    load_datalist,
    monai_reader_name,
    read_array,
    summarise_datalist,
    validate_pair,
    write_json_atomic,
)
from .nuclei import DEFAULT_NUCLEI_ROOT, import_nuclei
from .retina import DEFAULT_RETINA_ROOT, import_retina, participant_split, read_manifest
from .synthetic import FAMILIES, GENERATOR_VERSION, PROFILES, generate_federation, generate_site_data, site_seed

__all__ = [
    "SPLITS",
    "DatalistError",
    "load_datalist",
    "validate_pair",
    "summarise_datalist",
    "read_array",
    "monai_reader_name",
    "write_json_atomic",
    "FAMILIES",
    "GENERATOR_VERSION",
    "PROFILES",
    "generate_site_data",
    "generate_federation",
    "site_seed",
    "DEFAULT_RETINA_ROOT",
    "import_retina",
    "participant_split",
    "read_manifest",
    "DEFAULT_NUCLEI_ROOT",
    "import_nuclei",
]
