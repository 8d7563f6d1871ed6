"""`python -m services.rollouter --config FILE --redis-url URL`."""

from __future__ import annotations

import asyncio

from services.rollouter.prompts import build_prompt_source
from services.rollouter.service import Rollouter
from shared.bus import Bus
from shared.runtime import load, run_until_stopped, service_args


def main(argv: list[str] | None = None) -> None:
    args = service_args("dynsched rollouter", argv)
    config, names = load(args)

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        await Rollouter(bus=bus, config=config, prompts=build_prompt_source(config)).run(stop)

    run_until_stopped(body, redis_url=args.redis_url, names=names, service="rollouter",
                      run=config.run)


if __name__ == "__main__":
    main()
