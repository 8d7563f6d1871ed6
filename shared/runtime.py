"""What every service's `main` shares: arguments, logging, signals, the bus.

Where it sits: `services/<name>/__main__.py` calls `service_args` and
`run_until_stopped`; nothing here knows about any particular service.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from collections.abc import Awaitable, Callable

from shared.bus import Bus
from shared.config import Config, RunConfig, load_config
from shared.names import Names
from shared.streams import connect


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago ("" = every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def sleep_unless(event: asyncio.Event, timeout_s: float) -> bool:
    """Sleep up to `timeout_s`, returning early (True) when `event` is set.

    Uses `asyncio.timeout`, not `wait_for`: on Python 3.11 `wait_for` can swallow a
    cancellation that races with completion, leaving a cancelled service running."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


def service_args(description: str, argv: list[str] | None = None,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--redis-url", required=True, help="e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--log-level", default="INFO")
    if extra:
        extra(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args


def load(args: argparse.Namespace) -> tuple[Config, Names]:
    config = load_config(args.config)
    return config, Names(config.run.namespace)


def run_until_stopped(body: Callable[[Bus, asyncio.Event], Awaitable[None]], *, redis_url: str,
                      names: Names, run: RunConfig) -> None:
    """Run `body(bus, stop)`; SIGTERM/SIGINT set `stop`; the Redis client is closed in `finally`.
    Redis calls retry for `run.redis_retry_window_s`; readers trim by `run.stream_retention_s`."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        redis = connect(redis_url, retry_window_s=run.redis_retry_window_s)
        try:
            await body(Bus(redis, names, retention_s=run.stream_retention_s,
                           dead_letter_maxlen=run.dead_letter_maxlen), stop)
        finally:
            await redis.aclose()

    asyncio.run(main())
