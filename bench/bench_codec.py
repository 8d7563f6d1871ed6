"""Stream codec: encode and decode time per message, hand-written codec versus msgspec.

Where it sits: `shared/codec.py` turns every message into stream fields (scalars
as readable strings, the rest in one msgpack `payload`) and back. This compares,
on the same wire format and the same messages:

- `hand-written`: the seed's codec (`_to_plain` / `_parse_scalar` over msgpack),
  copied here verbatim. It checks header scalars but not the payload: token ids
  that are strings pass through.
- `hand-written+check`: the same plus the type walk it would need to reject a
  wrong payload as msgspec does (every list item checked against its hint).
- `msgspec/dataclass`: `shared.codec.Codec`, what the services use: messages stay
  frozen dataclasses; msgspec encodes, and decodes with validation, in C.
- `msgspec/Struct`: the same layout with the messages as msgspec Structs.

Messages: a Sample of 16 trajectories x 1024 tokens (the MessageQueue's unit), a
GenerateRequest with a 512-token prompt, a Command. Reported: microseconds per
encode and per decode (decode input = the fields as Redis returns them, bytes),
the best of `--repeats` rounds, each round timing every case once in turn.

Run: ``python -m bench.bench_codec --out runs/bench_codec.json`` (~1 min).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import timeit
import types
import typing
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgpack
import msgspec

from bench import write_result
from shared.codec import Codec
from shared.schema import Command, CommandAction, FinishReason, GenerateRequest, Sample, Trajectory, encode

NUM_TRAJECTORIES = 16
RESPONSE_TOKENS = 1024
PROMPT_TOKENS = 512


def messages() -> dict[str, Any]:
    trajectories = [Trajectory(request_id=f"sample_0_7/{i}",
                               response_token_ids=list(range(i, i + RESPONSE_TOKENS)),
                               response_logprobs=[-0.5 - j * 1e-4 for j in range(RESPONSE_TOKENS)],
                               finish_reason=FinishReason.STOP, reward=1.0, min_version=3, max_version=4,
                               num_attempts=2, replica_ids=["hybrid_0", "standalone_1"],
                               generation_time_s=1.5)
                    for i in range(NUM_TRAJECTORIES)]
    return {
        "sample_16x1024": Sample(sample_id="sample_0_7", prompt_token_ids=list(range(PROMPT_TOKENS)),
                                 answer="42",
                                 trajectories=trajectories, enqueued_at=1.7e9),
        "generate_request": GenerateRequest(request_id="sample_0_7/3", sample_id="sample_0_7",
                                            prompt_token_ids=list(range(PROMPT_TOKENS)), max_tokens=1024,
                                            attempt=1),
        "command": Command(command_id="5f0c9e", action=CommandAction.UPDATE_WEIGHTS,
                           replica_ids=["standalone_0", "standalone_1"], version=7,
                           weights_path="/w/v000007"),
    }


# ---- the seed's hand-written codec (shared/schema.py before the switch), verbatim but for names ----

_ENUMS: dict[str, type[StrEnum]] = {"CommandAction": CommandAction, "FinishReason": FinishReason}


def _hand_is_scalar(f: dataclasses.Field[Any]) -> bool:
    return f.type in ("str", "int", "float", "bool") or f.type in _ENUMS


def hand_encode(message: Any) -> dict[Any, Any]:
    fields: dict[Any, Any] = {"type": message.type}
    payload: dict[str, Any] = {}
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if _hand_is_scalar(f):
            fields[f.name] = str(int(value)) if isinstance(value, bool) else str(value)
        else:
            payload[f.name] = _to_plain(value)
    if payload:
        fields["payload"] = msgpack.packb(payload, use_bin_type=True)
    return fields


def hand_decode(raw: dict[Any, Any], cls: type) -> Any:
    fields = {_text(k): v for k, v in raw.items()}
    payload = msgpack.unpackb(fields["payload"], raw=False) if "payload" in fields else {}
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if _hand_is_scalar(f):
            if f.name in fields:
                kwargs[f.name] = _parse_scalar(f, _text(fields[f.name]))
        elif f.name in payload:
            kwargs[f.name] = payload[f.name]
    if "trajectories" in kwargs:
        kwargs["trajectories"] = [Trajectory(**item) for item in kwargs["trajectories"]]
    return cls(**kwargs)


def _parse_scalar(f: dataclasses.Field[Any], text: str) -> Any:
    if f.type == "int":
        return int(text)
    if f.type == "float":
        return float(text)
    if f.type == "bool":
        return text in ("1", "True", "true")
    if f.type in _ENUMS:
        return _ENUMS[str(f.type)](text)
    return text


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        if not value or isinstance(value[0], str | int | float | bool):
            return value
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def checked(value: Any, hint: Any) -> None:
    """The payload check the hand-written codec lacks: every value against its type hint."""
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(value):
        hints = _hints(type(value))
        for f in dataclasses.fields(value):
            checked(getattr(value, f.name), hints[f.name])
    elif origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ValueError(f"expected a list, got {value!r}")
        for v in value:
            checked(v, item)
    elif origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        for k, v in value.items():
            checked(k, key_hint)
            checked(v, value_hint)
    elif isinstance(hint, type) and issubclass(hint, StrEnum):
        hint(value)  # ValueError when it is not one of the values
    elif hint is float:
        if type(value) not in (float, int):
            raise ValueError(f"expected a float, got {value!r}")
    elif isinstance(hint, type) and not isinstance(value, hint) and hint is not typing.Any:
        raise ValueError(f"expected {hint.__name__}, got {value!r}")


def hand_decode_checked(raw: dict[Any, Any], cls: type) -> Any:
    message = hand_decode(raw, cls)
    checked(message, cls)
    return message


# ---- the same layout with msgspec Structs ----

def as_struct(cls: type, namespace: dict[str, Any]) -> type:
    hints = typing.get_type_hints(cls)
    spec = [(f.name, _struct_hint(hints[f.name], namespace),
             msgspec.field(default=f.default) if f.default_factory is dataclasses.MISSING
             else msgspec.field(default_factory=f.default_factory)) for f in dataclasses.fields(cls)]
    struct = msgspec.defstruct(cls.__name__, spec, kw_only=True, frozen=True,
                               namespace={"type": getattr(cls, "type", "")})
    namespace[cls.__name__] = struct
    return struct


def _struct_hint(hint: Any, namespace: dict[str, Any]) -> Any:
    if typing.get_origin(hint) is list and typing.get_args(hint)[0] is Trajectory:
        return list[namespace["Trajectory"]]  # type: ignore[name-defined]
    return hint


class StructCodec:
    """shared.codec's layout over msgspec Structs: headers converted leniently, the payload strictly."""

    def __init__(self, cls: type) -> None:
        fields = msgspec.structs.fields(cls)
        self.cls = cls
        self.header = tuple(f.name for f in fields if _scalar(f.type))
        self.payload = tuple(f.name for f in fields if f.name not in self.header)
        self.header_type = msgspec.defstruct(cls.__name__ + "H", [(f.name, f.type, f.default if f.default
                                             is not msgspec.NODEFAULT else msgspec.NODEFAULT) for f in fields
                                             if f.name in self.header], kw_only=True)
        self.decoder = msgspec.msgpack.Decoder(msgspec.defstruct(cls.__name__ + "P", [
            (f.name, f.type, msgspec.field(default_factory=f.default_factory) if f.default_factory
             is not msgspec.NODEFAULT else f.default) for f in fields if f.name in self.payload],
             kw_only=True))
        self.encoder = msgspec.msgpack.Encoder()

    def encode(self, message: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {"type": message.type}
        for name in self.header:
            value = getattr(message, name)
            fields[name] = str(int(value)) if isinstance(value, bool) else str(value)
        fields["payload"] = self.encoder.encode({n: getattr(message, n) for n in self.payload})
        return fields

    def decode(self, raw: dict[Any, Any]) -> Any:
        fields = {_text(k): v for k, v in raw.items()}
        header = msgspec.convert({n: _text(fields[n]) for n in self.header if n in fields}, self.header_type,
                                 strict=False)
        payload = self.decoder.decode(fields["payload"])
        kwargs = {n: getattr(header, n) for n in self.header}
        kwargs.update((n, getattr(payload, n)) for n in self.payload)
        return self.cls(**kwargs)


def _scalar(hint: Any) -> bool:
    if isinstance(hint, types.UnionType):
        return all(a is type(None) or _scalar(a) for a in typing.get_args(hint))
    return hint in (str, int, float, bool) or (isinstance(hint, type) and issubclass(hint, StrEnum))


# ---- measuring ----

Case = tuple[str, str, str]
"""(message, variant, encode_us | decode_us)."""


def best_us(cases: dict[Case, Callable[[], Any]], repeats: int) -> dict[Case, float]:
    """Microseconds per call of each case, the best of `repeats` rounds. Each round times every case
    once, in turn, so a change of machine load hits all of them alike."""
    numbers = {key: timeit.Timer(fn).autorange()[0] for key, fn in cases.items()}
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeats):
        for key, fn in cases.items():
            best[key] = min(best[key], timeit.timeit(fn, number=numbers[key]) / numbers[key] * 1e6)
    return best


