"""Dependencies point one way (STYLE.md rule 5): shared <- policies <- core <- services, sim;
the service packages never import each other; no Redis key literal outside the names module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.pyparse import parse

ROOT = Path(__file__).resolve().parent.parent
SERVICE_PACKAGES = ("controller", "loadbalancer", "rollouter", "rollout_worker", "trainer")
FORBIDDEN = {  # package -> top-level packages it must not import
    "shared": {"policies", "core", "services", "sim", "rl"},
    "policies": {"core", "services", "sim", "rl"},
    "core": {"services", "sim"},
    "sim": {"services"},
    "rl": {"services", "sim", "core", "policies"},
}


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_never_import_higher_ones(package):
    offenders = [f"{path.relative_to(ROOT)} imports {name}"
                 for path in (ROOT / package).rglob("*.py")
                 for name in imports(path) if name.split(".")[0] in FORBIDDEN[package]]
    assert not offenders


def test_service_packages_never_import_each_other():
    offenders = []
    for service in SERVICE_PACKAGES:
        for path in (ROOT / "services" / service).rglob("*.py"):
            for name in imports(path):
                parts = name.split(".")
                if parts[0] == "services" and len(parts) > 1 and parts[1] != service:
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders


def test_among_service_processes_only_the_sim_backends_import_the_simulator():
    # The sim engine and the sim trainer are the planner's replica and trainer models on a wall clock,
    # and the sim prompts its prompt lengths (one timing model, not two copies); nothing else in a
    # service process may lean on the simulator.
    allowed = {ROOT / "services" / "rollout_worker" / "sim_engine.py",
               ROOT / "services" / "trainer" / "sim_backend.py",
               ROOT / "services" / "rollouter" / "prompts.py"}
    offenders = [f"{path.relative_to(ROOT)} imports {name}" for service in SERVICE_PACKAGES
                 for path in (ROOT / "services" / service).rglob("*.py")
                 if path not in allowed for name in imports(path) if name.split(".")[0] == "sim"]
    assert not offenders


def test_no_redis_key_literal_outside_the_names_module():
    pattern = re.compile(r"""["']dynsched:""")
    offenders = [str(path.relative_to(ROOT)) for package in ("services", "shared", "core", "policies")
                 for path in (ROOT / package).rglob("*.py")
                 if path.name != "names.py" and pattern.search(path.read_text())]
    assert not offenders
