"""compose.yaml without its GPU reservations, for a machine with no GPU (tools/compose_smoke.sh).

    python3 tools/compose_cpu.py compose.yaml > compose.cpu.yaml

Docker refuses to start a container that reserves `driver: nvidia` devices where there is no such
driver, and a compose override file cannot delete a key, so this writes a copy with every service's
`deploy` section removed; everything else (services, profiles, images, namespaces, healthchecks)
stays exactly as compose.yaml has it. Plain Python + PyYAML (Debian's python3-yaml is enough).
"""

from __future__ import annotations

import sys

import yaml


def without_gpus(compose: dict) -> dict:
    for service in compose.get("services", {}).values():
        service.pop("deploy", None)
    return {key: value for key, value in compose.items() if not key.startswith("x-")}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: compose_cpu.py COMPOSE_FILE", file=sys.stderr)
        return 2
    with open(argv[1]) as fh:
        compose = yaml.safe_load(fh)
    yaml.safe_dump(without_gpus(compose), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
