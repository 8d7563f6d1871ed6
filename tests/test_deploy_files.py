"""compose.yaml as a multi-host deployment: a profile per node role, Redis's address from the
environment, and the CPU copy the smoke test runs (tools/compose_cpu.py) differing only in GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def test_every_service_belongs_to_exactly_one_node_role() -> None:
    roles = {name: service.get("profiles") for name, service in SERVICES.items()}
    assert roles["redis"] == roles["controller"] == roles["loadbalancer"] == roles["rollouter"] == ["control"]
    assert roles["trainer"] == ["trainer"]
    for name in (n for n in SERVICES if n.startswith("rollout-worker-hybrid")):
        assert roles[name] == ["trainer"], f"{name}: hybrids live on the trainer's GPUs"
    for name in (n for n in SERVICES if n.startswith("rollout-worker-standalone")):
        assert roles[name] == ["rollout"], name
    assert roles["prometheus"] == roles["grafana"] == ["monitoring"]


def test_services_on_other_nodes_take_redis_from_the_environment_and_never_wait_for_a_local_one() -> None:
    for name in ("trainer", *(n for n in SERVICES if n.startswith("rollout-worker"))):
        service = SERVICES[name]
        assert "${DYNSCHED_REDIS_URL:-redis://redis:6379/0}" in service["command"], name
        assert "redis" not in (service.get("depends_on") or {}), f"{name} must start without a local redis"


def test_one_host_runs_every_role_by_default() -> None:
    env = dict(line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines()
               if line and not line.startswith("#"))
    assert set(env["COMPOSE_PROFILES"].split(",")) == {"control", "trainer", "rollout"}


def test_the_cpu_copy_drops_only_the_gpu_reservations() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "compose_cpu.py"), str(ROOT / "compose.yaml")],
                         capture_output=True, text=True, check=True).stdout
    cpu = yaml.safe_load(out)
    assert set(cpu["services"]) == set(SERVICES)
    for name, service in cpu["services"].items():
        assert "deploy" not in service
        assert {k: v for k, v in SERVICES[name].items() if k != "deploy"} == service, name


def test_every_dynsched_service_has_a_healthcheck_naming_its_own_health_key() -> None:
    for name, service in SERVICES.items():
        if name in ("redis", "prometheus", "grafana"):
            continue
        test = service["healthcheck"]["test"]
        if name == "controller":
            assert "/healthz" in " ".join(test)
            continue
        assert test[1:4] == ["python", "-m", "shared.health"], name
        replica = next((arg for prev, arg in zip(service["command"], service["command"][1:], strict=False)
                        if prev == "--replica-id"), None)
        assert test[-1] == (f"rollout_worker.{replica}" if replica else name), name


def test_the_admin_token_is_a_secret_of_the_controller_and_prometheus() -> None:
    assert "admin_token" in COMPOSE["secrets"]
    assert SERVICES["controller"]["secrets"] == SERVICES["prometheus"]["secrets"] == ["admin_token"]
    assert SERVICES["controller"]["environment"]["DYNSCHED_ADMIN_TOKEN_FILE"] == "/run/secrets/admin_token"
    prometheus = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    job = prometheus["scrape_configs"][0]
    assert job["authorization"]["credentials_file"] == "/run/secrets/admin_token"


def test_redis_keeps_an_append_only_file_on_a_volume_and_is_restarted_after_a_crash() -> None:
    redis = SERVICES["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    data_dir = command[command.index("--dir") + 1]
    assert any(volume.endswith(f":{data_dir}") for volume in redis["volumes"])
    assert redis["restart"] == "unless-stopped"
