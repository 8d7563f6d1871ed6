"""Kills inside a switch (real processes, `dynsched run`'s Job), in the seed's order and with the fast
mechanics (the hybrid sync folded into the standalones', the trainer's offload beside the hybrids' wake
and its onload beside their sleep): the trainer and a hybrid worker SIGKILLed at once inside an
activation (wake acked, weight sync in progress) or a deactivation (abort acked, sleep in progress) are
restarted, no other service stops, and the run finishes with every fed sample trained once.

The activation case stopped the controller before the fix: the restarted hybrid came back asleep and
refused the activation's weight sync and resume (a worker now takes up the state it last published).
The chaos bench draws such kills at random (`python -m bench.chaos --policy adaptive --set ...`); here
the switch is slowed (wake, sleep, weight sync and offload 25 modelled s = 0.5 wall s) so the kill lands
inside it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from bench.live_run import live_config, wait_for
from services import launcher
from services.launcher import DUPLICATED, LOST
from shared.names import AccountingField, RunStatus, SampleState
from shared.vocab import ReplicaState

pytestmark = pytest.mark.e2e
SAMPLES = 256
SLOW_SWITCH_S = 25.0
SLOW_SWITCHES = {"rollout.sim.wake_s": SLOW_SWITCH_S, "rollout.sim.sleep_s": SLOW_SWITCH_S,
                 "rollout.sim.weight_sync_s": SLOW_SWITCH_S, "trainer.offload_s": SLOW_SWITCH_S}
MECHANICS = {
    "fast": {"async_training.dynamic_schedule_fold_hybrid_sync": True,
             "async_training.dynamic_schedule_overlap_wake": True,
             "async_training.dynamic_schedule_overlap_sleep": True},
    "seed_order": {},
}


def wait_for_hybrid_leaving(job: launcher.Job, leaving: ReplicaState, *, timeout_s: float) -> None:
    """Poll hybrid_0's published state until it turns paused right after `leaving` (a state is
    published once its command is done: after sleeping, the wake is done and the folded sync runs;
    after serving, the abort is done and the sleep with the trainer's onload runs)."""
    deadline_s, previous = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline_s:
        state = job.read(job.names.replica_states).get("hybrid_0", "").split(":")[0]
        if state == ReplicaState.PAUSED and previous == leaving:
            return
        previous = state or previous
        assert job.poll() in (None, RunStatus.RUNNING), "the run ended before the switch was seen"
        time.sleep(0.01)
    raise AssertionError(f"hybrid_0 never turned paused after {leaving} within {timeout_s:.0f}s")


@pytest.mark.parametrize("mechanics", MECHANICS)
@pytest.mark.parametrize("leaving", [ReplicaState.SLEEPING, ReplicaState.SERVING],
                         ids=["activation", "deactivation"])
def test_the_trainer_and_a_hybrid_killed_inside_a_switch_are_restarted_and_lose_and_duplicate_nothing(
        tmp_path: Path, leaving: ReplicaState, mechanics: str) -> None:
    config = live_config(tmp_path, time_scale=0.02, total_rollout_steps=SAMPLES,
                         changes={**SLOW_SWITCHES, **MECHANICS[mechanics]})
    with launcher.Job(config_path=config, out_dir=tmp_path / "run") as job:
        wait_for(lambda: job.poll() and job.completed_micro_steps() >= 4, timeout_s=60, what="4 micro-steps")
        wait_for_hybrid_leaving(job, leaving, timeout_s=60)
        names = ("trainer", "rollout_worker-hybrid_0")
        for name in names:
            os.kill(job.procs[name].pid, signal.SIGKILL)
        wait_for(lambda: job.poll() is RunStatus.DONE, timeout_s=120, what="the run to finish", job=job)
        summary = job.summary(wall_time_s=job.elapsed_s, admin={})
        states = job.read(job.names.sample_states)
    assert summary["restarts"] == dict.fromkeys(names, 1)
    counts = summary["samples"]
    assert counts[AccountingField.FED] == SAMPLES and set(states.values()) == {SampleState.TRAINED}
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0
