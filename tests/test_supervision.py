"""Supervised loops and liveness, as a restart policy and a healthcheck see them (real processes,
real Redis): a process whose loop fails exits non-zero within seconds, also when another loop will
not cancel; a hung process and a stuck loop are reported unhealthy by `python -m shared.health`, and
a stuck loop makes the controller's /healthz answer 503; a process whose loop is stuck (a blocking call on
its event loop, a wait that never beats) exits non-zero by itself, while one whose loops wait on stream
reads or on a live peer (or whose start-up blocks, or that was stopped) for longer than that budget
keeps running."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from services.controller.admin import PrometheusExporter, build_app
from services.controller.service import Controller
from services.processes import service_specs
from shared.bus import Bus
from shared.config import config_to_dict, load_config
from shared.health import main as health_main
from shared.liveness import LIVENESS
from shared.names import HEALTH_TTL_S, Names
from shared.redis_client import STOP_RETRY_WINDOW_S
from shared.runtime import EXIT_GRACE_S, STUCK_POLL_S, THREAD_BEAT_S, in_thread
from shared.streams import connect
from tests.conftest import RedisServer
from tests.stack import sim_config

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 20.0
STALE_S, GRACE_S = 3.0, 1.0
"""A small stuck-loop budget (run.loop_stale_s + run.hung_grace_s = 4 s), above a stream read's 2 s block."""
BUDGET_S = STALE_S + GRACE_S
LB_LOOPS = frozenset({"loadbalancer.route", "loadbalancer.relay", "loadbalancer.watch",
                      "loadbalancer.commands", "loadbalancer.health"})


def write_config(tmp_path: Path, **run: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(sim_config(run={"namespace": "sup", **run}))))
    return path


def spawn(module: str, config: Path, redis_url: str, log: Path) -> subprocess.Popen[bytes]:
    return spawn_python(["-m", module, "--config", str(config), "--redis-url", redis_url], log)


def spawn_python(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`python ARGV` from the repository root, its output (stdout and stderr) to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})


def wait_for_health_key(client: redis.Redis, names: Names, service: str,
                        loops: frozenset[str] = frozenset()) -> dict[str, float]:
    """The service's first health report that names every one of `loops` (its loops are running)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        raw = client.get(names.health(service))
        if raw is not None and loops <= set(json.loads(raw)) and json.loads(raw):
            return dict(json.loads(raw))
        time.sleep(0.1)
    raise TimeoutError(f"{service} published no health report naming {sorted(loops)} "
                       f"within {START_TIMEOUT_S}s")


def exit_code_within(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, float]:
    started = time.monotonic()
    try:
        return proc.wait(timeout=timeout_s), time.monotonic() - started
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {timeout_s}s after its loop failed") from None


def test_a_load_balancer_whose_loop_fails_exits_non_zero_within_seconds(redis_server: RedisServer,
                                                                       tmp_path: Path) -> None:
    config, names = write_config(tmp_path), Names("sup")
    log = tmp_path / "lb.log"
    proc = spawn("services.loadbalancer", config, redis_server.url, log)
    with redis.Redis.from_url(redis_server.url) as client:
        wait_for_health_key(client, names, "loadbalancer", LB_LOOPS)
        client.delete(names.lb_requests)
        client.set(names.lb_requests, b"not a stream")  # every read of the route loop now raises WRONGTYPE
    code, took_s = exit_code_within(proc, timeout_s=EXIT_GRACE_S + 10)
    assert code != 0 and took_s < EXIT_GRACE_S + 5
    assert "loop loadbalancer.route failed" in log.read_text()


def test_a_process_whose_other_loop_will_not_cancel_still_exits_within_the_grace(redis_server: RedisServer,
                                                                                tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio
        from shared.config import RunConfig
        from shared.names import Names
        from shared.runtime import run_until_stopped, supervise

        async def fails():
            await asyncio.sleep(0.5)
            raise RuntimeError("boom")

        async def will_not_cancel():
            while True:
                try:
                    await asyncio.sleep(1)
                except asyncio.CancelledError:
                    pass  # the hang the issue saw in the load balancer's shutdown

        async def body(bus, stop):
            await supervise({{"stub.fails": fails(), "stub.stubborn": will_not_cancel()}})

        run_until_stopped(body, redis_url={redis_server.url!r}, names=Names("sup"), service="stub",
                          run=RunConfig())
    """))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    code, took_s = exit_code_within(proc, timeout_s=EXIT_GRACE_S + 15)
    assert code == 1 and took_s < EXIT_GRACE_S + 8
    assert proc.stderr is not None and b"exiting with status 1" in proc.stderr.read()