def as_redis(fields: dict[Any, Any]) -> dict[bytes, bytes]:
    return {_b(k): _b(v) for k, v in fields.items()}


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def run(repeats: int) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    as_struct(Trajectory, namespace)
    cases: dict[Case, Callable[[], Any]] = {}
    results: dict[str, Any] = {}
    for name, message in messages().items():
        cls = type(message)
        codec = Codec(cls)
        struct_cls = as_struct(cls, namespace)
        struct_codec = StructCodec(struct_cls)
        struct_message = msgspec.convert(msgspec.to_builtins(message), struct_cls)
        wire = as_redis(encode(message))
        assert as_redis(hand_encode(message)) == wire, "the wire format must not change, byte for byte"
        assert codec.decode(wire) == message == hand_decode(wire, cls)
        assert msgspec.to_builtins(struct_codec.decode(wire)) == msgspec.to_builtins(message)
        results[name] = {"wire_bytes": sum(len(k) + len(v) for k, v in wire.items())}
        cases.update({
            (name, "hand-written", "encode_us"): lambda m=message: hand_encode(m),
            (name, "hand-written", "decode_us"): lambda c=cls, w=wire: hand_decode(w, c),
            (name, "hand-written+check", "decode_us"): lambda c=cls, w=wire: hand_decode_checked(w, c),
            (name, "msgspec/dataclass", "encode_us"): lambda m=message, c=codec: c.encode(m),
            (name, "msgspec/dataclass", "decode_us"): lambda c=codec, w=wire: c.decode(w),
            (name, "msgspec/Struct", "encode_us"): lambda m=struct_message, c=struct_codec: c.encode(m),
            (name, "msgspec/Struct", "decode_us"): lambda c=struct_codec, w=wire: c.decode(w),
        })
    for (name, variant, op), us in best_us(cases, repeats).items():
        results[name].setdefault(variant, {})[op] = us
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5,
                        help="timing rounds (the best is kept)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    args = parser.parse_args(argv)
    result = run(args.repeats)
    for name, row in result.items():
        print(f"{name} ({row['wire_bytes']} bytes on the wire)")
        for variant, times in row.items():
            if isinstance(times, dict):
                print(f"  {variant:20s} " + "  ".join(f"{k} {v:9.1f}" for k, v in times.items()))
    write_result(args.out, {"messages": result})


if __name__ == "__main__":
    main()
