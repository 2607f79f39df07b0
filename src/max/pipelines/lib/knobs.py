"""Configuration knobs: one declaration per option, read by every place that needs the option.

A knob is a dataclass field declared with :func:`knob`; its metadata holds what used to be
written in several places:

* the default (the field's own ``default`` / ``default_factory``);
* the type (the field's annotation; ``PipelineConfig`` coerces CLI strings with it);
* the help text (``PipelineConfig.help()`` and the ``--flag``'s help);
* the validation (``choices``, ``ge`` / ``gt`` / ``le`` bounds: checked by :func:`check_knobs` when a
  config is made, and turned into ``click.Choice`` / ``IntRange`` / ``FloatRange`` by the CLI);
* the keyword aliases ``PipelineConfig(**kwargs)`` accepts (``devices`` for ``device_specs``);
* how it appears on the command line (a :class:`Flag`, or none when it has no flag).

``max.entrypoints.cli`` builds its model options from these declarations (:func:`knob_spec`), so a
choice list, a bound or a help text exists once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass
from typing import Any, Callable, Optional, Sequence

__all__ = ["Flag", "KnobSpec", "accept_aliases", "check_knobs", "knob", "knob_spec", "knobs_of"]

_KEY = "libremax.knob"


@dataclass(frozen=True)
class Flag:
    """How a knob appears on the command line (``max generate`` / ``max serve``'s model options).

    ``decls``: the option's declarations (default ``--<field-name-with-dashes>``; a bool knob gets
    ``--x/--no-x`` unless ``is_flag``).  ``default``: the flag's default when it differs from "leave the
    config's default" (None); ``show_default`` prints it.  ``note``: a sentence about the command line
    only, appended to the knob's help.  ``memory_size``: the value is a size such as ``512MiB``.
    ``path``: ``click.Path`` keyword arguments.  ``extra``: the value reaches ``PipelineConfig`` through
    the click context (``cli.config_kwargs``), not as an argument of the command function.
    ``implies``: other knobs this flag turns on when given.
    """

    decls: tuple[str, ...] = ()
    default: Any = None
    show_default: bool = False
    note: str = ""
    metavar: Optional[str] = None
    is_flag: bool = False
    memory_size: bool = False
    path: Optional[dict] = None
    extra: bool = False
    implies: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class KnobSpec:
    """A knob's declaration (the field metadata :func:`knob` stores)."""

    help: str
    choices: Optional[tuple[str, ...]] = None
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    aliases: tuple[str, ...] = ()
    flag: Optional[Flag] = None

    def bounds_text(self) -> str:
        """The bounds as an error message fragment (``>= 1``, ``in (0, 1]``)."""
        if self.gt is not None and self.le is not None:
            return f"in ({self.gt:g}, {self.le:g}]"
        if self.gt is not None:
            return f"> {self.gt:g}"
        if self.ge is not None and self.le is not None:
            return f"in [{self.ge:g}, {self.le:g}]"
        if self.ge is not None:
            return f">= {self.ge:g}"
        return f"<= {self.le:g}" if self.le is not None else ""


def knob(default: Any = MISSING, *, help: str, default_factory: Callable[[], Any] | Any = MISSING,
         choices: Optional[Sequence[str]] = None, ge: Optional[float] = None, gt: Optional[float] = None,
         le: Optional[float] = None, aliases: Sequence[str] = (), flag: Optional[Flag] = None,
         repr: bool = True) -> Any:
    """A config field: its default, help, validation, keyword aliases and command-line flag, declared once.
    ``{default}`` in ``help`` is replaced by the default (so the help never restates it by hand)."""
    if "{default}" in help:
        help = help.replace("{default}", f"{default:g}" if isinstance(default, float) else str(default))
    spec = KnobSpec(help=help, choices=tuple(choices) if choices is not None else None, ge=ge, gt=gt, le=le,
                    aliases=tuple(aliases), flag=flag)
    return dataclasses.field(default=default, default_factory=default_factory, repr=repr,  # type: ignore[call-overload]
                             metadata={_KEY: spec})


def knob_spec(cls: type, name: str) -> KnobSpec:
    """The declaration of ``cls``'s knob ``name`` (KeyError when it is not a knob)."""
    for f in dataclasses.fields(cls):
        if f.name == name and _KEY in f.metadata:
            return f.metadata[_KEY]
    raise KeyError(f"{cls.__name__} has no knob {name!r}")


def knobs_of(cls: type) -> dict[str, tuple[dataclasses.Field, KnobSpec]]:
    """``{name: (field, spec)}`` of every knob of the dataclass ``cls``, in declaration order."""
    return {f.name: (f, f.metadata[_KEY]) for f in dataclasses.fields(cls) if _KEY in f.metadata}


def default_of(cls: type, name: str) -> Any:
    """The default value of ``cls``'s field ``name``."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:  # type: ignore[misc]
                return f.default_factory()  # type: ignore[misc]
    raise KeyError(f"{cls.__name__} has no field {name!r} with a default")


def check_knobs(obj: Any, prefix: str = "") -> None:
    """ValueError for the first knob of ``obj`` (a coerced config dataclass) outside its choices or bounds."""
    for name, (_, spec) in knobs_of(type(obj)).items():
        value = getattr(obj, name)
        if value is None:
            continue
        if spec.choices is not None and str(getattr(value, "value", value)) not in spec.choices:
            raise ValueError(f"{prefix}{name} must be one of {', '.join(spec.choices)}; got {value!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        bad = ((spec.ge is not None and value < spec.ge) or (spec.gt is not None and value <= spec.gt)
               or (spec.le is not None and value > spec.le))
        if bad:
            raise ValueError(f"{prefix}{name} must be {spec.bounds_text()}, got {value}")


def accept_aliases(cls: type) -> type:
    """Class decorator (after ``@dataclass``): the record's constructor also takes its knobs' aliases
    (``KVCacheConfig(cache_dtype=...)``, ``MAXModelConfig(devices="cpu")``); giving a knob twice is an error."""
    aliases = {a: name for name, (_, spec) in knobs_of(cls).items() for a in spec.aliases}
    if not aliases:
        return cls
    init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for alias in [k for k in kwargs if k in aliases]:
            name = aliases[alias]
            if name in kwargs:
                raise TypeError(f"{cls.__name__}: {alias!r} is an alias of {name!r}; give one of them")
            kwargs[name] = kwargs.pop(alias)
        init(self, *args, **kwargs)

    __init__.__doc__ = init.__doc__
    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls
