"""One line per config mistake: pydantic's validation errors rewritten as `key.path=value is invalid: ...`.

Where it sits: shared/config.py turns every ValidationError into a ConfigError
whose message comes from `format_errors`; the CLIs print it as is. The wording
keeps the hand-written loader's (`expected >= 1`, `unknown key trainer.bogus;
known under trainer: ...`), so messages stay stable across pydantic versions.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config file or dict is invalid; the message is one line naming the file, key and value."""


_EXPECTED = {
    "finite_number": "expected a finite number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "int_type": "expected int",
    "int_from_float": "expected int",
    "int_parsing": "expected int",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "string_pattern_mismatch": "expected letters, digits, '_', '.' or '-' only",
}
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}


def _describe(error: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        bound = ctx[key]
        return f"expected {op} {int(bound) if isinstance(bound, float) and bound.is_integer() else bound}"
    if kind == "literal_error":
        return f"expected {ctx['expected']}"
    msg = str(error["msg"])
    return msg[0].lower() + msg[1:] if msg else kind


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a mapping at `loc` accepts (walking nested models by field annotation)."""
    current: Any = model
    for part in loc:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = field.annotation
        for arg in getattr(current, "__args__", ()):  # `X | None`
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
    return sorted(getattr(current, "model_fields", {}))


def format_error(error: Any, model: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    path = ".".join(str(part) for part in loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = ".".join(str(p) for p in loc[:-1]) or "top level"
        known = _known_keys(model, loc[:-1])
        hint = ""
        if not loc[:-1] and loc[-1] in ("cluster", "replica", "costs", "workload"):
            hint = " (an old scenario file? see docs/simulator.md for the config format)"
        return f"unknown key {path}{hint}; known under {parent}: {', '.join(known)}"
    if kind == "missing":
        return f"{path} is missing (required)"
    if kind == "value_error" and not loc:  # a cross-section rule: its message names key and value
        return str(error["msg"]).removeprefix("Value error, ")
    return f"{path}={error['input']!r} is invalid: {_describe(error)}"


def format_errors(exc: ValidationError, model: type[BaseModel]) -> str:
    """Every error of `exc`, one clause each, joined into one line."""
    return "; ".join(format_error(error, model) for error in exc.errors())
