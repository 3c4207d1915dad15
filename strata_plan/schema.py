"""Strict, typed loading of YAML data into frozen dataclasses.

Every versioned file (hardware profile, plan, routing statistics) is parsed here, so each one is strict
in the same way: unknown fields, missing fields, wrong types and out-of-range numbers raise a
`UserError` naming the file, the dotted field path and the fix. Bounds live in the dataclass field's
metadata (`bounded(lo, hi, unit)`), next to the field they guard.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, Union

from .errors import UserError


def bounded(lo: float | None = None, hi: float | None = None, unit: str = "", default: Any = dataclasses.MISSING,
            **kw: Any) -> Any:
    """A dataclass field whose number must lie in [lo, hi] (`unit` is shown in the error)."""
    meta = {"lo": lo, "hi": hi, "unit": unit}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta, **kw)
    return dataclasses.field(default=default, metadata=meta, **kw)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        return "a list"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return str(tp)


def parse(cls: type, data: Any, where: str, path: str = "") -> Any:
    """Build a `cls` instance from plain YAML data, refusing anything that does not fit exactly."""
    return _parse(cls, data, where, path, None)


def _fail(where: str, path: str, problem: str, fix: str) -> typing.NoReturn:
    raise UserError(where, path or "(top level)", problem, fix)


def _parse(tp: Any, data: Any, where: str, path: str, meta: dict | None) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            if len(args) < len(typing.get_args(tp)):
                return None
            _fail(where, path, "is empty", f"give {_describe(args[0])}")
        return _parse(args[0], data, where, path, meta)
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            _fail(where, path, f"must be a mapping, got {type(data).__name__}", "write it as `key: value` lines")
        fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
        unknown = [k for k in data if k not in fields]
        if unknown:
            key = unknown[0]
            _fail(where, _join(path, str(key)), "unknown field",
                  f"remove it or rename it to one of: {', '.join(sorted(fields))}")
        hints = _hints(tp)
        kwargs = {}
        for name, f in fields.items():
            sub = _join(path, name)
            if name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    _fail(where, sub, "missing field", f"add `{name}:` ({_describe(hints[name])})")
                continue
            kwargs[name] = _parse(hints[name], data[name], where, sub, dict(f.metadata) or None)
        try:
            return tp(**kwargs)
        except UserError:
            raise
        except (ValueError, TypeError) as e:  # __post_init__ cross-field checks
            _fail(where, path, str(e), "make the fields agree")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if data not in allowed:
            _fail(where, path, f"got {data!r}", f"use {_describe(tp)}")
        return data
    if origin in (tuple, list):
        args = typing.get_args(tp)
        if not isinstance(data, list):
            _fail(where, path, f"must be a list, got {type(data).__name__}", "write it as a YAML list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_parse(args[0], v, where, f"{path}[{i}]", meta) for i, v in enumerate(data))
        if len(args) != len(data):
            _fail(where, path, f"must have {len(args)} entries, got {len(data)}", f"write [{', '.join(_describe(a) for a in args)}]")
        return tuple(_parse(a, v, where, f"{path}[{i}]", meta) for i, (a, v) in enumerate(zip(args, data)))
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(data, dict):
            _fail(where, path, f"must be a mapping, got {type(data).__name__}", "write it as `key: value` lines")
        return {_parse(kt, k, where, f"{path}.<key {k!r}>", None): _parse(vt, v, where, _join(path, str(k)), meta)
                for k, v in data.items()}
    if tp is Any:
        return data
    if tp is bool:
        if not isinstance(data, bool):
            _fail(where, path, f"must be true or false, got {data!r}", "write true or false")
        return data
    if tp in (int, float):
        if isinstance(data, bool) or not isinstance(data, (int, float)) or (tp is int and not isinstance(data, int)):
            _fail(where, path, f"must be {_describe(tp)}, got {data!r}", f"write {_describe(tp)}")
        if isinstance(data, float) and math.isnan(data):
            _fail(where, path, f"must be a number, got {data!r}", "write a finite number")
        if isinstance(data, float) and math.isinf(data):
            _fail(where, path, f"out of range: {data!r} (beyond a 64-bit float)", "write a finite number")
        if meta:
            lo, hi, unit = meta.get("lo"), meta.get("hi"), meta.get("unit", "")
            u = f" {unit}" if unit else ""
            if (lo is not None and data < lo) or (hi is not None and data > hi):
                rng = f"between {lo} and {hi}{u}" if lo is not None and hi is not None else (
                    f"at least {lo}{u}" if lo is not None else f"at most {hi}{u}")
                _fail(where, path, f"out of range: {data!r}", f"use a value {rng}")
        return tp(data)
    if tp is str:
        if not isinstance(data, str):
            _fail(where, path, f"must be a string, got {type(data).__name__}", "quote the value")
        return data
    raise TypeError(f"schema: unsupported type {tp!r} at {path}")  # a bug in our dataclasses, not user input


def check_schema(obj: Any, name: str, version: int) -> None:
    """The `schema` and `version` fields of a versioned file's top-level dataclass (call it from
    `__post_init__`; `parse` turns the ValueError into a one-line UserError)."""
    if obj.schema != name:
        raise ValueError(f"schema must be {name!r}")
    if obj.version != version:
        raise ValueError(f"version {obj.version} is not supported (this strata-plan reads version {version})")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def to_data(obj: Any) -> Any:
    """The inverse of `parse`: plain dicts, lists and numbers, in field order, ready for `safe_dump`."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            v = getattr(obj, f.name)
            if (v is None and f.default is None) or (v == "" and f.default == ""):
                continue
            if v == {} and f.default_factory is dict:
                continue
            out[f.name] = to_data(v)
        return out
    if isinstance(obj, (tuple, list)):
        return [to_data(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_data(v) for k, v in obj.items()}
    return obj
