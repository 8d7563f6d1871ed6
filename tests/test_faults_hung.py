"""The launcher kills a hung service (real processes, `dynsched run`'s Job): a service SIGSTOPped
mid-run never exits, its health report (shared/health.py) goes missing, and once it has been missing
for `run.hung_grace_s` the launcher SIGKILLs it and restarts it through the crash path; the run
finishes with nothing lost. The pure decision (`HangWatch`) is tested with a fake clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from bench.live_run import live_config, wait_for
from services import launcher
from services.launcher import DUPLICATED, LOST
from services.restarts import BLIND_S, HangWatch
from shared.config import load_config
from shared.health import judge
from shared.names import HEALTH_TTL_S, AccountingField, Names, RunStatus, SampleState, worker_process_name
from tests.conftest import RedisServer

SAMPLES = 256
MISSING = judge(None, key="ns:health:x", stale_after_s=120.0)
BLOCKING_WORKER = """
import sys, time
import services.rollout_worker.__main__ as worker
from services.rollout_worker.sim_engine import SimEngine

class BlockingStart(SimEngine):
    async def start(self) -> None:
        time.sleep(600)  # as vLLM's engine start: the event loop, its health loop with it, stalls

worker.build_engine = lambda config, replica_id: BlockingStart(config=config, hybrid=False)
worker.main(sys.argv[1:])
"""


@pytest.mark.e2e
@pytest.mark.parametrize("service", ["loadbalancer", "rollouter"])
def test_a_service_sigstopped_mid_run_is_killed_as_hung_and_restarted_and_nothing_is_lost(
        service: str, tmp_path: Path) -> None:
    config = live_config(tmp_path, time_scale=0.02, total_rollout_steps=SAMPLES, run={"hung_grace_s": 1.0})
    with launcher.Job(config_path=config, out_dir=tmp_path / "run") as job:
        wait_for(lambda: job.poll() and job.completed_micro_steps() >= 4, timeout_s=60, what="4 micro-steps")
        stopped = job.procs[service]
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_for(lambda: job.poll() is RunStatus.DONE, timeout_s=120, what="the run to finish", job=job)
        summary = job.summary(wall_time_s=job.elapsed_s, admin={})
        states = job.read(job.names.sample_states)
    assert stopped.returncode == -signal.SIGKILL, "killed by the launcher, not stopped at the end"
    assert summary[launcher.RunStateField.STATUS] == RunStatus.DONE
    assert summary["hung_kills"] == {service: 1} and summary["restarts"] == {service: 1}
    counts = summary["samples"]
    assert counts[AccountingField.FED] == SAMPLES and set(states.values()) == {SampleState.TRAINED}
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0
    log = (tmp_path / "run" / "logs" / f"{service}.log").read_text()
    assert "killed by the launcher as hung: no health report" in log
    assert "restarted by the launcher (restart 1)" in log


def test_a_worker_whose_engine_start_blocks_its_event_loop_keeps_a_healthy_report(
        redis_server: RedisServer, tmp_path: Path) -> None:
    config = live_config(tmp_path, time_scale=0.02)
    key = Names(load_config(config).run.namespace).health(worker_process_name(["standalone_0"]))
    starting = subprocess.Popen([sys.executable, "-c", BLOCKING_WORKER, "--config", str(config),
                                 "--redis-url", redis_server.url, "--replica-id", "standalone_0"])
    try:
        with redis.Redis.from_url(redis_server.url) as client:
            wait_for(lambda: client.exists(key) or starting.poll() is not None, timeout_s=30,
                     what="the worker's first health report")
            time.sleep(HEALTH_TTL_S + 2)  # longer than one report lives: it has been renewed
            assert starting.poll() is None
            assert judge(client.get(key), key=key, stale_after_s=120.0) == ""
    finally:
        starting.kill()
        starting.wait()


def test_a_child_is_not_judged_before_its_first_health_report() -> None:
    watch = HangWatch(grace_s=1.0)
    assert not any(watch.hung(now_s=t, present=False, problem=MISSING) for t in (0.0, 5.0, 9.0)), \
        "a slow start-up (a vLLM engine loading) is never a hang"


def test_a_child_is_hung_once_its_report_has_been_missing_for_longer_than_the_grace() -> None:
    watch = HangWatch(grace_s=1.0)
    assert not watch.hung(now_s=0.0, present=True, problem="")
    assert not watch.hung(now_s=1.0, present=False, problem=MISSING)
    assert not watch.hung(now_s=2.0, present=False, problem=MISSING), "missing for exactly the grace"
    assert watch.hung(now_s=2.1, present=False, problem=MISSING)


def test_a_report_that_recovers_within_the_grace_starts_the_grace_afresh() -> None:
    watch = HangWatch(grace_s=1.0)
    stale = "stale loops (no progress for more than 120s): rollouter.feed 130s"
    assert not watch.hung(now_s=0.0, present=True, problem=stale)
    assert not watch.hung(now_s=0.9, present=True, problem="")
    assert not watch.hung(now_s=1.5, present=True, problem=stale)
    assert watch.hung(now_s=2.6, present=True, problem=stale)


def test_time_the_watcher_could_not_look_does_not_count_against_the_child() -> None:
    # a Redis outage blocks the launcher's reads and expires every health key meanwhile
    watch = HangWatch(grace_s=1.0)
    assert not watch.hung(now_s=0.0, present=True, problem="")
    assert not watch.hung(now_s=0.5, present=False, problem=MISSING)
    assert not watch.hung(now_s=0.5 + BLIND_S + 1, present=False, problem=MISSING)
    assert watch.hung(now_s=0.5 + BLIND_S + 2.1, present=False, problem=MISSING)


def test_the_health_judge_names_stale_loops_and_refuses_an_unreadable_report() -> None:
    assert judge(b'{"lb.route": 0.5}', key="k", stale_after_s=10.0) == ""
    assert "lb.route 12s" in judge(b'{"lb.route": 12.0, "lb.watch": 1.0}', key="k", stale_after_s=10.0)
    assert judge(b"[1, 2]", key="k", stale_after_s=10.0).startswith("unreadable health report at k")


def test_a_hang_grace_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="grace_s must be > 0, got 0"):
        HangWatch(grace_s=0)
