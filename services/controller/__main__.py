"""`python -m services.controller --config FILE --redis-url URL`: controller + admin API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import uvicorn

from services.controller.admin import PrometheusExporter, build_app
from services.controller.service import Controller
from shared.bus import Bus
from shared.runtime import load, run_until_stopped, service_args


class _QuietServer(uvicorn.Server):
    """Leaves signals to the service runtime (which sets `stop`), instead of capturing them."""

    def capture_signals(self) -> contextlib.nullcontext[None]:  # type: ignore[override]
        return contextlib.nullcontext()


def main(argv: list[str] | None = None) -> None:
    args = service_args("dynsched controller", argv)
    config, names = load(args)

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        controller = Controller(bus=bus, config=config)
        exporter = PrometheusExporter()
        sock = socket.socket()
        sock.bind(("0.0.0.0", config.run.admin_port))
        # Where the CLI should reach us: 127.0.0.1 locally, the service name under compose.
        host, port = os.environ.get("DYNSCHED_ADVERTISE_HOST", "127.0.0.1"), sock.getsockname()[1]
        server = _QuietServer(uvicorn.Config(build_app(controller, exporter), log_level="warning"))
        api = asyncio.create_task(server.serve(sockets=[sock]))
        await bus.redis.set(names.controller_admin, f"{host}:{port}")
        try:
            await controller.run(stop)
        finally:
            server.should_exit = True
            await api

    run_until_stopped(body, redis_url=args.redis_url, names=names, run=config.run)


if __name__ == "__main__":
    main()
