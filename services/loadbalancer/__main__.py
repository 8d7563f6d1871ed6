"""`python -m services.loadbalancer --config FILE --redis-url URL`."""

from __future__ import annotations

import asyncio

from services.loadbalancer.service import LoadBalancer
from shared.bus import Bus
from shared.runtime import load, run_until_stopped, service_args


def main(argv: list[str] | None = None) -> None:
    args = service_args("dynsched load balancer", argv)
    config, names = load(args)

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        await LoadBalancer(bus=bus, initial_replica_ids=config.standalone_ids).run(stop)

    run_until_stopped(body, redis_url=args.redis_url, names=names, service="loadbalancer",
                      run=config.run)


if __name__ == "__main__":
    main()
