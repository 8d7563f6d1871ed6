"""Redis outages (real redis-server, real service processes driven by the launcher): every Redis call
retries for `run.redis_retry_window_s`. Redis SIGKILLed mid-run and started again on the same port
from its append-only file: the run finishes, every fed sample trained exactly once (per sample id).
Redis gone for longer than the window: the run fails with its outputs written, never a traceback.
Redis back without the run's state (no AOF): the run fails too, rather than starting again. The
launcher's own Redis hung for good (SIGSTOP): killed as hung and restarted from its file, the run finishes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from bench.live_run import live_config, wait_for
from services import launcher
from services.cli import main
from services.launcher import DUPLICATED, LOST
from shared.liveness import LIVENESS
from shared.names import AccountingField, Names, RunStateField, RunStatus, SampleState
from shared.redis_client import BACKOFF_CAP_S, STOP_RETRY_WINDOW_S, StopClock, connect
from shared.runtime import free_port
from tests.conftest import RedisServer

pytestmark = pytest.mark.e2e
SAMPLES = 256
OUTAGE_S = 2.5


def run_to_the_end(job: launcher.Job, timeout_s: float) -> None:
    wait_for(lambda: job.poll() is RunStatus.DONE, timeout_s=timeout_s, what="the run to finish")


def failed_summary(out: Path, *, flag: str, reason: str) -> dict[str, Any]:
    """The run's summary.json, checked to say failed, with `flag` set and `reason` in its reason."""
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert summary[RunStateField.STATUS] == RunStatus.FAILED and summary[flag] is True
    assert reason in summary[RunStateField.REASON]
    return summary


def kill_after_micro_steps(server: RedisServer, config: Path, micro_steps: int,
                           stop: threading.Event) -> None:
    """SIGKILL `server` once the run of `config` has trained `micro_steps` micro-steps (mid-run however
    fast the machine is), unless `stop` is set first."""
    names = Names(yaml.safe_load(config.read_text())["run"]["namespace"])
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        while not stop.wait(0.05):
            with contextlib.suppress(redis.RedisError):
                state = {str(k): str(v) for k, v in client.hgetall(names.trainer_state).items()}
                if launcher.micro_steps_done(state) >= micro_steps:
                    server.kill()
                    return
    finally:
        client.close()


def test_a_run_survives_redis_killed_mid_run_and_trains_every_sample_once(tmp_path: Path) -> None:
    server = RedisServer(workdir=tmp_path / "redis", appendonly=True)
    server.start()
    config = live_config(tmp_path, time_scale=0.02, total_rollout_steps=SAMPLES)
    try:
        with launcher.Job(config_path=config, out_dir=tmp_path / "run", redis_url=server.url) as job:
            wait_for(lambda: job.poll() and job.completed_micro_steps() >= 4, timeout_s=60,
                     what="4 micro-steps")
            server.kill()  # SIGKILL: no shutdown, no final fsync
            time.sleep(OUTAGE_S)
            server.start()  # same port, replays the append-only file
            run_to_the_end(job, timeout_s=120)
            summary = job.summary(wall_time_s=job.elapsed_s, admin={})
            states = job.read(job.names.sample_states)
            dead = job.redis.xrange(job.names.dead_letters)
    finally:
        server.stop()
    counts = summary["samples"]
    assert counts[AccountingField.FED] == SAMPLES and len(states) == SAMPLES
    assert set(states.values()) == {SampleState.TRAINED}, "every fed sample id is trained"
    assert counts[LOST] == 0 and counts[DUPLICATED] == 0
    assert dead == [], "nothing innocent is dead-lettered"
    assert summary["restarts"] == {}, "no service had to be restarted"


