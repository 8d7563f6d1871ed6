"""`python -m services.trainer --config FILE --redis-url URL`."""

from __future__ import annotations

import asyncio

from services.trainer.service import Trainer, TrainerBackend
from shared.bus import Bus
from shared.config import Config
from shared.runtime import load, run_until_stopped, service_args


def build_backend(config: Config) -> TrainerBackend:
    if config.trainer.backend == "torch":
        from services.trainer.torch_backend import TorchGRPOTrainer  # heavy import, only when asked for

        return TorchGRPOTrainer.from_config(config)  # type: ignore[attr-defined,no-any-return]
    from services.trainer.sim_backend import SimTrainer

    return SimTrainer(config)


def main(argv: list[str] | None = None) -> None:
    args = service_args("dynsched trainer", argv)
    config, names = load(args)

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        await Trainer(bus=bus, config=config, backend=build_backend(config)).run(stop)

    run_until_stopped(body, redis_url=args.redis_url, names=names)


if __name__ == "__main__":
    main()
