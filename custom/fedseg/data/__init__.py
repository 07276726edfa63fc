"""Data layer: datalists and their checks (here), built-in synthetic generators, importers of public data sets.

Layout:

    fedseg/data/            the core every engine, bundle and job reads: datalist.py (strict loading, DatalistError),
                            checks.py (every file checked before training), labels.py (label spaces), transforms.py
                            (MONAI transforms the bundles name), volumes.py, image_modes.py, errors.py,
                            classification.py / classification_transforms.py (classification datalists), silos.py
                            (label-space silos with an unseen proportion)
    fedseg/data/synthetic/  built-in generators: the 2-D families, prostate3d volumes, FedEFM's X-ray silos and sites
    fedseg/data/importers/  readers of public data sets (retina, nuclei, X-ray angiography, OD/OC + prostate samples,
                            FedEFM phase-1 silos); their folder is the caller's (--src), else $FEDSEG_DATASETS/<folder>

Public names (re-exported here):

    generate_site_data / generate_federation   synthetic "vessel" / "polyp" / "nuclei" / "xray" sites as PNG + datalist
    load_datalist / validate_pair              strict loading with absolute paths (DatalistError)
    summarise_datalist                         aggregate numbers for reports
    import_retina / participant_split          DRIVE/STARE/CHASE_DB1 datalists, FVAC participant shares
    import_nuclei                              MoNuSeg/TNBC H&E nuclei datalists (by source or by organ)
    assign_classes / make_silos / write_silos  label-space silos with an unseen proportion (classification datalists)
    builtin_foundation_silos                   FedEFM phase 1 on built-in X-ray classes (xray/<scanner>/<device>)
    builtin_downstream_sites                   FedEFM phase 2: catheter/guidewire segmentation on unseen scanner styles
    builtin_probe_sites                        FedEFM phase 2 classification probe (device classes, same styles)
    import_dca1 / arcade_crops                 DCA1 vessel segmentation datalists, ARCADE stenosis crops
    build_foundation                           phase-1 silos from real labels plus built-in X-ray classes
    default_data_root                          $FEDSEG_DATASETS/<folder>: where an importer reads without --src
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
from .classification import load_classification_datalist
from .silos import assign_classes, make_silos, write_silos
from .synthetic import (
    FAMILIES,
    GENERATOR_VERSION,
    PROFILES,
    builtin_assignment,
    builtin_downstream_sites,
    builtin_foundation_silos,
    builtin_label_space,
    builtin_probe_sites,
    generate_federation,
    generate_site_data,
    site_seed,
)
from .importers import (
    DEFAULT_NUCLEI_ROOT,
    DEFAULT_RETINA_ROOT,
    DEFAULT_XRAY_ANGIO_ROOT,
    arcade_crops,
    build_foundation,
    default_data_root,
    import_dca1,
    import_nuclei,
    import_retina,
    participant_split,
    read_manifest,
)

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
    "assign_classes",
    "make_silos",
    "write_silos",
    "load_classification_datalist",
    "builtin_label_space",
    "builtin_assignment",
    "builtin_foundation_silos",
    "builtin_downstream_sites",
    "builtin_probe_sites",
    "DEFAULT_XRAY_ANGIO_ROOT",
    "import_dca1",
    "arcade_crops",
    "build_foundation",
    "default_data_root",
]