def test_a_service_cut_off_from_redis_past_its_retries_exits_non_zero(redis_server: RedisServer,
                                                                     tmp_path: Path) -> None:
    config, names = write_config(tmp_path), Names("sup")
    proc = spawn("services.rollouter", config, redis_server.url, tmp_path / "rollouter.log")
    with redis.Redis.from_url(redis_server.url) as client:
        wait_for_health_key(client, names, "rollouter")
    redis_server.kill()  # and it never comes back
    code, _ = exit_code_within(proc, timeout_s=100)
    assert code != 0


@pytest.mark.parametrize("service", ["rollouter", "controller", "loadbalancer", "trainer",
                                     "rollout_worker-standalone_0"])
def test_a_service_stopped_while_redis_is_gone_exits_within_seconds_not_after_its_retry_window(
        service: str, redis_server: RedisServer, tmp_path: Path) -> None:
    config, names = write_config(tmp_path, redis_retry_window_s=60.0), Names("sup")
    spec = next(s for s in service_specs(load_config(config)) if s.name == service)
    log = tmp_path / f"{service}.log"
    proc = spawn_python(["-m", spec.module, "--config", str(config), "--redis-url", redis_server.url,
                         *spec.extra_args], log)
    with redis.Redis.from_url(redis_server.url) as client:
        wait_for_health_key(client, names, spec.health_name or spec.name)
    redis_server.kill()  # an orphan's case: the launcher and its Redis died together
    time.sleep(1.0)  # its calls now fail and retry
    proc.send_signal(signal.SIGTERM)
    _, took_s = exit_code_within(proc, timeout_s=90)
    assert took_s < STOP_RETRY_WINDOW_S + 5, log.read_text()[-2000:]


