"""`python -m services.trainer --config FILE --redis-url URL`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.trainer.service import Trainer, TrainerBackend, claim_run_id
from shared.bus import Bus
from shared.config import Config
from shared.liveness import untrack
from shared.runtime import load, run_until_stopped, service_args


def build_backend(config: Config, run_dir: Path) -> TrainerBackend:
    if config.trainer.backend == "torch":
        from services.trainer.torch_backend import (  # heavy import, only when asked for
            GRPOConfig,
            TorchGRPOTrainer,
        )

        return TorchGRPOTrainer(GRPOConfig(
            model_path=config.trainer.model_dir, weights_root=str(run_dir.resolve() / "weights"),
            checkpoint_dir=config.trainer.checkpoint_dir or str(run_dir.resolve() / "checkpoints"),
            lr=config.trainer.learning_rate, seed=config.run.seed,
            transfer_address=config.rollout.weight_transfer_address,
            transfer_port=config.rollout.weight_transfer_port,
            push_timeout_s=config.rollout.weight_push_timeout_s))
    from services.trainer.sim_backend import SimTrainer

    return SimTrainer(config)


def main(argv: list[str] | None = None) -> None:
    args = service_args("dynsched trainer", argv)
    config, names = load(args)

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        run_dir = Path(config.run.work_dir) / await claim_run_id(bus)
        # Importing torch and loading the model take seconds to minutes: in a thread, so that the health
        # loop goes on reporting (the launcher kills a child whose report goes missing); the cycle's
        # loops are judged once they run.
        untrack()
        backend = await asyncio.to_thread(build_backend, config, run_dir)
        await Trainer(bus=bus, config=config, backend=backend).run(stop)

    run_until_stopped(body, redis_url=args.redis_url, names=names, service="trainer",
                      run=config.run)


if __name__ == "__main__":
    main()
