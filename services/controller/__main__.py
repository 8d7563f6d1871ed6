"""`python -m services.controller --config FILE --redis-url URL`: controller + admin API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

import uvicorn

from services.controller.admin import PrometheusExporter, build_app
from services.controller.service import Controller
from shared.admin_auth import bind_admin_socket, check_bind, is_loopback, load_admin_token
from shared.bus import Bus
from shared.liveness import untrack
from shared.runtime import load, run_until_stopped, service_args, supervise


class _QuietServer(uvicorn.Server):
    """Leaves signals to the service runtime (which sets `stop`), instead of capturing them."""

    def capture_signals(self) -> contextlib.nullcontext[None]:  # type: ignore[override]
        return contextlib.nullcontext()


def main(argv: list[str] | None = None) -> None:
    args = service_args("dynsched controller", argv)
    config, names = load(args)
    host = config.run.admin_host
    try:
        token = load_admin_token()
        check_bind(host, token)
    except ValueError as exc:
        sys.exit(f"dynsched controller: error: {exc}")

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        controller = Controller(bus=bus, config=config)
        exporter = PrometheusExporter()
        sock = bind_admin_socket(host, config.run.admin_port)
        # Where the CLI should reach us: 127.0.0.1 locally, the service name under compose.
        advertised, port = os.environ.get("DYNSCHED_ADVERTISE_HOST", "127.0.0.1"), sock.getsockname()[1]
        app = build_app(controller, exporter, token=token, loopback=is_loopback(host))
        server = _QuietServer(uvicorn.Config(app, log_level="warning"))
        await bus.redis.set(names.controller_admin, f"{advertised}:{port}")

        async def serve_api() -> None:
            untrack()  # its liveness is that it answers /healthz
            await server.serve(sockets=[sock])
            if not stop.is_set():
                raise RuntimeError("the admin API server stopped on its own")

        async def run_controller() -> None:
            try:
                await controller.run(stop)
            finally:
                server.should_exit = True

        await supervise({"controller.api": serve_api(), "controller.events": run_controller()})

    run_until_stopped(body, redis_url=args.redis_url, names=names, service="controller",
                      run=config.run)


if __name__ == "__main__":
    main()
