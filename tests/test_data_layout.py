"""The data package's rooms (core, ``synthetic/``, ``importers/``) keep every name importable where it was."""

from __future__ import annotations

import importlib

import pytest

import fedseg.data

#: module paths from before the split into subpackages that are still imported (benchmarks/, users' scripts)
ALIASES = {
    "fedseg.data.retina": "fedseg.data.importers.retina",
    "fedseg.data.synthetic_xray": "fedseg.data.synthetic.xray",
    "fedseg.data.synthetic_volumes": "fedseg.data.synthetic.volumes",
    "fedseg.data.xray_builtin": "fedseg.data.synthetic.xray_builtin",
}


@pytest.mark.parametrize("old, new", sorted(ALIASES.items()))
def test_an_old_module_path_is_the_moved_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_every_public_name_of_the_package_and_its_rooms_imports():
    for package in ("fedseg.data", "fedseg.data.synthetic", "fedseg.data.importers"):
        module = importlib.import_module(package)
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == [], package
    # the names fedseg.data exported before the split, and the ones still imported from fedseg.data.synthetic
    assert {"build_foundation", "builtin_foundation_silos", "import_dca1", "import_nuclei", "import_retina",
            "generate_federation", "DEFAULT_RETINA_ROOT", "DEFAULT_NUCLEI_ROOT", "DEFAULT_XRAY_ANGIO_ROOT"} <= set(fedseg.data.__all__)
    from fedseg.data.synthetic import FAMILIES, NUCLEI_FRACTION_BAND, family_label_space, generate_site_data  # noqa: F401
