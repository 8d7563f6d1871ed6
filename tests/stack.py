"""Test harness: the whole service stack in one event loop, against a real Redis.

Every service gets its own Redis client and talks to the others only over
streams, exactly as in separate processes; this just saves the process
start-up time per test. (Separate processes are exercised by the launcher
and controller-restart tests.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from core.replica import ReplicaState
from services.controller.service import Controller
from services.launcher import sample_counts
from services.loadbalancer.service import LoadBalancer
from services.rollout_worker.sim_engine import SimEngine
from services.rollout_worker.worker import RolloutWorker
from services.rollouter.prompts import build_prompt_source
from services.rollouter.service import Rollouter
from services.trainer.service import Trainer
from services.trainer.sim_backend import SimTrainer
from shared.bus import Bus, text
from shared.config import Config, config_from_dict
from shared.names import Names, RunStateField, RunStatus
from shared.schema import AuditEvent, Sample, decode
from shared.streams import connect


def sim_config(**overrides: Any) -> Config:
    """A small, fast sim run; `overrides` are section dicts merged over the defaults."""
    base: dict[str, dict[str, Any]] = {
        "run": {"time_scale": 0.005, "seed": 0, "namespace": "test"},
        "data": {"total_rollout_steps": 64, "n": 2, "max_response_length": 512, "prompt_length": 16},
        "trainer": {"ppo_mini_batch_size": 4, "num_gpus": 2, "time_per_sample_s": 4.0, "offload_s": 1.0},
        "async_training": {"staleness_threshold": 0.5, "trigger_parameter_sync_step": 2,
                           "use_dynamic_resource_scheduling": True, "dynamic_schedule_deactivate_ratio": 0.5,
                           "concurrent_samples_per_replica": 4},
        "rollout": {"nnodes": 1, "n_gpus_per_node": 2, "tensor_model_parallel_size": 1, "retry_delay_s": 1.0},
    }
    for section, values in overrides.items():
        base.setdefault(section, {}).update(values)
    return config_from_dict(base)


def consumer_group_streams(names: Names, replica_ids: tuple[str, ...]) -> list[str]:
    """Every stream a service reads with a consumer group: the MessageQueue, the request and result
    paths, every service's commands, the rollouter's regenerate requests, the trainer's step-phase
    events and replies, and the requests and commands of the given replicas' workers."""
    return [names.mq, names.lb_requests, names.lb_results, names.lb_commands, names.rollouter_results,
            names.rollouter_commands, names.rollouter_regenerate, names.trainer_events, names.trainer_replies,
            names.trainer_commands,
            *(stream for replica_id in replica_ids
              for stream in (names.worker_requests(replica_id), names.worker_commands(replica_id)))]


class Stack:
    def __init__(self, config: Config, redis_url: str) -> None:
        self.config = config
        self.redis_url = redis_url
        self.names = Names(config.run.namespace)
        self.stop = asyncio.Event()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.buses: list[Bus] = []
        self.controller: Controller | None = None

    def bus(self) -> Bus:
        run = self.config.run
        bus = Bus(connect(self.redis_url, retry_window_s=run.redis_retry_window_s), self.names,
                  retention_s=run.stream_retention_s, dead_letter_maxlen=run.dead_letter_maxlen,
                  event_maxlen=run.event_stream_maxlen)
        self.buses.append(bus)
        return bus

    async def start(self, *, without: tuple[str, ...] = ()) -> None:
        config = self.config
        if "controller" not in without:
            self.start_controller()
        services: dict[str, Callable[[], Any]] = {
            "loadbalancer": lambda: LoadBalancer(bus=self.bus(), initial_replica_ids=config.standalone_ids),
            "rollouter": lambda: Rollouter(bus=self.bus(), config=config,
                                           prompts=build_prompt_source(config)),
            "trainer": self.start_trainer,
        }
        for name, build in services.items():
            if name == "trainer" and name not in without:
                build()
            elif name not in without:
                self.tasks[name] = asyncio.create_task(build().run(self.stop))
        for replica_id in (r for r in config.standalone_ids + config.hybrid_ids if r not in without):
            engine = SimEngine(config=config, hybrid=replica_id in config.hybrid_ids)
            await engine.start()
            initial = ReplicaState.SLEEPING if replica_id in config.hybrid_ids else ReplicaState.SERVING
            worker = RolloutWorker(bus=self.bus(), replica_id=replica_id, engine=engine,
                                   initial_state=initial)
            self.tasks[replica_id] = asyncio.create_task(worker.run(self.stop))

    def start_trainer(self) -> Trainer:
        trainer = Trainer(bus=self.bus(), config=self.config, backend=SimTrainer(self.config))
        self.tasks["trainer"] = asyncio.create_task(trainer.run(self.stop))
        return trainer

    def start_controller(self) -> Controller:
        self.controller = Controller(bus=self.bus(), config=self.config)
        self.tasks["controller"] = asyncio.create_task(self.controller.run(self.stop))
        return self.controller

    async def wait_done(self, timeout_s: float = 60.0) -> None:
        redis = self.buses[0].redis
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, task in self.tasks.items():
                if task.done() and task.exception():
                    raise RuntimeError(f"{name} crashed") from task.exception()
            if text(await redis.hget(self.names.run_state, RunStateField.STATUS) or b"") == RunStatus.DONE:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"run not done after {timeout_s} s; trainer at "
                           f"{await redis.hgetall(self.names.trainer_state)}")

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait(list(self.tasks.values()), timeout=10)
        for bus in self.buses:
            await bus.redis.aclose()

    # -- reading what happened ---------------------------------------------------------

    async def audit(self) -> list[AuditEvent]:
        entries = await self.buses[0].redis.xrange(self.names.audit)
        return [e for e in (decode(fields) for _, fields in entries) if isinstance(e, AuditEvent)]

    async def samples(self) -> list[Sample]:
        entries = await self.buses[0].redis.xrange(self.names.mq)
        return [s for s in (decode(fields) for _, fields in entries) if isinstance(s, Sample)]

    async def accounting(self) -> dict[str, int]:
        """Counts per sample state (from the per-sample hash), fed, LOST and DUPLICATED."""
        redis = self.buses[0].redis
        accounting, states = (await redis.hgetall(self.names.accounting),
                              await redis.hgetall(self.names.sample_states))
        return sample_counts({text(k): text(v) for k, v in accounting.items()},
                             {text(k): text(v) for k, v in states.items()})
