"""How a message dataclass becomes one Redis stream entry and back: the only code that touches field encoding.

Where it sits: `shared/schema.py` builds one `Codec` over its message classes and
exposes its `encode` / `decode`; services never call this module directly.

Wire format: a `type` tag; each scalar field (str, int, float, bool, a StrEnum,
or one of those or None) is its own plain string field, so `redis-cli XRANGE`
is readable (a None is left out); every other field goes into one msgpack map
in the field `payload`. msgspec converts and validates (why msgspec, with the
measurements: docs/contracts.md, "Codec"): header strings are parsed leniently
into the field's type ("3" -> 3, "1" -> True, "serving" -> an enum member); the
payload is decoded strictly against the fields' types (token ids that are
strings are an error, not converted). Any bad entry raises `MalformedMessage`,
and nothing else.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

PAYLOAD_FIELD = "payload"
TYPE_FIELD = "type"
_NO_PAYLOAD = b"\x80"  # an empty msgpack map: every payload field takes its default


class MalformedMessage(ValueError):
    """A stream entry that cannot be decoded into a known message."""


@dataclass(frozen=True, slots=True)
class _Layout:
    """How one message class maps onto stream fields, worked out once from its type hints."""

    cls: type
    header: tuple[str, ...]
    """Scalar fields, each its own string field."""
    payload: tuple[str, ...]
    """The other fields, together in the msgpack `payload` field."""
    header_type: type
    """A dataclass of the header fields, into which their strings are converted leniently."""
    payload_decoder: msgspec.msgpack.Decoder[Any]
    """Decodes the payload strictly into a dataclass of the payload fields."""


class Codec:
    """Encodes and decodes the given message classes: frozen dataclasses, each with a `type` ClassVar tag."""

    def __init__(self, *classes: type) -> None:
        self._layouts = {str(getattr(cls, TYPE_FIELD)): _layout(cls) for cls in classes}
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, message: Any) -> dict[str, str | bytes]:
        """Message -> stream fields: scalars as strings, the rest in one msgpack payload."""
        layout = self._layouts[message.type]
        fields: dict[str, str | bytes] = {TYPE_FIELD: message.type}
        for name in layout.header:
            value = getattr(message, name)
            if value is not None:
                # a StrEnum's str() is its value; a bool travels as "1" / "0"
                fields[name] = str(int(value)) if isinstance(value, bool) else str(value)
        if layout.payload:
            payload = {name: getattr(message, name) for name in layout.payload}
            fields[PAYLOAD_FIELD] = self._encoder.encode(payload)
        return fields

    def decode(self, raw: Mapping[Any, Any]) -> Any:
        """Stream fields -> message. Raises MalformedMessage, and nothing else, on any bad entry."""
        type_tag = "?"
        try:
            fields = {_text(k): v for k, v in raw.items()}
            type_tag = _text(fields.get(TYPE_FIELD, b""))
            layout = self._layouts.get(type_tag)
            if layout is None:
                raise MalformedMessage(f"unknown message type {type_tag!r}; known: {sorted(self._layouts)}")
            strings = {n: _text(fields[n]) for n in layout.header if n in fields}
            header: Any = msgspec.convert(strings, layout.header_type, strict=False)
            payload = layout.payload_decoder.decode(fields.get(PAYLOAD_FIELD, _NO_PAYLOAD))
        except UnicodeDecodeError as exc:
            raise MalformedMessage(f"{type_tag}: a field is not valid UTF-8 ({exc})") from exc
        except msgspec.ValidationError as exc:
            raise MalformedMessage(f"{type_tag}: {exc}") from exc
        except (msgspec.DecodeError, TypeError) as exc:  # TypeError: a payload that is not bytes
            raise MalformedMessage(f"{type_tag}: payload is not valid msgpack ({exc})") from exc
        kwargs = {n: getattr(header, n) for n in layout.header}
        kwargs.update((n, getattr(payload, n)) for n in layout.payload)
        try:
            return layout.cls(**kwargs)
        except (ValueError, TypeError) as exc:  # a message class's own checks (__post_init__)
            raise MalformedMessage(f"{type_tag}: {exc}") from exc


def _layout(cls: type) -> _Layout:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    header = tuple(n for n in names if _is_scalar(hints[n]))
    payload = tuple(n for n in names if n not in header)
    return _Layout(cls=cls, header=header, payload=payload,
                   header_type=_part(cls, "Header", header, hints),
                   payload_decoder=msgspec.msgpack.Decoder(_part(cls, "Payload", payload, hints)))


def _is_scalar(hint: Any) -> bool:
    if isinstance(hint, types.UnionType):  # X | None
        return all(arg is type(None) or _is_scalar(arg) for arg in typing.get_args(hint))
    return hint in (str, int, float, bool) or (isinstance(hint, type) and issubclass(hint, StrEnum))


def _part(cls: type, suffix: str, names: tuple[str, ...], hints: dict[str, Any]) -> type:
    """A dataclass with the `names` fields of `cls` (same types and defaults), for msgspec to fill."""
    spec = [(f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory))
            for f in dataclasses.fields(cls) if f.name in names]
    return dataclasses.make_dataclass(cls.__name__ + suffix, spec, kw_only=True, frozen=True)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
