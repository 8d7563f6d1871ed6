"""The stream codec: typed fields survive the wire, and any malformed entry raises MalformedMessage only."""

from __future__ import annotations

import msgpack
import pytest

from shared.schema import (
    AuditEvent,
    AuditKind,
    Command,
    CommandAck,
    CommandAction,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    MalformedMessage,
    ReplicaReport,
    ReplicaState,
    RolloutReport,
    RoutingReport,
    WeightSyncReport,
    decode,
    encode,
)


def as_redis(fields: dict) -> dict[bytes, bytes]:
    """Fields as Redis returns them: every key and value bytes."""
    return {(k if isinstance(k, bytes) else k.encode()): (v if isinstance(v, bytes) else str(v).encode())
            for k, v in fields.items()}


def entry(**fields: object) -> dict[bytes, bytes]:
    return as_redis(fields)


def packed(payload: object) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)


def test_enum_fields_come_back_as_enum_members():
    command = decode(as_redis(encode(Command(command_id="c", action=CommandAction.ABORT))))
    assert isinstance(command, Command) and command.action is CommandAction.ABORT
    result = decode(as_redis(encode(GenerateResult(request_id="r", sample_id="s", replica_id="h",
                                                   token_ids=[1],
                                                   logprobs=[-0.5], finish_reason=FinishReason.LENGTH,
                                                   weight_version=2))))
    assert isinstance(result, GenerateResult) and result.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("report", [
    ReplicaReport(state=ReplicaState.PAUSED, version=3, duration_s=0.25),
    RoutingReport(members=["standalone_0", "hybrid_0"], loads={"standalone_0": 2, "hybrid_0": 0},
                  total_inflight=2,
                  waiting=1, changed=["hybrid_0"]),
    RolloutReport(max_concurrent_samples=32, metrics={"fully_async/rollouter/idle_ratio": 0.25}),
    WeightSyncReport(replica_ids=["standalone_0"], version=3, transport="gloo", pushed=True, ok=False,
                     error="ValueError: no", push_s=0.5),
], ids=lambda r: type(r).__name__)
def test_an_ack_carries_its_typed_report_across_the_wire(report):
    ack = CommandAck.answer(Command(command_id="c", action=CommandAction.ADD), sender="x", report=report)
    back = decode(as_redis(encode(ack)))
    assert back == ack
    assert report in (back.replica, back.routing, back.rollout, back.weights)


def test_audit_fields_that_do_not_apply_stay_off_the_wire_and_come_back_none():
    event = AuditEvent(kind=AuditKind.LB, subject="loadbalancer", t=1.5, alive=False,
                       replica_ids=["standalone_0"])
    fields = encode(event)
    assert fields["alive"] == "0" and "state" not in fields and "duration_s" not in fields
    back = decode(as_redis(fields))
    assert back == event and back.state is None and back.alive is False


def test_header_fields_are_readable_strings():
    fields = encode(Command(command_id="c", action=CommandAction.UPDATE_WEIGHTS, version=3))
    assert fields["action"] == CommandAction.UPDATE_WEIGHTS.value and fields["version"] == "3"


GOOD_REQUEST = dict(type="generate", request_id="r", sample_id="s", max_tokens="4",
                    payload=packed({"prompt_token_ids": [1, 2]}))


def with_(**changes: object) -> dict[bytes, bytes]:
    fields = {**GOOD_REQUEST, **changes}
    return entry(**{k: v for k, v in fields.items() if v is not None})


@pytest.mark.parametrize(("raw", "complaint"), [
    (entry(type=b"\xff"), "not valid UTF-8"),
    (with_(request_id=b"\xffoops"), "not valid UTF-8"),
    ({b"\xfftype": b"generate"}, "not valid UTF-8"),
    (entry(type="bogus"), "unknown message type 'bogus'"),
    (entry(), "unknown message type ''"),
    (with_(payload=packed(5)), "Expected `object`, got `int`"),
    (with_(payload=packed({"prompt_token_ids": ["1", "2"]})), "Expected `int`, got `str`"),
    (with_(payload=packed({"prompt_token_ids": 7})), "Expected `array`, got `int`"),
    (with_(payload=b"\xc1"), "payload is not valid msgpack"),
    (with_(payload=packed({"prompt_token_ids": [1]}) + b"extra"), "payload is not valid msgpack"),
    (with_(payload=None), "missing required field `prompt_token_ids`"),
    (with_(sample_id=None), "missing required field `sample_id`"),
    (with_(max_tokens="four"), "Expected `int`, got `str`"),
    (entry(type="command", command_id="c", action="explode"), "Invalid enum value 'explode'"),
    (entry(type="result", request_id="r", sample_id="s", replica_id="h", finish_reason="finished",
           weight_version="1",
           payload=packed({"token_ids": [], "logprobs": []})), "Invalid enum value 'finished'"),
    (entry(type="ack", command_id="c", sender="s", ok="maybe"), "Expected `bool`, got `str`"),
    (entry(type="ack", command_id="c", sender="s", ok="1", payload=packed({"routing": {"members": "h"}})),
     "Expected `array`, got `str`"),
    (entry(type="sample", sample_id="s", answer="", payload=packed({"prompt_token_ids": [], "trajectories": [
        {"request_id": "s/0", "response_token_ids": [1], "response_logprobs": ["x"],
         "finish_reason": "stop"}]})),
     "Expected `float`, got `str`"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_malformed_entry_raises_malformed_message_and_nothing_else(raw, complaint):
    with pytest.raises(MalformedMessage, match=complaint.replace("(", r"\(").replace(")", r"\)")):
        decode(raw)


def test_a_request_round_trips_exactly():
    request = GenerateRequest(request_id="r", sample_id="s", prompt_token_ids=list(range(300)), max_tokens=9,
                              attempt=2, replica_id="hybrid_1")
    assert decode(as_redis(encode(request))) == request
