"""A method's options, defined once: one frozen dataclass per server strategy and per client objective.

Each field is an option: its type, its default and a one-line meaning (:func:`option`). The class checks and
normalises the values in ``__post_init__`` (ranges, allowed names), so a bad value fails wherever the options are
built: in the recipe that writes the job, at the server, at a site. From the one definition come

* the strategy's and the objective's keywords and attributes (``ServerStrategy.options_class``,
  ``ClientObjective.options_class``: ``strategy.delta`` is ``strategy.options.delta``),
* the strategy's ``config()`` (``report.json['config']``: its name, then :meth:`MethodOptions.as_dict`),
* the recipe's keywords and their defaults (:class:`JobOptions`: which options a recipe offers and writes into
  its job; ``jobs/job.py METHOD --help`` lists them with these defaults).
"""

from __future__ import annotations

import difflib
import inspect
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Type


def option(default: Any, doc: str, **kwargs: Any):
    """A field of a :class:`MethodOptions` dataclass: its ``default`` and its one-line meaning ``doc``."""
    return field(default=default, metadata={"doc": doc}, **kwargs)


def nearest_name(name: str, known: Sequence[str]) -> Optional[str]:
    """The name of ``known`` closest to a misspelt ``name`` (None: none is close)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return close[0] if close else None


def unknown_options(owner: str, given: Sequence[str], known: Sequence[str], error: type = TypeError) -> Exception:
    """The error for keywords ``owner`` does not take: each with the nearest known name where one is close."""
    hints = []
    for name in sorted(given):
        close = nearest_name(name, known)
        hints.append(f"{name!r} (did you mean {close!r}?)" if close else repr(name))
    return error(f"{owner} got unknown options {', '.join(hints)}; known: {sorted(known)}")


@dataclass(frozen=True)
class MethodOptions:
    """Base of the option dataclasses. A subclass declares its fields with :func:`option` and checks them in
    ``__post_init__``, normalising a value with :meth:`_set` (``float(clip)``); a field with ``init=False`` is a
    fixed value the strategy reports but does not take (FedBN's ``aggregation``)."""

    @classmethod
    def build(cls, owner: Optional[str] = None, **given: Any) -> "MethodOptions":
        """The options from keywords; unknown ones fail naming the nearest option (TypeError)."""
        unknown = set(given) - set(cls.names())
        if unknown:
            raise unknown_options(owner or cls.__name__, unknown, cls.names())
        return cls(**given)

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        """The options a constructor takes, in field order."""
        return tuple(f.name for f in fields(cls) if f.init)

    @classmethod
    def defaults(cls) -> Dict[str, Any]:
        """option -> its default, in field order."""
        return {f.name: f.default for f in fields(cls) if f.init and f.default is not MISSING}

    @classmethod
    def docs(cls) -> Dict[str, str]:
        """option -> its one-line meaning, in field order."""
        return {f.name: f.metadata.get("doc", "") for f in fields(cls) if f.init}

    @classmethod
    def takes_none(cls, name: str) -> bool:
        """Whether None is a value of option ``name`` of its own (its type is Optional)."""
        hint = typing.get_type_hints(cls)[name]
        return type(None) in typing.get_args(hint)

    @classmethod
    def parameters(cls) -> Dict[str, inspect.Parameter]:
        """The options as keyword-only parameters (name, default, type): a recipe's keywords (``jobs/job.py``)."""
        hints = typing.get_type_hints(cls)
        return {name: inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[name])
                for name, default in cls.defaults().items()}

    def as_dict(self) -> Dict[str, Any]:
        """Every field (fixed ones too) -> its value, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def _set(self, name: str, value: Any) -> None:
        """Store a normalised value (``__post_init__`` of a frozen dataclass)."""
        object.__setattr__(self, name, value)


def set_options(owner: Any, options_class: Optional[Type[MethodOptions]], given: Mapping[str, Any]) -> Optional[MethodOptions]:
    """``owner.options``: a strategy's or an objective's options from its constructor's keywords ``given``, each also
    an attribute of ``owner`` (the aggregation reads ``self.delta``); None where ``options_class`` is None.

    Raises:
        TypeError: a keyword that is not an option (naming the nearest one).
        ValueError: a value the options refuse.
    """
    owner_name = type(owner).__name__
    if options_class is None:
        if given:
            raise unknown_options(owner_name, given, ())
        owner.options = None
    else:
        owner.options = options_class.build(owner_name, **given)
        vars(owner).update(owner.options.as_dict())
    return owner.options


@dataclass(frozen=True)
class JobOptions:
    """Which options of one :class:`MethodOptions` class a recipe takes as its keywords and writes into its job (the
    strategy's or the objective's arguments in the exported JSON).

    Args:
        options: the option dataclass.
        names: the options the recipe offers (None: every option but ``fixed``'s), in the job in field order.
        fixed: options the recipe sets itself, written into the job and not offered (FVAC's ``weighting``).
        defaults: the recipe's own defaults over the dataclass's (FedAvgM's momentum).
        when_set: offered options written only when off their default, so that the jobs exported before they
            existed stay as they were.
    """

    options: Type[MethodOptions]
    names: Optional[Tuple[str, ...]] = None
    fixed: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    when_set: Tuple[str, ...] = ()

    def offered(self) -> Dict[str, inspect.Parameter]:
        """The recipe keywords of these options: name -> keyword-only parameter with the recipe's default."""
        names = self.names if self.names is not None else [n for n in self.options.names() if n not in self.fixed]
        parameters = self.options.parameters()
        return {n: parameters[n].replace(default=self.defaults.get(n, parameters[n].default)) for n in names}

    def job_args(self, given: Mapping[str, Any], profile_values: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """The options as the job records them: each offered option from ``given`` (the recipe's keywords), else the
        profile's value (``profile_values``), else the default; ``fixed`` over them. A keyword given as None keeps the
        profile's value where the profile sets one, else the default, unless None is a value of the option's own.
        Checked and normalised by the dataclass, in field order.

        Raises:
            ValueError / TypeError: a value the options refuse.
        """
        profile_values = profile_values or {}
        values: Dict[str, Any] = {}
        for name, parameter in self.offered().items():
            value = given.get(name)
            if value is None and not (name in given and name not in profile_values and self.options.takes_none(name)):
                value = profile_values.get(name, parameter.default)
            values[name] = value
        values.update(self.fixed)
        built = self.options.build(**values).as_dict()
        return {name: built[name] for name in self.options.names() if name in values
                and not (name in self.when_set and built[name] == self.options.defaults()[name])}
