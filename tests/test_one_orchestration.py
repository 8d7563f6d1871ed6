"""The services and the simulator run one orchestration: the same `core` objects, driven two ways.

A service drives core.executor / core.trainer_cycle / core.sample_lifecycle over Redis;
the simulator drives them on its virtual clock. These tests check that both build the
same classes, that `sim/` holds no orchestration of its own, and (behaviourally) that
the controller service, fed the trainer events and peer answers of a simulated run,
asks for exactly the operations the simulator performed and gives the same replies.
"""

from __future__ import annotations

import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from core import executor as ex
from core import trainer_cycle as tc
from core.controller import ControllerCore
from core.executor import ExecutorCore
from core.sample_lifecycle import SampleLifecycle
from core.trainer_cycle import TrainerCycle
from services.controller.service import Controller
from services.rollouter.prompts import build_prompt_source
from services.rollouter.service import Rollouter
from services.trainer.service import Trainer
from services.trainer.sim_backend import SimTrainer
from shared.bus import Bus
from shared.names import Names
from shared.schema import TrainerEvent, TrainerPhase, TrainerReply, decode
from sim.run import Simulation
from sim.scenario import Scenario, load_scenario
from tests.stack import sim_config

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "small_production_bound.yaml"


def test_the_services_and_the_simulator_build_the_same_core_objects() -> None:
    config = sim_config()
    bus = Bus(_FakeRedis(), Names("t"))  # type: ignore[arg-type]
    controller = Controller(bus=bus, config=config)
    trainer = Trainer(bus=bus, config=config, backend=SimTrainer(config))
    rollouter = Rollouter(bus=bus, config=config, prompts=build_prompt_source(config))
    sim = Simulation(load_scenario(SCENARIO))
    assert type(controller.executor_core) is type(sim.executor) is ExecutorCore
    assert type(controller.core) is type(sim.core) is ControllerCore
    assert type(trainer.cycle) is type(sim.cycle) is TrainerCycle
    assert type(rollouter.lifecycle) is type(sim.rollouter.lifecycle) is SampleLifecycle


def test_the_rollouter_live_and_in_the_planner_keeps_as_many_samples_in_flight_per_hybrid() -> None:
    config = load_scenario(ROOT / "configs" / "sim_16_16_adaptive.yaml").config
    at = config.async_training.model_copy(update={"hybrid_concurrent_samples_per_replica": 8})
    config = config.model_copy(update={"async_training": at})
    rollouter = Rollouter(bus=Bus(_FakeRedis(), Names("t")), config=config,  # type: ignore[arg-type]
                          prompts=build_prompt_source(config))
    sim = Simulation(Scenario.from_config(config))
    capacities = []
    for lifecycle in (rollouter.lifecycle, sim.rollouter.lifecycle):
        now_s = lifecycle.history.points[-1][0]  # the live clock is Unix time, the planner's starts at 0
        lifecycle.set_replicas(2, now_s=now_s)  # the standalones alone
        alone = lifecycle.max_concurrent
        lifecycle.set_replicas(4, now_s=now_s)  # and both hybrids
        capacities.append((alone, lifecycle.max_concurrent))
    assert capacities == [(32, 48), (32, 48)]  # 2 x 16, then + 2 x 8


STATIC_CONTEXT_FIELDS = ("required_samples", "trigger_parameter_sync_step", "staleness_threshold",
                         "only_hybrid", "num_hybrid_replicas", "num_standalone_replicas",
                         "concurrent_samples_per_replica", "total_samples")



def _wiring(executor: ExecutorCore) -> list[Any]:
    core = executor.core
    return [core.policy.policy_name, core.enable_rebalance, core.fold_hybrid_sync, executor.overlap_wake,
            executor.overlap_sleep, *(getattr(core.ctx, name) for name in STATIC_CONTEXT_FIELDS)]


@pytest.mark.parametrize("path", [SCENARIO, ROOT / "configs" / "sim_16_16_adaptive.yaml",
                                  ROOT / "configs" / "sim_16_16_static.yaml"], ids=lambda p: p.stem)
def test_the_services_and_the_simulator_build_the_same_policy_context_and_mechanics(path: Path) -> None:
    scenario = load_scenario(path)
    bus = Bus(_FakeRedis(), Names("t"))  # type: ignore[arg-type]
    live, planned = Controller(bus=bus, config=scenario.config).executor_core, Simulation(scenario).executor
    assert _wiring(live) == _wiring(planned)
    given = scenario.config.async_training.concurrent_samples_per_replica
    assert live.core.ctx.concurrent_samples_per_replica == given > 0
    assert live.core.ctx.total_samples == scenario.config.data.total_rollout_steps > 0


def test_a_run_without_dynamic_scheduling_uses_static_fully_async_live_and_in_the_planner() -> None:
    """Whatever policy the file names: with use_dynamic_resource_scheduling off there is nothing to lend."""
    scenario = load_scenario(SCENARIO).with_changes({
        "async_training.use_dynamic_resource_scheduling": False,
        "async_training.dynamic_schedule_policy": "default"})
    bus = Bus(_FakeRedis(), Names("t"))  # type: ignore[arg-type]
    live, planned = Controller(bus=bus, config=scenario.config).core, Simulation(scenario).core
    assert live.policy.policy_name == planned.policy.policy_name == "static_fully_async"
    assert live.hybrid_ids == planned.hybrid_ids == ()


