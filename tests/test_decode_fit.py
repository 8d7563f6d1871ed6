"""What the controller learns of its engines' step against their batch, and what the policy makes of it.

Pure: core.measure's InflightClock and DecodeFit, the simulated replica's report of a finished attempt,
and the context's hybrid_production_gain; one simulation checks the fit end to end on the planner.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.measure import DecodeFit, InflightClock, RateMeter
from policies import DynamicScheduleContext
from sim.engine import Engine
from sim.model import Replica, Request, Sample
from sim.run import Simulation
from sim.scenario import ReplicaTiming, load_scenario

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def linear_engine_fit(*, slowdown: float, batches: range, step_s: float = 0.01) -> DecodeFit:
    fit = DecodeFit()
    for batch in batches:
        fit.add(tokens=100, seconds=100 * step_s * (1 + slowdown * batch), inflight=batch)
    return fit


def test_a_fit_over_several_batch_sizes_recovers_a_linear_engines_slowdown():
    assert linear_engine_fit(slowdown=1 / 32, batches=range(1, 100)).batch_slowdown == pytest.approx(1 / 32)


def test_an_engine_seen_at_one_batch_size_or_with_a_flat_step_shows_no_slowdown():
    assert linear_engine_fit(slowdown=1 / 32, batches=range(40, 41)).batch_slowdown == 0.0
    assert linear_engine_fit(slowdown=0.0, batches=range(1, 100)).batch_slowdown == 0.0
    assert DecodeFit().batch_slowdown == 0.0


def test_attempts_without_tokens_time_or_batch_are_left_out_of_the_fit():
    fit = DecodeFit()
    fit.add(tokens=0, seconds=1.0, inflight=4)
    fit.add(tokens=10, seconds=0.0, inflight=4)
    fit.add(tokens=10, seconds=1.0, inflight=0.0)  # an engine that did not report its batch
    assert fit == DecodeFit()


def test_the_rollouters_report_carries_the_fit_to_the_controller_which_keeps_it_across_versions():
    fit = linear_engine_fit(slowdown=0.05, batches=range(1, 50))
    assert DecodeFit.from_metrics(fit.to_metrics()) == fit
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    meter.record_decode_fit({})  # a report without the sums (an older rollouter) changes nothing
    assert meter.decode_batch_slowdown == 0.0
    meter.record_decode_fit(fit.to_metrics())
    meter.record_decode_fit(linear_engine_fit(slowdown=0.05, batches=range(20, 21)).to_metrics())
    assert meter.decode_batch_slowdown == pytest.approx(0.05)
    assert 1 < meter.decode_mean_inflight < 49


def test_the_inflight_clock_gives_the_mean_requests_an_engine_held_over_an_interval():
    clock = InflightClock()
    clock.change(0.0, +1)
    start = clock.integral(0.0)
    clock.change(1.0, +3)  # four from t=1 to t=3
    clock.change(3.0, -3)
    assert (clock.integral(4.0) - start) / 4.0 == pytest.approx((1 + 4 * 2 + 1) / 4.0)
    assert clock.count == 1


def run_replica(*, requests: int, prefill_tokens_per_s: float) -> tuple[Engine, list[Request]]:
    engine = Engine()
    finished: list[Request] = []
    cfg = ReplicaTiming(decode_step_s=0.01, batch_half_requests=32.0, max_running_requests=128,
                        prefill_tokens_per_s=prefill_tokens_per_s)
    replica = Replica(engine, cfg, replica_id="r0", hybrid=False,
                      on_finish=lambda rep, req: finished.append(req), on_busy=lambda rep, busy: None)
    for i in range(requests):
        replica.submit(Request(f"s{i}", Sample(i, 1, 0.0), prompt_tokens=100, target_tokens=200))
    engine.run()
    return engine, finished


def test_a_simulated_replica_reports_each_finished_attempts_decode_time_tokens_and_batch():
    _, finished = run_replica(requests=4, prefill_tokens_per_s=1e12)
    assert len(finished) == 4
    for req in finished:
        assert req.decode_tokens == 200
        assert req.mean_inflight == pytest.approx(4.0)
        assert req.decode_s == pytest.approx(200 * 0.01 * (1 + 4 / 32))


def test_a_simulated_attempts_decode_time_leaves_its_prefill_out():
    engine, (req,) = run_replica(requests=1, prefill_tokens_per_s=1000.0)  # 100 prompt tokens: 0.1 s
    assert req.decode_s == pytest.approx(200 * 0.01 * (1 + 1 / 32))
    assert engine.now_s == pytest.approx(0.1 + req.decode_s)


def test_the_planner_measures_the_live_configs_engine_slowdown_from_its_own_attempts():
    sim = Simulation(load_scenario(CONFIGS / "sim_16_16_adaptive.yaml"))
    sim.run()
    assert sim.core.ctx.decode_batch_slowdown == pytest.approx(1 / 32, rel=0.5)  # rollout.sim.batch_slowdown
    assert sim.core.ctx.decode_mean_inflight > 1


def gain_ctx(*, per_replica: int, staleness: float = 0.5, slowdown: float = 0.0,
             mean_inflight: float = 0.0) -> DynamicScheduleContext:
    """2 standalones + 2 hybrids, required 16 x trigger 4: max_required 96 at staleness 0.5."""
    return DynamicScheduleContext(required_samples=16, trigger_parameter_sync_step=4,
                                  staleness_threshold=staleness, num_standalone_replicas=2,
                                  num_hybrid_replicas=2, concurrent_samples_per_replica=per_replica,
                                  decode_batch_slowdown=slowdown, decode_mean_inflight=mean_inflight)


def test_at_a_flat_step_hybrids_add_production_as_they_add_requests_in_flight():
    assert gain_ctx(per_replica=16).hybrid_production_gain == 1.0  # 32 -> 64 samples in flight
    assert gain_ctx(per_replica=32).hybrid_production_gain == 0.5  # 64 -> 96 (max_required)
    assert gain_ctx(per_replica=48).hybrid_production_gain == 0.0  # the standalones hold max_required
    assert gain_ctx(per_replica=0).hybrid_production_gain == 1.0  # not given: a hybrid as a standalone
    fewer = gain_ctx(per_replica=40)
    fewer.hybrid_concurrent_samples_per_replica = 8  # 80 -> 96: a fifth more, not twice as much
    assert fewer.hybrid_production_gain == pytest.approx(0.2)


def test_spreading_the_same_requests_over_more_engines_pays_by_the_measured_slowdown():
    # 96 samples on 2 engines -> 4: each engine's batch halves; a token seen at 48 in flight runs at
    # (1 + 48/32) / (1 + 24/32) the speed
    spread = gain_ctx(per_replica=48, slowdown=1 / 32, mean_inflight=48)
    assert spread.hybrid_production_gain == pytest.approx(2.5 / 1.75 - 1)
    # a long tail decoded nearly alone (the tokens saw 4 in flight on average) gains little
    tail = gain_ctx(per_replica=48, slowdown=1 / 32, mean_inflight=4)
    assert 0 < tail.hybrid_production_gain < 0.1


def test_nothing_is_credited_for_spreading_where_nothing_carries_over_to_the_next_version():
    # staleness 0: the version's samples all start at its sync, on the standalones, before hybrids join
    on_policy = gain_ctx(per_replica=48, staleness=0.0, slowdown=1 / 32, mean_inflight=48)
    assert on_policy.carry_over_limit_samples == 0
    assert on_policy.hybrid_production_gain == 0.0
