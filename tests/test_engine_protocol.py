"""The engine contract (``fedseg.engine.api``) against the engines: each provides every member of the protocol it claims
with the protocol's parameter names, and what the objectives and the site client call on an engine is in the contract.

The members are compared without building an engine (class attributes, and the ``self.<name> = ...`` assignments of the
class and its bases, read from the source); one test also builds each engine on tiny data and checks it with
``isinstance`` against its ``runtime_checkable`` protocol.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Dict, Protocol, Set

import pytest
import torch

import fedseg
from fedseg.engine.api import ENGINE_PROTOCOLS, ClassifierEngine, SegmentationEngine, SiteEngine, WindowSampledEngine

PACKAGE = Path(fedseg.__file__).parent


def protocol_members(protocol: type) -> Dict[str, str]:
    """``{name: "method" | "property" | "attribute"}`` of ``protocol`` and the protocols it extends."""
    members: Dict[str, str] = {}
    for cls in reversed(protocol.__mro__):
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        for name in cls.__dict__.get("__annotations__", {}):
            members[name] = "attribute"
        for name, value in vars(cls).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                members[name] = "property"
            elif inspect.isfunction(value):
                members[name] = "method"
    return members


def engine_class(path: str) -> type:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def instance_attributes(cls: type) -> Set[str]:
    """The names ``cls`` or a base assigns as ``self.<name> = ...`` (or annotates) in its methods' source."""
    names: Set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__ in ("abc", "builtins"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    names.add(target.attr)
    return names


ENGINES = sorted(ENGINE_PROTOCOLS.items())


def test_every_engine_has_a_protocol_and_the_protocols_nest():
    assert {path.rsplit(".", 1)[1] for path in ENGINE_PROTOCOLS} == {"SegEngine", "BundleEngine", "ClassificationEngine"}
    site = set(protocol_members(SiteEngine))
    assert site < set(protocol_members(SegmentationEngine)) < set(protocol_members(WindowSampledEngine))
    assert site < set(protocol_members(ClassifierEngine))
    # the segmentation calls are not part of what every engine offers (a classification site has none of them)
    assert not {"predict", "iterate_logits", "intensity_statistics", "window_sample"} & site


@pytest.mark.parametrize("protocol", [SiteEngine, SegmentationEngine, WindowSampledEngine, ClassifierEngine])
def test_every_member_of_the_contract_is_documented(protocol):
    for name, kind in protocol_members(protocol).items():
        if kind == "attribute":
            continue  # documented by the #: comment above it
        owner = next(c for c in protocol.__mro__ if name in vars(c))
        member = vars(owner)[name]
        doc = (member.fget if isinstance(member, property) else member).__doc__
        assert doc and doc.strip(), f"{protocol.__name__}.{name} has no docstring"


@pytest.mark.parametrize("path, protocol", ENGINES, ids=[p.rsplit(".", 1)[1] for p, _ in ENGINES])
def test_each_engine_class_provides_every_member_of_its_protocol(path, protocol):
    cls = engine_class(path)
    assigned = instance_attributes(cls)
    missing, not_methods = [], []
    for name, kind in protocol_members(protocol).items():
        if kind == "method":
            if not inspect.isfunction(inspect.getattr_static(cls, name, None)):
                not_methods.append(name)
        elif not hasattr(cls, name) and name not in assigned:
            missing.append(name)
    assert not missing, f"{cls.__name__} lacks {missing} of {protocol.__name__}"
    assert not not_methods, f"{cls.__name__}: {not_methods} of {protocol.__name__} are not methods"


def _signature_mismatches(protocol_fn, impl_fn) -> list:
    """What a call the protocol allows would not find in ``impl_fn``: a parameter's name, position, or default."""
    wanted = list(inspect.signature(protocol_fn).parameters.values())[1:]
    given = list(inspect.signature(impl_fn).parameters.values())[1:]
    by_name = {p.name: p for p in given}
    problems = []
    for i, p in enumerate(wanted):
        q = by_name.get(p.name)
        if q is None:
            problems.append(f"no parameter {p.name!r}")
            continue
        if p.kind is p.POSITIONAL_OR_KEYWORD and (q.kind is not q.POSITIONAL_OR_KEYWORD or given.index(q) != i):
            problems.append(f"{p.name!r} is not positional parameter {i + 1}")
        if p.kind is p.KEYWORD_ONLY and q.kind not in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY):
            problems.append(f"{p.name!r} cannot be passed by keyword")
        if p.default is not p.empty and q.default is q.empty:
            problems.append(f"{p.name!r} has no default")
    extra = [q.name for q in given if q.name not in {p.name for p in wanted}
             and q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
    problems += [f"extra required parameter {name!r}" for name in extra]
    return problems


@pytest.mark.parametrize("path, protocol", ENGINES, ids=[p.rsplit(".", 1)[1] for p, _ in ENGINES])
def test_each_engine_method_takes_the_protocols_parameters(path, protocol):
    cls = engine_class(path)
    problems = {}
    for name, kind in protocol_members(protocol).items():
        if kind != "method":
            continue
        owner = next(c for c in protocol.__mro__ if name in vars(c))
        mismatches = _signature_mismatches(vars(owner)[name], getattr(cls, name))
        if mismatches:
            problems[name] = mismatches
    assert not problems, f"{cls.__name__} against {protocol.__name__}: {problems}"


def _engine_calls(path: Path) -> Set[str]:
    """The attributes read on ``engine`` / ``self.engine`` in a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if (isinstance(base, ast.Name) and base.id == "engine") or (
                isinstance(base, ast.Attribute) and base.attr == "engine" and isinstance(base.value, ast.Name)
                and base.value.id == "self"):
            names.add(node.attr)
    return names


def test_what_objectives_and_the_site_client_call_is_in_the_contract():
    contract = set()
    for protocol in (WindowSampledEngine, ClassifierEngine):
        contract |= set(protocol_members(protocol))
    callers = sorted((PACKAGE / "objectives").glob("*.py")) + [PACKAGE / "fl" / "client.py", PACKAGE / "plots" / "overlays.py"]
    outside = {str(p.relative_to(PACKAGE)): sorted(_engine_calls(p) - contract) for p in callers}
    assert not {k: v for k, v in outside.items() if v}, f"engine members used but not in fedseg.engine.api: {outside}"


def test_built_engines_are_instances_of_their_protocols(tiny_engine, tmp_path):
    """The runtime check on real engines (tiny data): each is an instance of its protocol and not of the wider ones."""
    from test_engine_classification import write_classification_datalist

    from fedseg.bundle import default_bundle_dir
    from fedseg.engine.bundle_engine import BundleEngine
    from fedseg.engine.classification import ClassificationEngine

    assert isinstance(tiny_engine, WindowSampledEngine)
    bundle = BundleEngine("site-a", {"bundle": str(default_bundle_dir("unet2d_seg")), "local_epochs": 1, "seed": 0,
                                     "bundle_overrides": {"dataset_dir": str(tiny_engine.datalist_path.parent),
                                                          "image_size": 32}}, device=torch.device("cpu"))
    assert isinstance(bundle, SegmentationEngine) and not isinstance(bundle, WindowSampledEngine)
    classifier = ClassificationEngine("site-a", write_classification_datalist(tmp_path),
                                      {"vit_profile": "tiny", "vit_image_size": 32, "num_classes": 2, "seed": 0},
                                      device=torch.device("cpu"))
    assert isinstance(classifier, ClassifierEngine) and not isinstance(classifier, SegmentationEngine)
