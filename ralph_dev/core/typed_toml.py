"""TOML values checked against dataclass annotations, with errors that say where.

``coerce(value, annotation, where)`` accepts exactly what a setting's type
allows (bools are not ints, a path is a non-empty string, a literal is one of
its choices…) and otherwise raises ``ConfigError`` naming ``where``, what was
expected and what was found.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ralph_dev.core.errors import ConfigError


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if tp is Path:
        return "a path string"
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if origin is tuple:
        return "a list of strings"
    if origin is Mapping:
        return "a table"
    return str(tp)


_SCALARS: dict[Any, tuple[Any, Any]] = {
    # annotation: (accepts the TOML value?, convert it)
    bool: (lambda v: isinstance(v, bool), lambda v: v),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), lambda v: v),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), float),
    str: (lambda v: isinstance(v, str), lambda v: v),
    Path: (lambda v: isinstance(v, str | Path) and bool(str(v)), lambda v: Path(v).expanduser()),
}


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against annotation ``tp``; return the typed value or raise."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ConfigError(f"{where}: expected {type_name(tp)}, got {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if args and args[-1] is not Ellipsis:  # fixed length, e.g. four prices
            if isinstance(value, list | tuple) and len(value) == len(args):
                return tuple(coerce(v, a, f"{where}[{i}]")
                             for i, (v, a) in enumerate(zip(value, args, strict=True)))
            raise ConfigError(f"{where}: expected a list of {len(args)} values "
                              f"({type_name(args[0])} each), got {value!r}")
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    if origin is Mapping:
        _key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return {str(k): coerce(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    accept = _SCALARS.get(tp)
    if accept is not None and accept[0](value):
        return accept[1](value)
    raise ConfigError(f"{where}: expected {type_name(tp)}, got {value!r}")
