"""The `dynsched` command line: argument errors, the admin API client, and the deployment files.

The admin API is played by a tiny FastAPI stand-in served by uvicorn on a free port, so the
CLI's real HTTP path (httpx, status codes, error bodies) is exercised without a controller.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn
import yaml
from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel, Field

from services.cli import main
from shared.admin_auth import TOKEN_ENV, TOKEN_FILE_ENV
from shared.names import Names
from shared.runtime import free_port
from tests.conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent
RATIO_ERROR = "deactivate_ratio=2.0 is outside [0, 1]"


class _PolicyUpdate(BaseModel):
    name: str | None = None
    deactivate_ratio: float | None = Field(default=None)


def _stand_in_app(calls: list[str]) -> FastAPI:
    app = FastAPI()

    @app.get("/status")
    async def status() -> dict[str, Any]:
        calls.append("GET /status")
        return {"mode": "standalone_only", "activations": 2, "deactivations": 1}

    @app.post("/activate")
    async def activate(authorization: str = Header(default="")) -> dict[str, Any]:
        calls.append("POST /activate" + (f" ({authorization})" if authorization else ""))
        return {"pending_force": "activate"}

    @app.put("/policy")
    async def put_policy(update: _PolicyUpdate) -> dict[str, Any]:
        calls.append("PUT /policy")
        if update.deactivate_ratio is not None and not 0 <= update.deactivate_ratio <= 1:
            raise HTTPException(status_code=422, detail=RATIO_ERROR)
        return {"name": update.name or "default", "deactivate_ratio": update.deactivate_ratio}

    return app


@pytest.fixture
def admin() -> Iterator[tuple[str, list[str]]]:
    """(host:port, the calls it received) of a running stand-in admin API."""
    calls: list[str] = []
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_stand_in_app(calls), host="127.0.0.1", port=port,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline_s = time.monotonic() + 10.0
    while not server.started and time.monotonic() < deadline_s:
        time.sleep(0.01)
    assert server.started, "the stand-in admin API did not start"
    try:
        yield f"127.0.0.1:{port}", calls
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)


def test_a_missing_subcommand_exits_2_with_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "usage: dynsched" in capsys.readouterr().err


def test_run_without_config_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run"])
    assert exit_info.value.code == 2
    assert "--config" in capsys.readouterr().err


def test_a_non_numeric_ratio_is_rejected_before_any_request(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["policy", "--ratio", "abc", "--admin", "127.0.0.1:1"])
    assert exit_info.value.code == 2
    assert "invalid float value: 'abc'" in capsys.readouterr().err


def test_a_missing_config_file_is_one_clear_error_line(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    assert main(["run", "--config", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "out")]) == 1
    missing = tmp_path / "nope.yaml"
    assert capsys.readouterr().err.strip() == f"dynsched: error: config file not found: {missing}"


def test_an_invalid_config_value_is_reported_with_its_key(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("data: {total_rollout_steps: 0}\ntrainer: {ppo_mini_batch_size: 4}\n")
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "out")]) == 1
    assert "data.total_rollout_steps=0" in capsys.readouterr().err
    assert not (tmp_path / "out" / "logs").exists(), "nothing may start for an invalid config"


def test_a_run_too_short_to_train_one_weight_version_is_one_line_before_anything_starts(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "short.yaml"
    config.write_text("data: {total_rollout_steps: 7}\ntrainer: {ppo_mini_batch_size: 4}\n")
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "data.total_rollout_steps=7 trains nothing" in err and "takes 16 samples" in err
    assert not (tmp_path / "out" / "logs").exists(), "nothing may start for a run that trains nothing"


def test_an_admin_port_another_process_holds_is_one_line_before_anything_starts(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = tmp_path / "port.yaml"
        config.write_text(f"run: {{admin_port: {port}}}\ndata: {{total_rollout_steps: 64}}\n"
                          "trainer: {ppo_mini_batch_size: 4}\n")
        assert main(["run", "--config", str(config), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"run.admin_port={port} cannot be bound on 127.0.0.1" in err and "another process holds it" in err
    assert not (tmp_path / "out" / "logs").exists(), "nothing may start"


def test_policy_ratio_out_of_range_reports_the_servers_4xx_text(
        admin: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    address, calls = admin
    assert main(["policy", "--ratio", "2", "--admin", address]) == 1
    err = capsys.readouterr().err
    assert "HTTP 422" in err and RATIO_ERROR in err
    assert calls == ["PUT /policy"]


def test_policy_change_prints_the_servers_answer(admin: tuple[str, list[str]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    address, _ = admin
    assert main(["policy", "--name", "fixed_ratio", "--ratio", "0.5", "--admin", address]) == 0
    assert '"name": "fixed_ratio"' in capsys.readouterr().out


def test_status_finds_the_admin_address_in_redis_and_prints_json(
        admin: tuple[str, list[str]], redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    address, calls = admin
    names = Names("cli_test")
    with redis.Redis.from_url(redis_server.url) as client:
        client.set(names.controller_admin, address)
    assert main(["status", "--redis-url", redis_server.url, "--namespace", "cli_test"]) == 0
    assert '"activations": 2' in capsys.readouterr().out
    assert calls == ["GET /status"]


def test_activate_posts_to_the_admin_api(admin: tuple[str, list[str]], capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    address, calls = admin
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    assert main(["activate", "--admin", address]) == 0
    assert calls == ["POST /activate"]


def test_admin_commands_send_the_token_from_the_environment(admin: tuple[str, list[str]], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    address, calls = admin
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token_file))
    assert main(["activate", "--admin", address]) == 0
    monkeypatch.setenv(TOKEN_ENV, "from-the-variable")
    assert main(["activate", "--admin", address]) == 0
    assert calls == ["POST /activate (Bearer from-a-file)", "POST /activate (Bearer from-the-variable)"]


def test_an_unreadable_token_file_is_one_line_before_any_request(admin: tuple[str, list[str]], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    address, calls = admin
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    assert main(["activate", "--admin", address]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read the admin token" in err and calls == []


@pytest.mark.parametrize("command", ["run", "up"])
def test_an_admin_api_off_loopback_without_a_token_is_one_line_before_anything_starts(
        command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load((ROOT / "configs" / "sim_small.yaml").read_text())
    data["run"]["admin_host"] = "0.0.0.0"
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(data))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    assert main([command, "--config", str(config), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run.admin_host=0.0.0.0 is not a loopback address" in err
    assert not (tmp_path / "out").exists()


def test_status_without_a_published_address_says_where_it_looked(
        redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--redis-url", redis_server.url, "--namespace", "nobody"]) == 1
    err = capsys.readouterr().err
    assert "no controller admin address" in err and Names("nobody").controller_admin in err


def test_status_with_an_unreachable_redis_fails_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--redis-url", f"redis://127.0.0.1:{free_port()}/0"]) == 1
    assert "cannot read Redis" in capsys.readouterr().err


def test_the_compose_file_defines_every_service_with_gpu_reservations() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    for name in ("redis", "controller", "loadbalancer", "rollouter", "trainer", "prometheus"):
        assert name in services, f"compose.yaml lacks the {name} service"
    workers = [name for name in services if name.startswith("rollout-worker")]
    assert workers, "compose.yaml has no rollout-worker service"
    for name in ("trainer", *workers):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices and devices[0]["capabilities"] == ["gpu"], name
    assert any(str(port).endswith("8000") for port in services["controller"]["ports"])


def test_prometheus_scrapes_the_controllers_metrics() -> None:
    prometheus = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs["dynsched-controller"]["metrics_path"] == "/metrics"
    assert jobs["dynsched-controller"]["static_configs"][0]["targets"] == ["controller:8000"]


def test_simulate_runs_through_the_main_cli_and_prints_json(capsys):
    assert main(["simulate", "--scenario", "scenarios/small_production_bound.yaml", "--json"]) == 0
    assert '"ideal_bound_h"' in capsys.readouterr().out


# -- user mistakes: one line each, naming the file, key or address (never a traceback) ----------------------


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and lines[0].startswith("dynsched: error: ")
    return lines[0]


@pytest.mark.parametrize("command", ["run", "up"])
def test_run_and_up_with_an_unreachable_redis_print_one_line_naming_the_address(
        command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert main([command, "--config", "configs/sim_small.yaml", "--redis-url", url,
                 "--out", str(tmp_path / "out")]) == 1
    assert f"cannot reach Redis at {url}" in _one_error_line(capsys)
    assert not (tmp_path / "out" / "logs").exists(), "no service may start without its Redis"


@pytest.mark.parametrize("command", ["status", "activate", "deactivate", "policy"])
def test_admin_commands_with_an_unreachable_redis_print_one_line_naming_the_address(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert main([command, "--redis-url", url]) == 1
    assert f"cannot read Redis at {url}" in _one_error_line(capsys)


def test_a_malformed_redis_url_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["run", "--config", "configs/sim_small.yaml", "--redis-url", "localhost:6379",
                 "--out", str(tmp_path / "out")]) == 1
    assert "cannot reach Redis at localhost:6379" in _one_error_line(capsys)


def test_a_yaml_syntax_error_is_one_line_naming_the_file_and_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("run:\n  name: x\ntrainer: {ppo_mini_batch_size: 4\ndata:\n  n: 2\n")
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "out")]) == 1
    line = _one_error_line(capsys)
    assert f"{config}:4:5: YAML syntax error" in line  # the file, line and column of the mistake


def test_an_unknown_policy_is_one_line_naming_the_key_before_anything_starts(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    data = yaml.safe_load((ROOT / "configs" / "sim_small.yaml").read_text())
    data["async_training"]["dynamic_schedule_policy"] = "no_such_policy"
    config.write_text(yaml.safe_dump(data))
    assert main(["up", "--config", str(config), "--out", str(tmp_path / "out")]) == 1
    line = _one_error_line(capsys)
    assert "dynamic_schedule_policy" in line and "no_such_policy" in line and str(config) in line
    assert not (tmp_path / "out" / "logs").exists(), "nothing may start for an unknown policy"


def test_an_unimportable_policy_module_is_one_line_naming_the_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "module.yaml"
    data = yaml.safe_load((ROOT / "configs" / "sim_small.yaml").read_text())
    data["async_training"]["dynamic_schedule_policy_module"] = "no_such_package.my_policy"
    config.write_text(yaml.safe_dump(data))
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "out")]) == 1
    line = _one_error_line(capsys)
    assert "dynamic_schedule_policy_module" in line and "no_such_package" in line
