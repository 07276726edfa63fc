"""The data package's rooms (core, ``synthetic/``, ``importers/``) export every name they declare."""

from __future__ import annotations

import importlib

import fedseg.data


def test_every_public_name_of_the_package_and_its_rooms_imports():
    for package in ("fedseg.data", "fedseg.data.synthetic", "fedseg.data.importers"):
        module = importlib.import_module(package)
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == [], package
    # the names fedseg.data exported before the split, and the ones still imported from fedseg.data.synthetic
    assert {"build_foundation", "builtin_foundation_silos", "import_dca1", "import_nuclei", "import_retina",
            "generate_federation", "DEFAULT_RETINA_ROOT", "DEFAULT_NUCLEI_ROOT", "DEFAULT_XRAY_ANGIO_ROOT"} <= set(fedseg.data.__all__)
    from fedseg.data.synthetic import FAMILIES, NUCLEI_FRACTION_BAND, family_label_space, generate_site_data  # noqa: F401


def test_no_two_modules_of_a_room_declare_the_same_name():
    # a room re-exports its modules' names with star imports: two different things under one name would leave the
    # room with whichever came last (one module passing on another's name is the same thing, and fine)
    for package in ("fedseg.data.synthetic", "fedseg.data.importers"):
        room = importlib.import_module(package)
        declared = {}
        for module in vars(room).values():
            if getattr(module, "__name__", "").startswith(package + ".") and hasattr(module, "__all__"):
                if not set(module.__all__) & set(room.__all__):
                    continue  # a module of the folder the room does not re-export (imported on its own, e.g. layouts)
                for name in module.__all__:
                    value = getattr(module, name)
                    assert declared.setdefault(name, value) is value, f"{package}: two modules declare {name}"
                    assert getattr(room, name) is value, f"{package}.{name} is not {module.__name__}'s"
        assert sorted(declared) == sorted(room.__all__), package
