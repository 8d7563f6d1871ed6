"""compose for GPU hosts (compose.yaml + compose.gpu.yaml, configs/compose_gpu.yaml): the trainer and
every hybrid share one IPC and one PID namespace (CUDA IPC needs both), the NCCL rendezvous port is
the configured one and published. Pure YAML, plus `docker-compose config` when it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.config import load_config

ROOT = Path(__file__).resolve().parent.parent
FILES = (ROOT / "compose.yaml", ROOT / "compose.gpu.yaml")
CONFIG = load_config(ROOT / "configs" / "compose_gpu.yaml")


def _merged_by_hand() -> dict[str, dict[str, Any]]:
    """compose's override rule for the keys checked here: a later file's value replaces the earlier."""
    services: dict[str, dict[str, Any]] = {}
    for path in FILES:
        for name, service in (yaml.safe_load(path.read_text())["services"] or {}).items():
            services.setdefault(name, {}).update(service or {})
    return services


def _hybrid_services(services: dict[str, dict[str, Any]]) -> list[str]:
    return [name for name in services if "hybrid" in name]


def _published(service: dict[str, Any]) -> set[int]:
    ports = set()
    for port in service.get("ports", []):
        ports.add(int(port["published"]) if isinstance(port, dict) else int(str(port).split(":")[-2]))
    return ports


def _check(services: dict[str, dict[str, Any]]) -> None:
    assert services["anchor"]["ipc"] == "shareable"
    sharing = ["trainer", *_hybrid_services(services)]
    assert len(sharing) == 1 + len(CONFIG.hybrid_ids)
    for name in sharing:
        assert services[name]["ipc"] == "service:anchor", name
        assert services[name]["pid"] == "service:anchor", name
    assert CONFIG.rollout.standalone_weight_transport == "nccl"
    assert CONFIG.rollout.weight_transfer_port in _published(services["trainer"])


def test_the_trainer_and_every_hybrid_join_the_anchors_ipc_and_pid_namespaces_and_the_port_is_published():
    _check(_merged_by_hand())


def test_the_gpu_config_bounds_what_a_hybrid_takes_at_wake():
    assert 0 < CONFIG.rollout.hybrid_kv_cache_memory_bytes <= 1 << 30
    assert CONFIG.rollout.hybrid_weight_transport == "ipc"


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose not on PATH (Debian: apt-get install docker-compose)")
def test_docker_compose_validates_the_gpu_override_with_the_shared_namespaces():
    out = subprocess.run(["docker-compose", *(arg for f in FILES for arg in ("-f", str(f))), "config"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    _check(yaml.safe_load(out.stdout)["services"])
