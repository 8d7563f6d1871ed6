"""The admin API of a real controller process: loopback by default, a bearer token for every
mutating call (and every call off loopback), bodies capped, non-finite and non-numeric values
refused with a JSON 422, liveness and readiness that tell the truth about Redis, and a policy chosen
through the API still in force after the controller is SIGKILLed and restarted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from shared.admin_auth import (
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    bind_admin_socket,
    check_bind,
    is_loopback,
    load_admin_token,
)
from shared.config import config_to_dict
from shared.runtime import free_port
from tests.conftest import RedisServer
from tests.stack import sim_config

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON_AUTH = {**AUTH, "Content-Type": "application/json"}


def write_config(tmp_path: Path, **run: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(sim_config(run={"namespace": "adm", **run}))))
    return path


@dataclass
class Api:
    url: str
    proc: subprocess.Popen[bytes]
    start: object


def start_controller(config: Path, redis_url: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "services.controller", "--config", str(config),
                                 "--redis-url", redis_url], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the controller exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError("the controller never became ready")


@pytest.fixture
def api(redis_server: RedisServer, tmp_path: Path) -> Iterator[Api]:
    port = free_port()
    config = write_config(tmp_path, admin_port=port)
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen[bytes]:
        proc = start_controller(config, redis_server.url, tmp_path / "controller.log", {TOKEN_ENV: TOKEN})
        wait_ready(url, proc)
        return proc

    handle = Api(url=url, proc=start(), start=start)
    try:
        yield handle
    finally:
        handle.proc.kill()
        handle.proc.wait()


def test_reads_are_open_on_loopback_and_every_mutating_call_needs_the_token(api: Api) -> None:
    assert httpx.get(f"{api.url}/status").status_code == 200
    for method, path, body in (("POST", "/activate", None), ("POST", "/deactivate", None),
                               ("PUT", "/policy", {"deactivate_ratio": 0.4})):
        refused = httpx.request(method, f"{api.url}{path}", json=body)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        wrong = httpx.request(method, f"{api.url}{path}", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert httpx.request(method, f"{api.url}{path}", json=body, headers=AUTH).status_code in (200, 202)


BAD_BODIES = ['{"deactivate_ratio": NaN}', '{"deactivate_ratio": Infinity}',
              '{"deactivate_ratio": -Infinity}', '{"deactivate_ratio": 1e309}',
              '{"deactivate_ratio": true}', '{"deactivate_ratio": "0.5"}', '{"name": 3}', "NaN", "[0.5]"]


def test_non_finite_and_non_numeric_values_are_refused_with_a_json_422(api: Api) -> None:
    for raw in BAD_BODIES:
        reply = httpx.put(f"{api.url}/policy", content=raw, headers=JSON_AUTH)
        assert reply.status_code == 422, (raw, reply.text)
        assert reply.json()["detail"][0]["msg"], raw
    assert httpx.get(f"{api.url}/policy").json()["deactivate_ratio"] == 0.5  # unchanged


def test_a_body_over_64_kb_is_refused_with_413_declared_or_streamed(api: Api) -> None:
    big = b'{"name": "' + b"x" * 70_000 + b'"}'
    reply = httpx.put(f"{api.url}/policy", content=big, headers=JSON_AUTH)
    assert reply.status_code == 413 and "65536" in reply.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: judged while reading
        yield b'{"name": "'
        for _ in range(40):
            yield b"x" * 4096
        yield b'"}'

    streamed = httpx.put(f"{api.url}/policy", content=chunks(), headers=JSON_AUTH)
    assert streamed.status_code == 413
    assert api.proc.poll() is None


def test_a_policy_chosen_through_the_api_survives_a_controller_restart(api: Api) -> None:
    chosen = httpx.put(f"{api.url}/policy", json={"name": "adaptive", "deactivate_ratio": 0.25}, headers=AUTH)
    assert chosen.status_code == 200 and chosen.json()["name"] == "adaptive"
    api.proc.send_signal(signal.SIGKILL)
    api.proc.wait()
    api.proc = api.start()  # type: ignore[operator]
    policy = httpx.get(f"{api.url}/policy").json()
    assert policy["name"] == "adaptive" and policy["deactivate_ratio"] == 0.25


def test_liveness_and_readiness_say_503_while_redis_does_not_answer(api: Api,
                                                                   redis_server: RedisServer) -> None:
    healthy = httpx.get(f"{api.url}/healthz").json()
    assert healthy["ok"] and healthy["redis"] and "controller.events" in healthy["loops"]
    assert httpx.get(f"{api.url}/readyz").json()["ready"] is True
    redis_server.freeze()  # unreachable: connections hang
    try:
        sick = httpx.get(f"{api.url}/healthz", timeout=5.0)
        assert sick.status_code == 503 and sick.json()["redis"] is False
        assert httpx.get(f"{api.url}/readyz", timeout=5.0).status_code == 503
    finally:
        redis_server.thaw()
    deadline = time.monotonic() + 10
    while httpx.get(f"{api.url}/healthz", timeout=5.0).status_code != 200:
        assert time.monotonic() < deadline, "never healthy again after Redis came back"
        time.sleep(0.2)


def test_off_loopback_without_a_token_the_controller_refuses_to_start_in_one_line(
        redis_server: RedisServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, admin_host="0.0.0.0")
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    done = subprocess.run([sys.executable, "-m", "services.controller", "--config", str(config),
                           "--redis-url", redis_server.url], capture_output=True, text=True, cwd=ROOT,
                          timeout=30, env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and "run.admin_host=0.0.0.0 is not a loopback address" in done.stderr


def test_off_loopback_every_endpoint_but_the_probes_needs_the_token(redis_server: RedisServer,
                                                                   tmp_path: Path) -> None:
    port = free_port("")
    config = write_config(tmp_path, admin_host="0.0.0.0", admin_port=port)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = start_controller(config, redis_server.url, tmp_path / "controller.log",
                            {TOKEN_FILE_ENV: str(token_file)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        for path in ("/status", "/policy", "/metrics", "/api/series"):
            assert httpx.get(f"{url}{path}").status_code == 401, path
            assert httpx.get(f"{url}{path}", headers=AUTH).status_code == 200, path
        assert httpx.get(f"{url}/healthz").status_code == 200
        assert httpx.get(f"{url}/dashboard").status_code == 200  # the page; its requests carry the token
    finally:
        proc.kill()
        proc.wait()


def test_the_token_comes_from_the_variable_or_the_file_and_the_bind_rule_is_checked(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(" abc \n")
    assert load_admin_token({TOKEN_ENV: "xyz", TOKEN_FILE_ENV: str(token_file)}) == "xyz"
    assert load_admin_token({TOKEN_FILE_ENV: str(token_file)}) == "abc"
    assert load_admin_token({}) == ""
    with pytest.raises(ValueError, match="cannot read the admin token"):
        load_admin_token({TOKEN_FILE_ENV: str(tmp_path / "missing")})
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    check_bind("127.0.0.1", "")
    check_bind("0.0.0.0", "abc")
    with pytest.raises(ValueError, match="not a loopback address"):
        check_bind("0.0.0.0", "")


def test_a_client_that_connects_as_soon_as_the_address_is_published_waits_instead_of_being_refused() -> None:
    """The controller publishes its admin address before uvicorn accepts: the socket already listens."""
    sock = bind_admin_socket("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname(), timeout=5):  # nobody has accepted yet
            pass
    finally:
        sock.close()
