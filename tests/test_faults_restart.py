"""The launcher restarts a crashed service (real processes, `dynsched run`'s Job): a SIGKILLed service
is started again after a backoff and the run finishes with nothing lost; a service that keeps
crashing fails the run with one line naming it and its log."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.live_run import live_config, wait_for
from services import launcher
from services.launcher import DUPLICATED, LOST
from services.restarts import RestartBudget
from shared.names import AccountingField, RunStatus, SampleState

SAMPLES = 256


@dataclass(frozen=True)
class SignalledRun:
    summary: dict[str, Any]
    states: dict[str, str]
    signalled: dict[str, subprocess.Popen[bytes]]
    """The processes that got the signal, by service name."""
    pids_after: dict[str, int]
    """The same services' processes at the end of the run."""


def signal_mid_run(tmp_path: Path, names: tuple[str, ...], sig: int) -> SignalledRun:
    """A launcher run of SAMPLES prompts whose `names` services get `sig` at once after 4 micro-steps."""
    config = live_config(tmp_path, time_scale=0.02, total_rollout_steps=SAMPLES)
    with launcher.Job(config_path=config, out_dir=tmp_path / "run") as job:
        wait_for(lambda: job.poll() and job.completed_micro_steps() >= 4, timeout_s=60, what="4 micro-steps")
        signalled = {name: job.procs[name] for name in names}
        for proc in signalled.values():
            proc.send_signal(sig)
        wait_for(lambda: job.poll() is RunStatus.DONE, timeout_s=120, what="the run to finish", job=job)
        return SignalledRun(summary=job.summary(wall_time_s=job.elapsed_s, admin={}),
                            states=job.read(job.names.sample_states), signalled=signalled,
                            pids_after={name: job.procs[name].pid for name in names})


@pytest.mark.e2e
def test_services_sigkilled_mid_run_are_restarted_and_the_run_finishes_with_nothing_lost(
        tmp_path: Path) -> None:
    run = signal_mid_run(tmp_path, ("trainer", "rollouter", "rollout_worker-standalone_0"), signal.SIGKILL)
    killed = {name: proc.pid for name, proc in run.signalled.items()}
    assert run.summary["restarts"] == dict.fromkeys(killed, 1)
    assert all(run.pids_after[name] != pid for name, pid in killed.items()), \
        "each killed service runs as a new process"
    counts = run.summary["samples"]
    assert counts[AccountingField.FED] == SAMPLES and set(run.states.values()) == {SampleState.TRAINED}
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0
    log = (tmp_path / "run" / "logs" / "trainer.log").read_text()
    assert "restarted by the launcher (restart 1)" in log


def test_a_restart_waits_longer_after_each_crash_and_the_budget_runs_out_within_a_minute() -> None:
    budget = RestartBudget(max_per_minute=3)
    delays = [budget.take(now_s=t) for t in (0.0, 1.0, 2.0)]
    assert delays == sorted(delays) and delays[0] is not None and delays[0] < delays[2]  # type: ignore[operator]
    assert budget.take(now_s=3.0) is None, "a 4th crash within a minute fails the run"
    assert budget.take(now_s=70.0) is not None, "a minute later the budget is back"


def test_restarts_can_be_switched_off() -> None:
    assert RestartBudget(max_per_minute=0).take(now_s=0.0) is None


@pytest.mark.e2e
def test_services_stopped_with_sigterm_mid_run_are_restarted_and_the_run_finishes_with_nothing_lost(
        tmp_path: Path) -> None:
    # `kill PID` (SIGTERM) stops a service cleanly, exit status 0; before the run is done that is still a
    # service gone, and a run waiting for it would never finish
    run = signal_mid_run(tmp_path, ("trainer", "controller", "rollout_worker-hybrid_0"), signal.SIGTERM)
    assert all(proc.returncode == 0 for proc in run.signalled.values()), "each stopped cleanly"
    assert run.summary["restarts"] == dict.fromkeys(run.signalled, 1)
    counts = run.summary["samples"]
    assert counts[AccountingField.FED] == SAMPLES and counts[LOST] == 0 and counts[DUPLICATED] == 0
