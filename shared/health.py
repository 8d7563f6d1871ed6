"""Liveness of a service process, as Redis and a healthcheck see it.

Where it sits: `shared.runtime.run_until_stopped` runs `publish_health` next to every service's
loops: every HEALTH_INTERVAL_S it writes the ages of the process's loops (shared.liveness) to
`Names.health(service)` with a TTL of HEALTH_TTL_S. The compose healthcheck of a service without
HTTP runs

    python -m shared.health --config FILE --redis-url URL SERVICE

which exits 0 when the key is there and no loop is older than `run.loop_stale_s`, else 1 with one
line saying why (no key: the process is down, hung, or cannot reach Redis; a stale loop: named).
The controller answers the same question over HTTP (`/healthz`, admin.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import redis
import redis.asyncio as aredis

from shared.bus import Bus
from shared.config import ConfigError, load_config
from shared.liveness import LIVENESS, stale_loops
from shared.names import HEALTH_INTERVAL_S, HEALTH_TTL_S, Names
from shared.runtime import sleep_unless

PING_TIMEOUT_S = 1.0
"""A health probe says 'Redis unreachable' rather than wait longer than this."""


async def publish_health(bus: Bus, service: str, stop: asyncio.Event) -> None:
    """Write this process's loop ages until `stop` (a supervised loop: if Redis stays unreachable
    past the client's retries, it fails and the process exits non-zero)."""
    key = bus.names.health(service)
    while not stop.is_set():
        await bus.redis.set(key, json.dumps(LIVENESS.ages()), ex=HEALTH_TTL_S)
        await sleep_unless(stop, HEALTH_INTERVAL_S)


async def redis_reachable(client: aredis.Redis) -> bool:
    """PING within PING_TIMEOUT_S (the client's own retries would take longer)."""
    try:
        async with asyncio.timeout(PING_TIMEOUT_S):
            return bool(await client.ping())
    except (TimeoutError, redis.RedisError, OSError):
        return False


def check(client: redis.Redis, names: Names, service: str, *, stale_after_s: float) -> str:
    """'' when `service` is healthy, else why not (one line)."""
    try:
        raw = client.get(names.health(service))
    except (redis.RedisError, OSError) as exc:
        return f"Redis unreachable: {exc}"
    return judge(raw, key=names.health(service), stale_after_s=stale_after_s)


def judge(raw: bytes | str | None, *, key: str, stale_after_s: float) -> str:
    """'' when the health report `raw` read from `key` (None: no key) is healthy, else why not (one
    line). The one judge: this module's healthcheck and the launcher's hang watch both call it."""
    if raw is None:
        return (f"no health report at {key} in the last {HEALTH_TTL_S}s: "
                "the process is down, hung, or cannot reach Redis")
    try:
        ages = {str(name): float(age) for name, age in json.loads(raw).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        return f"unreadable health report at {key}: {exc}"
    stale = stale_loops(ages, stale_after_s)
    if stale:
        return "stale loops (no progress for more than {:.0f}s): {}".format(
            stale_after_s, ", ".join(f"{name} {ages[name]:.0f}s" for name in stale))
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="exit 0 if a dynsched service process is healthy")
    parser.add_argument("--config", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("service", help="controller, loadbalancer, rollouter, trainer, or rollout_worker.ID")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    client = redis.Redis.from_url(args.redis_url, socket_timeout=PING_TIMEOUT_S * 2,
                                  socket_connect_timeout=PING_TIMEOUT_S * 2)
    with client:
        problem = check(client, Names(config.run.namespace), args.service,
                        stale_after_s=config.run.loop_stale_s)
    if problem:
        print(f"unhealthy: {args.service}: {problem}", file=sys.stderr)
        return 1
    print(f"healthy: {args.service}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
