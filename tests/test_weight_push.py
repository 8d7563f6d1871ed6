"""What a weight push sends each worker (shared/weight_transfer.py, services/trainer/weight_push.py)."""

from __future__ import annotations

import base64
import pickle

import pytest

from core.replica import ReplicaState, transition
from shared.weight_transfer import init_info_for, wire_safe


def test_each_replica_joins_the_group_after_the_trainer_and_the_replicas_before_it():
    info = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 9}
    offsets = [init_info_for(info, i, replica_world_size=4)["rank_offset"] for i in range(2)]
    assert offsets == [1, 5]
    assert init_info_for(info, 1, replica_world_size=4)["world_size"] == 9


def test_an_init_without_ranks_is_sent_unchanged():
    assert init_info_for({"packed": True}, 3, replica_world_size=2) == {"packed": True}


def test_ipc_handles_travel_pickled_and_other_payloads_untouched():
    handles = [{"GPU-1": (bytes(8), 3, ("tuple", 1.5))}]
    info = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2]], "ipc_handles": handles}
    safe = wire_safe(info)
    assert "ipc_handles" not in safe and safe["names"] == ["w"]
    assert pickle.loads(base64.b64decode(safe["ipc_handles_pickled"])) == handles
    nccl = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}
    assert wire_safe(nccl) is nccl


@pytest.mark.parametrize("state", list(ReplicaState))
@pytest.mark.parametrize("action", ["weights_init", "weights_start", "weights_update", "weights_finish"])
def test_push_steps_are_legal_in_every_replica_state_and_change_nothing(state, action):
    assert transition(state, action) is state