def test_the_launcher_restarts_its_own_redis_killed_mid_run_and_the_run_finishes(tmp_path: Path) -> None:
    config = live_config(tmp_path, time_scale=0.02, total_rollout_steps=SAMPLES)
    with launcher.Job(config_path=config, out_dir=tmp_path / "run") as job:
        wait_for(lambda: job.poll() and job.completed_micro_steps() >= 4, timeout_s=60, what="4 micro-steps")
        assert job.embedded is not None and job.embedded.proc is not None
        job.embedded.proc.kill()  # `dynsched run` without --redis-url: its own Redis dies
        run_to_the_end(job, timeout_s=120)
        summary = job.summary(wall_time_s=job.elapsed_s, admin={})
        states = job.read(job.names.sample_states)
    assert summary["redis_restarts"] == 1
    assert len(states) == SAMPLES and set(states.values()) == {SampleState.TRAINED}
    assert summary["samples"][LOST] == 0 and summary["samples"][DUPLICATED] == 0


def test_the_launcher_kills_and_restarts_its_own_redis_that_stops_answering_and_the_run_finishes(
        tmp_path: Path) -> None:
    config = live_config(tmp_path, time_scale=0.02, total_rollout_steps=SAMPLES)
    with launcher.Job(config_path=config, out_dir=tmp_path / "run") as job:
        assert job.embedded is not None and job.embedded.hung_after_s == 15.0, "half the 30 s retry window"
        wait_for(lambda: job.poll() and job.completed_micro_steps() >= 4, timeout_s=60, what="4 micro-steps")
        assert job.embedded is not None and job.embedded.proc is not None
        job.embedded.proc.send_signal(signal.SIGSTOP)  # hung for good: alive, answering nothing
        run_to_the_end(job, timeout_s=180)
        summary = job.summary(wall_time_s=job.elapsed_s, admin={})
        states = job.read(job.names.sample_states)
    assert summary["redis_hung_kills"] == 1 and summary["redis_restarts"] == 1
    assert len(states) == SAMPLES and set(states.values()) == {SampleState.TRAINED}
    assert summary["samples"][LOST] == 0 and summary["samples"][DUPLICATED] == 0


def test_redis_gone_for_longer_than_the_retry_window_fails_the_run_with_its_outputs_written(
        tmp_path: Path) -> None:
    server = RedisServer(workdir=tmp_path / "redis", appendonly=True)
    server.start()
    config = live_config(tmp_path, time_scale=0.02, run={"redis_retry_window_s": 2.0})
    out = tmp_path / "run"
    try:
        with pytest.raises(redis.ConnectionError), \
                launcher.Job(config_path=config, out_dir=out, redis_url=server.url) as job:
            wait_for(lambda: job.poll() and job.completed_micro_steps() >= 2, timeout_s=60,
                     what="2 micro-steps")

            def known_trained() -> int:  # what the launcher last read (every KNOWN_REFRESH_S)
                job.poll()
                return int(job.known.get(job.names.accounting, {}).get(AccountingField.TRAINED, 0))

            # a fixed sleep of KNOWN_REFRESH_S raced the launcher's refresh on a loaded machine
            wait_for(lambda: known_trained() >= 2 * 16, timeout_s=60, what="the launcher to read 32 trained")
            server.kill()
            run_to_the_end(job, timeout_s=60)
    finally:
        server.stop()
    summary = failed_summary(out, flag="redis_unreachable", reason="ConnectionError")
    assert summary["samples"][SampleState.TRAINED] >= 2 * 16, "the summary holds what the launcher knew"
    assert summary["micro_steps"] >= 2


def run_until_state_lost(tmp_path: Path, server: RedisServer, fault: Callable[[launcher.Job], None], *,
                         match: str) -> dict[str, Any]:
    """A run on `server` meets `fault` after 4 micro-steps and must end in RedisStateLost (`match`); its
    failed summary."""
    config = live_config(tmp_path, time_scale=0.02, total_rollout_steps=SAMPLES)
    out = tmp_path / "run"
    try:
        with pytest.raises(launcher.RedisStateLost, match=match), \
                launcher.Job(config_path=config, out_dir=out, redis_url=server.url) as job:
            wait_for(lambda: job.poll() and job.completed_micro_steps() >= 4, timeout_s=60,
                     what="4 micro-steps")
            fault(job)
            run_to_the_end(job, timeout_s=60)
    finally:
        server.stop()
    return failed_summary(out, flag="redis_state_lost", reason="RedisStateLost")


