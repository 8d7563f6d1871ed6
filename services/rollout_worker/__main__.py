"""`python -m services.rollout_worker --replica-id ID [--replica-id ID2 ...]`: one process, one or
more replicas."""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

from core.replica import ReplicaState
from services.rollout_worker.engine import Engine
from services.rollout_worker.startup import StartupHeartbeat
from services.rollout_worker.worker import RolloutWorker
from shared.bus import Bus
from shared.config import Config
from shared.liveness import untrack
from shared.names import worker_process_name
from shared.runtime import load, run_until_stopped, service_args, supervise


def build_engine(config: Config, replica_id: str) -> Engine:
    if config.rollout.backend == "vllm":
        from services.rollout_worker.vllm_engine import SamplingConfig, VllmEngine, VllmEngineConfig  # heavy

        rollout = config.rollout
        return VllmEngine(VllmEngineConfig(
            model_path=config.trainer.model_dir, gpu_memory_utilization=rollout.gpu_memory_utilization,
            sampling=SamplingConfig(temperature=rollout.temperature, seed=config.run.seed),
            max_model_len=rollout.max_model_len, max_num_seqs=rollout.max_num_seqs, seed=config.run.seed,
            tensor_parallel_size=rollout.tensor_model_parallel_size,
            kv_cache_memory_bytes=(rollout.hybrid_kv_cache_memory_bytes or None)
            if replica_id in config.hybrid_ids else None,
            weight_transfer="" if (t := config.weight_transport(replica_id)) == "filesystem" else t))
    from services.rollout_worker.sim_engine import SimEngine

    return SimEngine(config=config, hybrid=replica_id in config.hybrid_ids)


def main(argv: list[str] | None = None) -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--replica-id", action="append", required=True)

    args = service_args("dynsched rollout worker", argv, extra)
    config, names = load(args)
    service = worker_process_name(args.replica_id)

    async def body(bus: Bus, stop: asyncio.Event) -> None:
        untrack()  # while engines start, the start-up lease says alive; the workers' loops, once they run
        incarnations = {replica_id: uuid.uuid4().hex[:12] for replica_id in args.replica_id}
        beats = {names.worker_heartbeat(r): incarnation for r, incarnation in incarnations.items()}
        # The health report too: a blocking engine start stalls the event loop's health loop, and the
        # launcher would take the missing report for a hang (services/restarts.py: HangWatch).
        beats[names.health(service)] = json.dumps({f"{service}.startup": 0.0})
        workers = []
        with StartupHeartbeat(args.redis_url, beats):  # alive while the engines start (vLLM: tens of s)
            for replica_id in args.replica_id:
                engine = build_engine(config, replica_id)
                await engine.start()
                initial = ReplicaState.SLEEPING if replica_id in config.hybrid_ids else ReplicaState.SERVING
                workers.append(RolloutWorker(bus=bus, replica_id=replica_id, engine=engine,
                                             initial_state=initial, incarnation=incarnations[replica_id],
                                             push_timeout_s=config.rollout.weight_push_timeout_s))
        try:
            await supervise({f"replica.{w.replica_id}": w.run(stop) for w in workers})
        finally:
            for worker in workers:
                await worker.engine.close()

    run_until_stopped(body, redis_url=args.redis_url, names=names,
                      service=service, run=config.run)


if __name__ == "__main__":
    main()
