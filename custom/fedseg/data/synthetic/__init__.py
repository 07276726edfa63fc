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

from .families import (
    FAMILIES,
    GENERATOR_VERSION,
    POLYP_FRACTION_BAND,
    PROFILES,
    VESSEL_FOV_FRACTION_BAND,
    family_label_space,
    generate_federation,
    generate_site_data,
)
from .files import (
    check_site_name,
    existing_datalist,
    numbered_names,
    prepare_site_folder,
    remove_stale_files,
    save_png_atomic,
    seeded_splits,
    site_seed,
    split_counts,
)
from .fundus import FUNDUS_CDR_BAND, FUNDUS_LABEL_SPACE, draw_fundus_anatomy, fundus_image
from .nuclei import NUCLEI_FRACTION_BAND, draw_nuclei_anatomy, nuclei_image
from .volumes import (
    FOV_BAND_MM,
    ORGAN_WIDTH_BAND_MM,
    ORIENTATIONS,
    PROSTATE3D_LABEL_SPACE,
    VOLUME_FAMILIES,
    VOLUME_GENERATOR_VERSION,
    VOLUME_PROFILES,
    generate_volume_federation,
    generate_volume_site,
    volume_family_fields,
    volume_family_label_space,
)
from .xray import DEVICES, SEGMENTATION_DEVICES, TARGETS, XRAY_IMAGE_SIZES, draw_xray_anatomy, xray_frame, xray_image
from .xray_builtin import (
    DOWNSTREAM_NUM_IMAGES,
    FOUNDATION_IMAGE_SIZES,
    FOUNDATION_PER_CLASS,
    builtin_assignment,
    builtin_downstream_sites,
    builtin_foundation_silos,
    builtin_label_space,
    builtin_probe_sites,
    probe_label_space,
    scanner_anatomy,
    scanner_names,
)

__all__ = [
    # families.py: the 2-D families and the site / federation generator
    "FAMILIES",
    "GENERATOR_VERSION",
    "PROFILES",
    "VESSEL_FOV_FRACTION_BAND",
    "POLYP_FRACTION_BAND",
    "family_label_space",
    "generate_site_data",
    "generate_federation",
    # files.py
    "check_site_name",
    "existing_datalist",
    "numbered_names",
    "prepare_site_folder",
    "remove_stale_files",
    "save_png_atomic",
    "seeded_splits",
    "site_seed",
    "split_counts",
    # fundus.py, nuclei.py, xray.py
    "FUNDUS_CDR_BAND",
    "FUNDUS_LABEL_SPACE",
    "draw_fundus_anatomy",
    "fundus_image",
    "NUCLEI_FRACTION_BAND",
    "draw_nuclei_anatomy",
    "nuclei_image",
    "DEVICES",
    "SEGMENTATION_DEVICES",
    "TARGETS",
    "XRAY_IMAGE_SIZES",
    "draw_xray_anatomy",
    "xray_frame",
    "xray_image",
    # volumes.py
    "VOLUME_GENERATOR_VERSION",
    "VOLUME_FAMILIES",
    "VOLUME_PROFILES",
    "PROSTATE3D_LABEL_SPACE",
    "ORIENTATIONS",
    "ORGAN_WIDTH_BAND_MM",
    "FOV_BAND_MM",
    "generate_volume_site",
    "generate_volume_federation",
    "volume_family_label_space",
    "volume_family_fields",
    # xray_builtin.py
    "FOUNDATION_IMAGE_SIZES",
    "FOUNDATION_PER_CLASS",
    "DOWNSTREAM_NUM_IMAGES",
    "scanner_names",
    "scanner_anatomy",
    "builtin_label_space",
    "builtin_assignment",
    "builtin_foundation_silos",
    "builtin_downstream_sites",
    "probe_label_space",
    "builtin_probe_sites",
]
