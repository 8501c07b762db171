"""How a section of the stack file becomes its frozen dataclass: each field names its key once (``setting``), and
``read`` takes every field from under its key by the field's type. Errors name the key relative to the section
being read; ``read`` adds the section's place, so the message names the key as the stack file spells it."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, ClassVar, NoReturn

from spotray.errors import ConfigError, closest, key_text

NAMESPACE = "spotray"  # every setting sits under ``spotray:`` in Pulumi.<stack>.yaml
STACK_TAG = f"{NAMESPACE}:stack"  # on every AWS resource of a stack: its name


def setting(key: str, default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING,
            parse: Callable[[Any, str], Any] | None = None) -> Any:
    """A field read from the stack file under ``key``; ``parse(value, key path)`` replaces the reading by type."""
    return field(default=default, default_factory=factory, metadata={"key": key, "parse": parse})


class Section:
    """A section of the stack file; its checks name keys relative to it (the reader adds where it sits).
    ``_RETIRED``: keys that were settings once, each with what replaces it (``read`` refuses them)."""

    _PREFIX: ClassVar[str] = ""
    _RETIRED: ClassVar[dict[str, str]] = {}

    def require(self, ok: bool, name: str | None, problem: str, fix: str) -> None:
        """``name``: a field (``min_size``), a dotted path into nested sections, or None for the whole section."""
        if not ok:
            self.reject(name, problem, fix)

    def reject(self, name: str | None, problem: str, fix: str) -> NoReturn:
        raise ConfigError(self._PREFIX + (key_of(type(self), name) if name else ""), problem, fix)


def key_of(cls: type, path: str) -> str:
    """The stack-file key of a field path: ``network.availability_zones`` -> ``network.availabilityZones``; past
    the last section the path names map keys (``prices_usd_per_hour.g5.xlarge`` -> ``pricesUsdPerHour.g5.xlarge``)."""
    keys = []
    section: type | None = cls
    for name in path.split("."):
        if section is None:
            keys.append(name)
            continue
        keys.append(next(f for f in dataclasses.fields(section) if f.name == name).metadata["key"])
        section = _section_type(typing.get_type_hints(section)[name])
    return ".".join(keys)


def _section_type(hint: Any) -> type | None:
    """The dataclass a field holds (itself, optional, or a tuple of them), if any."""
    candidates = [hint, *typing.get_args(hint)]
    return next((c for c in candidates if _is_section(c)), None)


def _is_section(hint: Any) -> typing.TypeGuard[type]:
    """Whether a field type is a dataclass read as a section (a class, never an instance)."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def read(cls: type, raw: Any, path: str, defaults: dict[type, dict[str, Any]], **context: Any) -> Any:
    """``cls`` from its section ``raw`` of the stack file at ``path``: each field under its key, read by its type.
    ``defaults`` give absent keys values (read like given ones); ``context`` fills fields not in the file."""
    raw = mapping(raw, path)
    settings = {f.metadata["key"]: f for f in dataclasses.fields(cls) if "key" in f.metadata}
    replacements: dict[str, str] = getattr(cls, "_RETIRED", {})
    retired = sorted(set(raw) & set(replacements), key=str)
    if retired:
        raise ConfigError(_join(path, retired[0]), "is no longer a setting", replacements[retired[0]])
    unknown = sorted(set(raw) - set(settings), key=str)
    if unknown:
        raise ConfigError(_join(path, unknown[0]), "is not a setting here",
                          f"{closest(unknown[0], settings)}use only {', '.join(sorted(settings))}")
    hints = typing.get_type_hints(cls)
    kwargs = dict(context)
    for key, f in settings.items():
        if key in raw or f.name in defaults.get(cls, {}):
            value = raw[key] if key in raw else defaults[cls][f.name]
            parse = f.metadata["parse"] or (lambda v, k, hint=hints[f.name]: _typed(hint, v, k, defaults))
            kwargs[f.name] = parse(value, _join(path, key))
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise exc.within(f"{path}." if path else "") from None


def _join(path: str, key: Any) -> str:
    return f"{path}.{key_text(key)}" if path else key_text(key)


def _typed(hint: Any, value: Any, key: str, defaults: dict[type, dict[str, Any]]) -> Any:
    """``value`` as the field type ``hint`` wants it, or a ConfigError naming ``key``."""
    if hint is Any:
        return value
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if _is_section(hint):
        return read(hint, value, key, defaults)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        return tuple(_typed(args[0], v, f"{key}[{i}]", defaults) for i, v in enumerate(_list(value, key)))
    if origin is Mapping:
        return {str(k): _map_value(args[1], v, _join(key, k)) for k, v in mapping(value, key).items()}
    return _scalar(hint, value, key)


def _map_value(hint: type, value: Any, key: str) -> Any:
    """Labels and tags are strings; YAML reads some of them as numbers or booleans."""
    if hint is str and isinstance(value, int | float | bool):
        return str(value)
    return _scalar(hint, value, key)


_SCALARS = {
    str: (lambda v: isinstance(v, str), "a string", "quote it"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number", "set a whole number"),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number", "set a number"),
    bool: (lambda v: isinstance(v, bool), "true or false", "set true or false"),
}


def _scalar(hint: type, value: Any, key: str) -> Any:
    ok, what, fix = _SCALARS[hint]
    if not ok(value):
        raise ConfigError(key, f"must be {what}, got {value!r}", fix)
    return float(value) if hint is float else value


def mapping(value: Any, key: str) -> Mapping:
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(key, f"must be a mapping, got {type(value).__name__}",
                          f"write it as an object, e.g. `pulumi config set --path '{NAMESPACE}:{key}.field' value`")
    return value or {}


def _list(value: Any, key: str) -> list:
    if not isinstance(value, list | tuple):
        raise ConfigError(key, f"must be a list, got {value!r}", "write it as a YAML list")
    return list(value)
