"""Pure tests of the simulator's event engine, replica model and its view of a config."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import config_from_dict
from sim.engine import Engine, Process
from sim.model import Replica, Request, Sample
from sim.scenario import ReplicaTiming, load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def make_replica(engine: Engine, finished: list[tuple[float, str]], **overrides: float) -> Replica:
    cfg = ReplicaTiming(decode_step_s=0.01, batch_half_requests=overrides.get("batch_half_requests", 1e12),
                        max_running_requests=128, prefill_tokens_per_s=1e12)
    return Replica(engine, cfg, replica_id="r0", hybrid=False,
                   on_finish=lambda rep, req: finished.append((engine.now_s, req.request_id)),
                   on_busy=lambda rep, busy: None)


def test_events_at_the_same_time_run_in_scheduling_order() -> None:
    engine = Engine()
    seen: list[str] = []
    for name in "abc":
        engine.at(5.0, seen.append, name)
    engine.at(1.0, seen.append, "first")
    engine.run()
    assert seen == ["first", "a", "b", "c"]
    assert engine.now_s == 5.0


def test_a_process_waits_on_delays_and_signals() -> None:
    engine = Engine()
    ready = engine.signal("ready")
    log: list[tuple[float, str]] = []

    def proc() -> Process:
        yield 2.0
        log.append((engine.now_s, "slept"))
        yield ready
        log.append((engine.now_s, "signalled"))

    engine.start_process(proc())
    engine.at(7.0, ready.fire)
    engine.run()
    assert log == [(2.0, "slept"), (7.0, "signalled")]


def test_a_lone_request_decodes_at_the_batch_one_step_time() -> None:
    engine = Engine()
    finished: list[tuple[float, str]] = []
    replica = make_replica(engine, finished)
    replica.submit(Request("a", Sample(0, 1, 0.0), prompt_tokens=10, target_tokens=100))
    engine.run()
    assert finished == [(pytest.approx(1.0), "a")]  # 100 tokens x 0.01 s


def test_abort_keeps_partial_tokens_and_the_resume_finishes_the_rest() -> None:
    engine = Engine()
    finished: list[tuple[float, str]] = []
    replica = make_replica(engine, finished)
    req = Request("a", Sample(0, 1, 0.0), prompt_tokens=10, target_tokens=100)
    replica.submit(req)
    aborted: list[Request] = []
    engine.at(0.4, lambda: aborted.extend(replica.abort_all()))
    engine.at(2.0, replica.submit, req)
    engine.run()
    assert aborted == [req]
    assert finished == [(pytest.approx(2.6), "a")]  # 40 tokens before, 60 after the resume
    assert req.attempts_total == 2


def test_a_paused_engine_holds_requests_until_resume() -> None:
    engine = Engine()
    finished: list[tuple[float, str]] = []
    replica = make_replica(engine, finished)
    replica.pause()
    replica.submit(Request("a", Sample(0, 1, 0.0), prompt_tokens=1, target_tokens=10))
    engine.at(5.0, replica.resume)
    engine.run()
    assert finished == [(pytest.approx(5.1), "a")]


def test_decode_slows_down_as_the_batch_grows() -> None:
    engine = Engine()
    finished: list[tuple[float, str]] = []
    replica = make_replica(engine, finished, batch_half_requests=2.0)
    for name in "ab":
        replica.submit(Request(name, Sample(0, 2, 0.0), prompt_tokens=1, target_tokens=100))
    engine.run()
    # Two running requests: step = 0.01 * (1 + 2/2) = 0.02 s.
    assert [t for t, _ in finished] == [pytest.approx(2.0), pytest.approx(2.0)]


def test_shipped_scenarios_load() -> None:
    for path in SCENARIOS.rglob("*.yaml"):
        scenario = load_scenario(path)
        assert scenario.cluster.total_gpus > 0, path


def test_an_old_format_scenario_is_rejected_with_a_pointer_to_the_new_format() -> None:
    raw = {"name": "x", "cluster": {"train_gpus": 8, "rollout_gpus": 8}}
    with pytest.raises(ValueError, match=r"unknown key cluster \(an old scenario file\?"):
        config_from_dict(raw)


def test_splits_must_fit_whole_replicas() -> None:
    scenario = load_scenario(SCENARIOS / "small_production_bound.yaml")
    with pytest.raises(ValueError, match="divisible by tensor_model_parallel_size=8"):
        scenario.with_split(16, 20)
    with pytest.raises(ValueError, match="multiple of simulator.trainer_unit_gpus=8"):
        scenario.with_split(12, 16)