def test_redis_restarted_without_its_append_only_file_fails_the_run_instead_of_starting_it_again(
        tmp_path: Path) -> None:
    """A Redis that comes back empty (no AOF, a flush, evicted keys) holds none of the run: left alone,
    the services hung here (or, after a flush, started a new ledger); the launcher stops the run."""
    server = RedisServer(workdir=tmp_path / "redis", appendonly=False)
    server.start()
    summary = run_until_state_lost(tmp_path, server, lambda job: server.restart(),  # same port, nothing kept
                                   match="append-only file")
    assert summary["micro_steps"] >= 4, "the summary holds what the launcher knew before the loss"


def test_a_sample_ledger_deleted_by_hand_mid_run_fails_the_run_instead_of_leaving_it_waiting(
        tmp_path: Path) -> None:
    """`DEL dynsched:samples` with the run going: every sample then looked never queued to the trainer,
    which dead-lettered them all, and the run waited for good; the launcher now stops it with the reason."""
    server = RedisServer(workdir=tmp_path / "redis", appendonly=True)
    server.start()
    run_until_state_lost(tmp_path, server, lambda job: job.redis.delete(job.names.sample_states),
                         match="sample ledger")


def test_dynsched_run_with_redis_gone_for_good_ends_in_one_line_and_writes_its_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = RedisServer(workdir=tmp_path / "redis", appendonly=True)
    server.start()
    config = live_config(tmp_path, time_scale=0.02, run={"redis_retry_window_s": 2.0})
    out = tmp_path / "run"
    killed = threading.Event()
    killer = threading.Thread(target=kill_after_micro_steps, args=(server, config, 4, killed), daemon=True)
    killer.start()
    try:
        code = main(["run", "--config", str(config), "--redis-url", server.url, "--out", str(out),
                     "--no-progress"])
    finally:
        killed.set()
        killer.join(timeout=5)
        server.stop()
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("dynsched: error: Redis: ")
    failed_summary(out, flag="redis_unreachable", reason="ConnectionError")


async def test_a_redis_call_waits_out_an_outage_within_the_window_and_fails_after_it(tmp_path: Path) -> None:
    server = RedisServer(workdir=tmp_path / "redis", port=free_port())
    client = connect(server.url, retry_window_s=3.0)
    LIVENESS.enter("test.redis_waiter")
    try:
        started_s = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            await client.ping()  # nothing listens there yet
        assert 2.5 <= time.monotonic() - started_s < 6.0
        # the calling loop beat at every retry: waiting out the window is not a stuck loop
        assert LIVENESS.ages()["test.redis_waiter"] <= BACKOFF_CAP_S + 0.5
        later = asyncio.get_running_loop().run_in_executor(None, lambda: (time.sleep(1.0), server.start()))
        started_s = time.monotonic()
        assert await client.set("k", "v")  # Redis comes up 1 s into the window
        assert 0.9 <= time.monotonic() - started_s < 3.0
        await later
    finally:
        LIVENESS.leave("test.redis_waiter")
        await client.aclose()
        server.stop()


def test_once_the_process_stops_a_failing_call_retries_for_the_stop_window_only() -> None:
    stop = StopClock()
    assert stop.deadline_s(100.0, 30.0) == 130.0  # running: the whole window
    stop.since_s = 110.0
    assert stop.deadline_s(100.0, 30.0) == 110.0 + STOP_RETRY_WINDOW_S  # failing since before the stop
    assert stop.deadline_s(120.0, 30.0) == 120.0 + STOP_RETRY_WINDOW_S  # first failed after it
    assert stop.deadline_s(100.0, 1.0) == 101.0  # a window shorter than that stays as it was