def test_the_health_check_passes_a_live_service_and_fails_a_hung_one(
        redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, names = write_config(tmp_path), Names("sup")
    proc = spawn("services.loadbalancer", config, redis_server.url, tmp_path / "lb.log")
    argv = ["--config", str(config), "--redis-url", redis_server.url, "loadbalancer"]
    try:
        with redis.Redis.from_url(redis_server.url) as client:
            wait_for_health_key(client, names, "loadbalancer", LB_LOOPS)
        assert health_main(argv) == 0
        proc.send_signal(signal.SIGSTOP)  # hung: alive to the kernel, no loop moves
        deadline = time.monotonic() + HEALTH_TTL_S + 5
        while health_main(argv) == 0:
            assert time.monotonic() < deadline, "a hung process still reported healthy"
            time.sleep(0.5)
        assert "no health report" in capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait()


def test_the_health_check_names_a_stale_loop(redis_server: RedisServer, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    config, names = write_config(tmp_path, loop_stale_s=30.0), Names("sup")
    with redis.Redis.from_url(redis_server.url) as client:
        ages = {"trainer.cycle": 45.0, "trainer.commands": 0.2}
        client.set(names.health("trainer"), json.dumps(ages), ex=10)
    assert health_main(["--config", str(config), "--redis-url", redis_server.url, "trainer"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stale loops" in err and "trainer.cycle 45s" in err
    assert "trainer.commands" not in err


async def test_the_controllers_healthz_is_503_naming_a_loop_that_made_no_progress(
        redis_server: RedisServer) -> None:
    config = sim_config(run={"namespace": "sup", "loop_stale_s": 5.0})
    bus = Bus(connect(redis_server.url), Names("sup"))
    app = build_app(Controller(bus=bus, config=config), PrometheusExporter())
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            LIVENESS.enter("test.stuck")
            assert (await client.get("/healthz")).status_code == 200
            LIVENESS.beats["test.stuck"] -= 6.0  # its last beat, 6 s ago
            stale = await client.get("/healthz")
            assert stale.status_code == 503 and stale.json()["stale"] == ["test.stuck"]
            assert stale.json()["redis"] is True
            LIVENESS.leave("test.stuck")  # a loop that returned is not stale
            assert (await client.get("/healthz")).status_code == 200
    finally:
        LIVENESS.leave("test.stuck")
        await bus.redis.aclose()


async def test_a_loop_waiting_on_a_long_worker_thread_keeps_beating() -> None:
    """A training step longer than `run.loop_stale_s` is work, not a hang: the loop waiting on it beats."""

    async def loop_waiting_on(wait: Callable[..., Awaitable[object]]) -> float:
        LIVENESS.enter("thread_waiter")
        oldest = 0.0
        waiting = asyncio.ensure_future(wait(time.sleep, 3 * THREAD_BEAT_S))
        while not waiting.done():
            oldest = max(oldest, LIVENESS.ages().get("thread_waiter", 0.0))
            await asyncio.sleep(0.1)
        await waiting
        LIVENESS.leave("thread_waiter")
        return oldest

    assert await asyncio.create_task(loop_waiting_on(in_thread)) < 2 * THREAD_BEAT_S
    assert await asyncio.create_task(loop_waiting_on(asyncio.to_thread)) > 2.5 * THREAD_BEAT_S  # no beats


STUCK_LB = """
import asyncio, pathlib, sys, time
from services.loadbalancer import __main__ as lb_main
from services.loadbalancer.service import LoadBalancer

flag, how = pathlib.Path(sys.argv[1]), sys.argv[2]
dispatch = LoadBalancer._dispatch_waiting

async def dispatch_unless_flagged(self, sub):  # fault injection: the route loop gets stuck
    if flag.exists():
        if how == "blocks":
            time.sleep(3600)  # a blocking call on the event loop: no loop moves
        await asyncio.Event().wait()  # a wait that never ends and never beats: only this loop stops
    await dispatch(self, sub)

LoadBalancer._dispatch_waiting = dispatch_unless_flagged
lb_main.main(sys.argv[3:])
"""


@pytest.mark.parametrize("how", ["blocks", "awaits"])
def test_a_load_balancer_whose_route_loop_gets_stuck_exits_non_zero_within_its_budget(
        how: str, redis_server: RedisServer, tmp_path: Path) -> None:
    config, names = write_config(tmp_path, loop_stale_s=STALE_S, hung_grace_s=GRACE_S), Names("sup")
    script, flag, log = tmp_path / "stuck_lb.py", tmp_path / "stuck", tmp_path / "lb.log"
    script.write_text(STUCK_LB)
    proc = spawn_python([str(script), str(flag), how, "--config", str(config),
                         "--redis-url", redis_server.url], log)
    with redis.Redis.from_url(redis_server.url) as client:
        wait_for_health_key(client, names, "loadbalancer", LB_LOOPS)
    flag.touch()
    code, took_s = exit_code_within(proc, timeout_s=BUDGET_S + 20)
    assert code == 1 and BUDGET_S - 1 < took_s < BUDGET_S + STUCK_POLL_S + 4
    stuck = [line for line in log.read_text().splitlines() if "is stuck" in line]
    assert len(stuck) == 1 and "service loadbalancer is stuck: no progress in loadbalancer." in stuck[0]
    if how == "blocks":  # every loop stops; the one to blame is the task the event loop is running
        assert "the event loop runs task loadbalancer.route at " in stuck[0]
        sleep_line = 1 + next(n for n, line in enumerate(STUCK_LB.splitlines()) if "time.sleep(" in line)
        assert f"stuck_lb.py:{sleep_line} (dispatch_unless_flagged)" in stuck[0]
    else:  # the event loop is free: the other loops go on beating, only route is named
        assert "no progress in loadbalancer.route " in stuck[0] and "loadbalancer.relay" not in stuck[0]
        # Usually idle when sampled; it may be caught running another loop's step (a heartbeat's
        # write), never the stuck route loop, which is parked in its await.
        assert "the event loop runs no task" in stuck[0] or "the event loop runs task " in stuck[0]
        assert "the event loop runs task loadbalancer.route " not in stuck[0]


PEER_WAITER = """
import sys, time
from shared.config import RunConfig
from shared.names import Names
from shared.rpc import CommandClient
from shared.runtime import run_until_stopped, supervise
from shared.vocab import CommandAction

async def wait_on_a_live_peer(bus):
    client = CommandClient(bus, timeout_s=3600, max_attempts=1)
    await client.start()
    await client.call("sup:test:peer:commands", CommandAction.RESUME, lease_key="sup:test:peer:lease")

async def body(bus, stop):
    time.sleep(float(sys.argv[4]))  # a start-up that blocks the event loop (an engine loading): not judged
    await supervise({"waiter.peer": wait_on_a_live_peer(bus)})

run_until_stopped(body, redis_url=sys.argv[1], names=Names("sup"), service="waiter",
                  run=RunConfig(namespace="sup", loop_stale_s=float(sys.argv[2]),
                                hung_grace_s=float(sys.argv[3])))
"""


def test_services_starting_up_or_waiting_on_stream_reads_or_a_live_peer_past_the_budget_keep_running(
        redis_server: RedisServer, tmp_path: Path) -> None:
    config, names = write_config(tmp_path, loop_stale_s=STALE_S, hung_grace_s=GRACE_S), Names("sup")
    script = tmp_path / "peer_waiter.py"
    script.write_text(PEER_WAITER)
    with redis.Redis.from_url(redis_server.url) as client:
        client.set("sup:test:peer:lease", b"alive")  # the peer lives, it just never answers
        balancer = spawn("services.loadbalancer", config, redis_server.url, tmp_path / "lb.log")
        waiter = spawn_python([str(script), redis_server.url, str(STALE_S), str(GRACE_S),
                               str(1.5 * BUDGET_S)], tmp_path / "waiter.log")
        try:
            wait_for_health_key(client, names, "loadbalancer", LB_LOOPS)
            wait_for_health_key(client, names, "waiter", frozenset({"waiter.peer"}))  # after its start-up
            time.sleep(3 * BUDGET_S)  # idle reads, and a command nobody acks
            assert balancer.poll() is None and waiter.poll() is None
            for service in ("loadbalancer", "waiter"):
                ages = json.loads(client.get(names.health(service)) or b"{}")
                assert ages and max(ages.values()) < STALE_S, (service, ages)
        finally:
            for proc in (balancer, waiter):
                proc.kill()
                proc.wait()
    assert "is stuck" not in (tmp_path / "lb.log").read_text() + (tmp_path / "waiter.log").read_text()


def test_a_service_stopped_past_its_budget_then_continued_is_not_taken_for_a_stuck_one(
        redis_server: RedisServer, tmp_path: Path) -> None:
    config, names = write_config(tmp_path, loop_stale_s=STALE_S, hung_grace_s=GRACE_S), Names("sup")
    balancer = spawn("services.loadbalancer", config, redis_server.url, tmp_path / "lb.log")
    try:
        with redis.Redis.from_url(redis_server.url) as client:
            wait_for_health_key(client, names, "loadbalancer", LB_LOOPS)
        redis_server.freeze()  # the whole host paused (docker pause of every container), and then
        balancer.send_signal(signal.SIGSTOP)  # no thread of the service runs, no loop beats
        time.sleep(1.5 * BUDGET_S)
        balancer.send_signal(signal.SIGCONT)
        time.sleep(2 * STUCK_POLL_S)  # Redis resumes last: till then no loop can beat, but the watchdog runs
        redis_server.thaw()
        time.sleep(BUDGET_S + STUCK_POLL_S)  # every loop got its budget afresh at the resume
        assert balancer.poll() is None
    finally:
        balancer.kill()
        balancer.wait()
    assert "is stuck" not in (tmp_path / "lb.log").read_text()
