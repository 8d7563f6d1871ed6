"""`dynsched run` dying never leaves its services or its embedded Redis running: a closed terminal
(SIGHUP) stops them in order like Ctrl-C, and a SIGKILLed launcher's children are stopped by the kernel
(Linux's parent-death signal). Before, both left every service and the redis-server running for ever.
A child that exits has what is left of its process group killed (a worker's vLLM engine process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.live_run import live_config
from services.processes import stop_signals_held, stop_with_launcher

ROOT = Path(__file__).resolve().parent.parent
CHILDREN = 9
"""controller, load balancer, four rollout workers, rollouter, trainer and redis-server (sim_small.yaml)."""


def processes_naming(marker: str) -> dict[int, str]:
    """Every process whose command line contains `marker` (pid: command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found[int(entry.name)] = cmdline
    return found


def run_children(config: Path) -> dict[int, str]:
    """The run's services (their --config) and its redis-server (its --port, from their --redis-url)."""
    services = {pid: cmd for pid, cmd in processes_naming(str(config)).items() if "services.cli" not in cmd}
    urls = {cmd.split("--redis-url ")[1].split()[0] for cmd in services.values() if "--redis-url " in cmd}
    ports = {url.rsplit(":", 1)[1].split("/")[0] for url in urls}
    redis = {pid: cmd for port in ports for pid, cmd in processes_naming(f"127.0.0.1:{port}").items()
             if "redis-server" in cmd}
    return {**services, **redis}


def wait_until(predicate: Callable[[], Any], timeout_s: float) -> Any:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if value := predicate():
            return value
        time.sleep(0.2)
    return predicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_a_launcher_that_dies_mid_run_leaves_no_service_and_no_redis_running(
        tmp_path: Path, sig: int) -> None:
    # 4096 samples: minutes long, still running at the kill
    config = live_config(tmp_path, time_scale=0.05, total_rollout_steps=4096)
    output = tmp_path / "launcher.log"
    with output.open("wb") as out:
        launcher = subprocess.Popen([sys.executable, "-m", "services.cli", "run", "--config", str(config),
                                     "--out", str(tmp_path / "run"), "--no-progress"], cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT)
    try:
        children = wait_until(lambda: len(found := run_children(config)) >= CHILDREN and found, timeout_s=60)
        assert children and len(children) == CHILDREN, f"the run's processes: {children}"
        launcher.send_signal(sig)
        launcher.wait(timeout=30)
        wait_until(lambda: not run_children(config), timeout_s=20)
        left = run_children(config)
    finally:
        launcher.kill()
        for pid in run_children(config):
            os.kill(pid, signal.SIGKILL)
    assert left == {}, f"still running after the launcher died: {left}"
    if sig == signal.SIGHUP:
        assert launcher.returncode == 130 and "interrupted; services stopped" in output.read_text()


def test_a_child_that_exits_leaving_a_process_of_its_own_has_it_killed(tmp_path: Path) -> None:
    # as a rollout worker that exits without stopping vLLM's EngineCore process (a crash, the stuck-loop exit)
    from services.processes import kill_group

    grandchild_pid = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(grandchild_pid)!r}, 'w').write(str(p.pid))")
    child = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    child.wait(timeout=30)
    pid = int(grandchild_pid.read_text())
    assert Path(f"/proc/{pid}").exists(), "the child's own process outlives it"
    kill_group(child)
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout_s=10)


def _zombie(pid: int) -> bool:
    """Killed, not yet reaped by its new parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher holds the signals on Linux")
def test_a_stop_signal_while_a_child_starts_is_raised_once_it_is_recorded_and_the_child_still_stops() -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGHUP, interrupt)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with pytest.raises(KeyboardInterrupt), stop_signals_held():
            os.kill(os.getpid(), signal.SIGHUP)  # a closed terminal, while the launcher starts a child
            procs["child"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                              preexec_fn=stop_with_launcher())
        assert "child" in procs  # recorded: the launcher's stop reaches it
        procs["child"].terminate()
        assert procs["child"].wait(timeout=10) == -signal.SIGTERM  # the child does not hold the signals
    finally:
        signal.signal(signal.SIGHUP, previous)
        for proc in procs.values():
            proc.kill()
