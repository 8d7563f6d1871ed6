"""The wire schema round-trips every message and rejects malformed entries clearly; the config
rejects wrong keys, types and values with the offending key in the message."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from shared.config import config_from_dict, load_config
from shared.schema import (
    Command,
    CommandAck,
    CommandAction,
    CycleMetrics,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    MalformedMessage,
    Sample,
    TrainerAction,
    TrainerEvent,
    TrainerPhase,
    TrainerReply,
    Trajectory,
    WeightSyncReport,
    decode,
    encode,
)


def as_redis(fields: dict) -> dict[bytes, bytes]:
    return {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in fields.items()}


MESSAGES = [
    Sample(sample_id="sample_0_1", prompt_token_ids=[1, 2], answer="3", enqueued_at=1.5, trajectories=[
        Trajectory(request_id="sample_0_1/0", response_token_ids=[4, 5], response_logprobs=[-0.1, -0.2],
                   finish_reason=FinishReason.STOP, reward=1.0, min_version=2, max_version=3, num_attempts=2,
                   replica_ids=["hybrid_0", "standalone_0"])]),
    GenerateRequest(request_id="r/0", sample_id="r", prompt_token_ids=list(range(100)), max_tokens=7,
                    attempt=2),
    GenerateResult(request_id="r/0", sample_id="r", replica_id="h", token_ids=[1], logprobs=[-1.0],
                   finish_reason=FinishReason.ABORT, weight_version=4, attempt=1),
    Command(command_id="c", action=CommandAction.UPDATE_WEIGHTS, replica_ids=["a", "b"], version=3,
            weights_path="/w"),
    Command(command_id="p", action=CommandAction.WEIGHTS_UPDATE, version=3,
            data={"names": ["lm_head.weight"], "dtype_names": ["float32"], "shapes": [[32, 128]]}),
    CommandAck(command_id="c", sender="a", ok=False, error="nope"),
    CommandAck(command_id="c", sender="trainer", ok=True,
               weights=WeightSyncReport(replica_ids=["standalone_0"], version=3, transport="gloo",
                                        pushed=True)),
    TrainerEvent(phase=TrainerPhase.MICRO_STEP_DONE, global_steps=4, version=1, stats={"timing_s/step": 1.0}),
    TrainerEvent(phase=TrainerPhase.COLLECTED, global_steps=4, version=1, wait_time_s=0.5, wait_samples=3),
    TrainerReply(action=TrainerAction.SYNC_DONE, global_steps=4, activated=True, param_sync_s=1.5),
    TrainerReply(action=TrainerAction.GPUS_READY, global_steps=4, wait_for_enough_samples_s=0.25),
    CycleMetrics(version=1, global_steps=4, t=2.0, metrics={"dynamic_resource/mq_size": 3.0}),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_stream_fields(message):
    assert decode(as_redis(encode(message))) == message


def test_header_fields_stay_readable_strings_for_redis_cli():
    fields = encode(MESSAGES[1])
    assert fields["type"] == "generate" and fields["request_id"] == "r/0" and fields["max_tokens"] == "7"


@pytest.mark.parametrize(("fields", "complaint"), [
    ({"type": "bogus"}, "unknown message type"),
    ({"type": "generate", "request_id": "x"}, "missing"),
    ({"type": "ack", "command_id": "c", "sender": "s", "ok": "1", "payload": b"\xc1"}, "msgpack"),
    ({"type": "trainer_reply", "action": "sync_done", "global_steps": "four"},
     "Expected `int`, got `str` - at `.*global_steps`"),
    ({"type": "sample", "sample_id": "s", "answer": "",
      "payload": msgpack.packb({"prompt_token_ids": [], "trajectories": [{"nope": 1}]})},
      "missing required field `request_id` - at `.*trajectories.0.`"),
])
def test_malformed_entries_raise_a_clear_malformed_message(fields, complaint):
    with pytest.raises(MalformedMessage, match=complaint):
        decode(as_redis(fields))


def minimal(**overrides: dict) -> dict:
    config = {"data": {"total_rollout_steps": 8}, "trainer": {"ppo_mini_batch_size": 2}}
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    return config


@pytest.mark.parametrize(("overrides", "complaint"), [
    ({"trainer": {"bogus": 1}}, "unknown key.*trainer.bogus"),
    ({"data": {"total_rollout_steps": "many"}}, "data.total_rollout_steps='many' is invalid: expected int"),
    ({"async_training": {"dynamic_schedule_deactivate_ratio": 1.5}}, "deactivate_ratio=1.5"),
    ({"async_training": {"staleness_threshold": -1}}, "staleness_threshold=-1"),
    ({"rollout": {"backend": "tgi"}}, "rollout.backend='tgi'"),
    ({"rollout": {"nnodes": 0}}, "colocated mode"),
    ({"rollout": {"backend": "vllm"}}, "trainer.model_dir"),
    ({"trainer": {"use_dynamic_resource_scheduling": True}}, "unknown key"),
    ({"rollout": {"standalone_weight_transport": "ipc"}}, "standalone_weight_transport='ipc'"),
    ({"rollout": {"hybrid_weight_transport": "nccl"}}, "hybrid_weight_transport='nccl'"),
    ({"rollout": {"standalone_weight_transport": "gloo"}}, "'filesystem' unless rollout.backend is vllm"),
])
def test_bad_config_values_name_the_key_and_the_value(overrides, complaint):
    with pytest.raises(ValueError, match=complaint):
        config_from_dict(minimal(**overrides))


def test_hybrid_replicas_come_from_trainer_gpus_only_with_dynamic_scheduling():
    static = config_from_dict(minimal(trainer={"num_gpus": 16}))
    dynamic = config_from_dict(minimal(trainer={"num_gpus": 16},
                                       async_training={"use_dynamic_resource_scheduling": True}))
    assert static.hybrid_ids == ()
    assert dynamic.hybrid_ids == ("hybrid_0", "hybrid_1")
    assert dynamic.standalone_ids == ("standalone_0",)


def test_each_replica_gets_the_weight_transport_of_its_kind():
    config = config_from_dict(minimal(
        trainer={"num_gpus": 8, "backend": "torch", "model_dir": "m"},
        async_training={"use_dynamic_resource_scheduling": True},
        rollout={"backend": "vllm", "standalone_weight_transport": "nccl", "hybrid_weight_transport": "ipc"}))
    assert config.weight_transport("standalone_0") == "nccl"
    assert config.weight_transport("hybrid_0") == "ipc"


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_shipped_config_loads_and_validates(path):
    config = load_config(path)
    assert config.standalone_ids or config.hybrid_ids