ORCHESTRATION_NAMES = {
    # controller commands (their semantics are core.executor's)
    "WaitForSamples", "RemoveReplicas", "AbortReplicas", "SleepReplicas", "WakeReplicas", "SyncWeights",
    "AddReplicas", "ResumeReplicas", "Rebalance", "ResetStaleness",
    # the controller core's calls (made by core.executor) and the feed's (made by core.sample_lifecycle)
    "begin_micro_step", "finish_deactivate", "record_collection", "begin_sync", "finish_activate",
    "finish_sync",
    "check_pause", "try_resume", "on_submit", "on_generated", "on_idle_start", "on_idle_end",
}


def test_the_simulator_has_no_orchestration_of_its_own() -> None:
    """sim/ names no controller command and makes no controller-core or flow-control call."""
    for path in sorted((ROOT / "sim").glob("*.py")):
        # tokens, not ast.parse: CPython 3.11.7's parser can fail at random with "AST constructor
        # recursion depth mismatch" inside pytest (seen here and in test_architecture)
        with path.open() as source:
            used = {t.string for t in tokenize.generate_tokens(source.readline) if t.type == tokenize.NAME}
        assert not used & ORCHESTRATION_NAMES, (path.name, sorted(used & ORCHESTRATION_NAMES))


# ---- behaviour: the controller service replays a simulated run -------------------------------


@dataclass
class _Handshake:
    event: TrainerEvent
    start_s: float
    ops: list[tuple[ex.Op, Any, float]] = field(default_factory=list)
    """(op, its result, the clock after it), in the order the simulator performed them."""
    reply: TrainerReply | None = None


def _scenario(policy: str, changes: dict[str, Any] | None = None) -> Scenario:
    return load_scenario(SCENARIO).with_policy(policy).with_prompts(320).with_changes(changes or {})


FAST_SWITCHES = {"async_training.dynamic_schedule_fold_hybrid_sync": True,
                 "async_training.dynamic_schedule_overlap_wake": True,
                 "async_training.dynamic_schedule_overlap_sleep": True, "trainer.offload_s": 2.0}


def _record_simulated_run(scenario: Scenario) -> tuple[list[_Handshake], Simulation]:
    sim = Simulation(scenario)
    log: list[_Handshake] = []
    perform, perform_trainer = sim._perform, sim._perform_trainer

    def recording_perform(op: ex.Op) -> Any:
        result = yield from perform(op)
        log[-1].ops.append((op, result, sim.engine.now_s))
        return result

    def recording_trainer(op: tc.TrainerOp) -> Any:
        event = op.event if isinstance(op, tc.Handshake | tc.Send) else None
        if event is not None and (event.phase in tc.REPLY_TO or event.phase is TrainerPhase.COLLECTED):
            log.append(_Handshake(event=event, start_s=sim.engine.now_s))
        result = yield from perform_trainer(op)
        if isinstance(op, tc.Handshake):
            log[-1].reply = result
        return result

    sim._perform = recording_perform  # type: ignore[method-assign]
    sim._perform_trainer = recording_trainer  # type: ignore[method-assign]
    sim.run()
    return log, sim


class _FakeRedis:
    """Just what the controller's persist and publish touch."""

    def __init__(self) -> None:
        self.published: list[dict[Any, Any]] = []

    async def set(self, key: str, value: bytes) -> None:
        pass

    async def xadd(self, stream: str, fields: dict[Any, Any], **options: Any) -> bytes:
        self.published.append(fields)  # options: the bus's stream cap (maxlen, approximate)
        return b"1-0"


class _ReplayExecutor:
    """Answers each op with the simulator's result, after checking it is the op the simulator saw."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.expected: list[tuple[ex.Op, Any, float]] = []

    async def perform(self, op: ex.Op) -> Any:
        expected_op, result, after_s = self.expected.pop(0)
        assert op == expected_op
        self.clock[0] = after_s
        return result


@pytest.mark.parametrize(("policy", "changes"), [("default", None), ("adaptive", FAST_SWITCHES)])
async def test_the_controller_service_asks_for_exactly_the_operations_the_simulator_performed(
        policy: str, changes: dict[str, Any] | None) -> None:
    """...and so fills the policy's measured context fields identically (the snapshot holds the ctx)."""
    log, sim = _record_simulated_run(_scenario(policy, changes))
    assert sim.core.activations > 0 and sim.core.deactivations > 0  # the run exercised both switches
    assert sim.core.ctx.samples_per_replica_s > 0 and sim.core.ctx.trainer_s_per_micro_step > 0
    fresh = Simulation(_scenario(policy, changes))
    redis = _FakeRedis()
    controller = Controller(bus=Bus(redis, Names("t")), config=sim_config())  # type: ignore[arg-type]
    clock = [0.0]
    controller.executor_core = ExecutorCore(core=fresh.core, clock=lambda: clock[0],
                                            overlap_wake=fresh.executor.overlap_wake,
                                            overlap_sleep=fresh.executor.overlap_sleep)
    replay = _ReplayExecutor(clock)
    controller.executor = replay  # type: ignore[assignment]
    for handshake in log:
        clock[0] = handshake.start_s
        replay.expected = [entry for entry in handshake.ops if not isinstance(entry[0], ex.Checkpoint)]
        redis.published.clear()
        await controller._handle(handshake.event)
        assert replay.expected == [], f"{handshake.event.phase} left ops unperformed"
        replies = [decode(fields) for fields in redis.published]
        assert replies == ([handshake.reply] if handshake.reply else [])
    assert sum(len(h.ops) for h in log) > 2 * len(log)  # the replay compared real work
    assert controller.core.snapshot() == sim.core.snapshot()
