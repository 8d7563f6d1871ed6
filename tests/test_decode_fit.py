"""What the controller learns of its engines' step against their batch, and what the policy makes of it.

Pure: core.measure's InflightClock and DecodeFit, the simulated replica's report of a finished attempt,
and the context's hybrid_production_gain; one simulation checks the fit end to end on the planner.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.measure import DecodeFit, InflightClock, RateMeter
from core.metrics import DECODE_LOAD_COST
from policies import DynamicScheduleContext
from sim.engine import Engine
from sim.model import Replica, Request, Sample
from sim.run import Simulation
from sim.scenario import ReplicaTiming, load_scenario

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def engine_fit(*, per_request: float, per_context_token: float = 0.0,
               loads: list[tuple[float, float]], step_s: float = 0.01) -> DecodeFit:
    """Attempts of 100 tokens on an engine whose step is step_s (1 + per_request r + per_context_token c)."""
    fit = DecodeFit()
    for requests, context in loads:
        seconds = 100 * step_s * (1 + per_request * requests + per_context_token * context)
        fit.add(tokens=100, seconds=seconds, inflight=requests, context=context)
    return fit


def test_a_fit_over_several_batch_sizes_recovers_a_linear_engines_load_cost():
    # step = s (1 + r / 32), contexts of 500 tokens a request: at the mean batch 50, the load's part of a
    # step is 50 / 32 of the fixed part
    fit = engine_fit(per_request=1 / 32, loads=[(r, 500.0 * r) for r in range(1, 100)])
    assert fit.mean_inflight == pytest.approx(50)
    assert fit.load_cost == pytest.approx(50 / 32)


def test_a_step_that_grows_with_the_context_held_is_measured_even_where_the_tail_holds_long_contexts():
    # KV reads: step = s (1 + c / 100,000). The requests' count alone misleads where few requests hold
    # long contexts (the tail): at the same count the contexts differ, so the plane separates the two.
    loads = [(r, r * per_request) for r in range(1, 100, 7) for per_request in (500.0, 2000.0, 8000.0)]
    fit = engine_fit(per_request=0.0, per_context_token=1e-5, loads=loads)
    mean_context = fit.c / fit.w
    assert fit.load_cost == pytest.approx(1e-5 * mean_context)


def test_an_engine_seen_at_one_batch_size_or_with_a_flat_step_shows_no_load_cost():
    assert engine_fit(per_request=1 / 32, loads=[(40, 20_000.0)] * 5).load_cost == 0.0
    assert engine_fit(per_request=0.0, loads=[(r, 500.0 * r) for r in range(1, 100)]).load_cost == 0.0
    assert DecodeFit().load_cost == 0.0


def test_loads_within_a_tenth_of_their_mean_are_too_close_to_extrapolate_a_load_cost_from():
    # the start-up ramp's first attempts, every engine at 120-128 requests: a slope measured there would be
    # stretched over the whole batch down to none
    assert engine_fit(per_request=1 / 32, loads=[(r, 500.0 * r) for r in range(120, 129)]).load_cost == 0.0
    spread = engine_fit(per_request=1 / 32, loads=[(r, 500.0 * r) for r in range(64, 129)])
    assert spread.load_cost == pytest.approx(spread.mean_inflight / 32)


def test_attempts_without_tokens_time_or_batch_are_left_out_of_the_fit():
    fit = DecodeFit()
    fit.add(tokens=0, seconds=1.0, inflight=4)
    fit.add(tokens=10, seconds=0.0, inflight=4)
    fit.add(tokens=10, seconds=1.0, inflight=0.0)  # an engine that did not report its load
    assert fit == DecodeFit()


def test_the_rollouters_report_carries_the_fit_to_the_controller_which_keeps_it_across_versions():
    fit = engine_fit(per_request=0.05, loads=[(r, 300.0 * r) for r in range(1, 50)])
    assert DecodeFit.from_metrics(fit.to_metrics()) == fit
    meter = RateMeter(num_standalone=2, num_hybrid=2)
    meter.record_decode_fit({})  # a report without the sums (an older rollouter) changes nothing
    assert meter.decode_load_cost == 0.0
    meter.record_decode_fit(fit.to_metrics())
    assert meter.decode_load_cost == pytest.approx(fit.load_cost)
    meter.record_decode_fit(engine_fit(per_request=0.05, loads=[(40, 12_000.0)]).to_metrics())
    assert 0.05 * 25 < meter.decode_load_cost < 0.05 * 40  # the newer version's load weighs more


def test_the_load_clock_gives_the_mean_requests_and_context_an_engine_held_over_an_interval():
    clock = InflightClock()
    clock.change(0.0, requests=1, tokens=100)
    start = clock.integrals(0.0)
    clock.change(1.0, requests=3, tokens=300)  # four, holding 400 tokens, from t=1 to t=3
    clock.change(2.0, tokens=200)  # they decoded 200 more at t=2
    clock.change(3.0, requests=-3, tokens=-450)
    requests_s, context_s = clock.integrals(4.0)
    assert (requests_s - start[0]) / 4.0 == pytest.approx((1 + 4 * 2 + 1) / 4.0)
    assert (context_s - start[1]) / 4.0 == pytest.approx((100 + 400 + 600 + 150) / 4.0)
    assert clock.count == 1 and clock.tokens == 150


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
    result = sim.run()
    fit = sim.executor.meter._decode
    # rollout.sim.batch_slowdown 1/32: the load's part of a step at the mean batch the tokens saw
    assert sim.core.ctx.decode_load_cost == pytest.approx(fit.mean_inflight / 32, rel=0.5)
    assert result.cycles[-1][DECODE_LOAD_COST] > 0  # reported with the cycle's metrics


def gain_ctx(*, per_replica: int, staleness: float = 0.5, load_cost: float = 0.0) -> DynamicScheduleContext:
    """2 standalones + 2 hybrids, required 16 x trigger 4: max_required 96 at staleness 0.5."""
    return DynamicScheduleContext(required_samples=16, trigger_parameter_sync_step=4,
                                  staleness_threshold=staleness, num_standalone_replicas=2,
                                  num_hybrid_replicas=2, concurrent_samples_per_replica=per_replica,
                                  decode_load_cost=load_cost)


def test_at_a_flat_step_hybrids_add_production_as_they_add_requests_in_flight():
    assert gain_ctx(per_replica=16).hybrid_production_gain == 1.0  # 32 -> 64 samples in flight
    assert gain_ctx(per_replica=32).hybrid_production_gain == 0.5  # 64 -> 96 (max_required)
    assert gain_ctx(per_replica=48).hybrid_production_gain == 0.0  # the standalones hold max_required
    assert gain_ctx(per_replica=0).hybrid_production_gain == 1.0  # not given: a hybrid as a standalone
    fewer = gain_ctx(per_replica=40)
    fewer.hybrid_concurrent_samples_per_replica = 8  # 80 -> 96: a fifth more, not twice as much
    assert fewer.hybrid_production_gain == pytest.approx(0.2)


def test_spreading_the_same_requests_over_more_engines_pays_by_the_measured_load_cost():
    # 96 samples on 2 engines -> 4: each engine's load halves; with the load's part of a step 1.5 times
    # the fixed part, a token runs (1 + 1.5) / (1 + 0.75) times as fast
    spread = gain_ctx(per_replica=48, load_cost=1.5)
    assert spread.hybrid_production_gain == pytest.approx(2.5 / 1.75 - 1)
    # a long tail decoded nearly alone (a small load cost at the load its tokens saw) gains little
    assert 0 < gain_ctx(per_replica=48, load_cost=0.1).hybrid_production_gain < 0.05


def test_nothing_is_credited_for_spreading_where_nothing_carries_over_to_the_next_version():
    # staleness 0: the version's samples all start at its sync, on the standalones, before hybrids join
    on_policy = gain_ctx(per_replica=48, staleness=0.0, load_cost=1.5)
    assert on_policy.carry_over_limit_samples == 0
    assert on_policy.hybrid_production_gain == 0.0
