"""End-to-end runs of the whole stack (sim engines, real Redis), checked from the recorded
audit stream, the MessageQueue stream and the accounting hash."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import httpx
import pytest
import yaml

from core import controller as cc
from core.measure import HANDED_OVER, HANDED_OVER_ON_TIME, DecodeFit
from core.metrics import DECODE_LOAD_COST
from services.controller.admin import PrometheusExporter, build_app
from services.launcher import LOST
from shared.config import config_to_dict
from shared.names import AccountingField, RolloutStateField, TrainerStateField
from shared.schema import AuditEvent, AuditKind, AuditPhase, CycleMetrics, ReplicaState, decode
from shared.streams import connect
from shared.vocab import FinishReason
from tests.stack import Stack, sim_config

pytestmark = pytest.mark.e2e


def group(event: AuditEvent) -> str:
    """The replica group an event names: 'hybrid', 'standalone' or ''."""
    ids = " ".join(event.replica_ids)
    return "hybrid" if "hybrid" in ids else "standalone" if "standalone" in ids else ""


def commands(events: list[AuditEvent]) -> list[tuple[str, str]]:
    """(command kind, replica group) in execution order."""
    return [(event.command, group(event)) for event in events if event.kind is AuditKind.COMMAND]


SYNC_KINDS = (cc.SyncWeights.kind, cc.WakeReplicas.kind, cc.AddReplicas.kind, cc.ResumeReplicas.kind,
              cc.Rebalance.kind, cc.ResetStaleness.kind)


def sync_cycles(events: list[AuditEvent]) -> list[list[tuple[str, str]]]:
    """The command lists of each weight sync (each ends with reset_staleness)."""
    cycles, current = [], []
    for kind, replicas in commands(events):
        current.append((kind, replicas))
        if kind == cc.ResetStaleness.kind:
            cycles.append([c for c in current if c[0] in SYNC_KINDS])
            current = []
    return cycles


def activations(events: list[AuditEvent]) -> list[AuditEvent]:
    return [e for e in events if e.kind is AuditKind.SWITCH and e.activated]


async def run_stack(redis_url: str, **overrides: object) -> Stack:
    stack = Stack(sim_config(**overrides), redis_url)  # type: ignore[arg-type]
    await stack.start()
    try:
        await stack.wait_done(timeout_s=90)
    finally:
        await stack.close()
    return stack


async def test_a_dynamic_run_trains_every_fed_sample_and_loses_none(redis_server):
    stack = await run_stack(redis_server.url)
    counts = await stack.accounting()
    assert counts[AccountingField.FED] == 64
    assert counts[AccountingField.TRAINED] == 64
    assert counts[LOST] == 0
    assert counts[AccountingField.GENERATING] == 0


async def test_hybrids_are_removed_aborted_and_slept_in_that_order_before_training_after_every_activation(
        redis_server):
    stack = await run_stack(redis_server.url)
    events = await stack.audit()
    expecting: list[str] | None = None
    for event in events:
        if event.kind is AuditKind.SWITCH and event.activated:
            expecting = [cc.RemoveReplicas.kind, cc.AbortReplicas.kind, cc.SleepReplicas.kind]
        elif event.kind is AuditKind.COMMAND and expecting and group(event) == "hybrid":
            if event.command == expecting[0]:
                expecting.pop(0)
        elif event.kind is AuditKind.PHASE and event.phase is AuditPhase.TRAIN_START:
            assert not expecting, f"trainer computed while hybrids still needed {expecting}"
            expecting = None
    assert activations(events)


async def test_a_sync_with_enough_samples_queued_skips_activation_and_the_hybrid_weight_sync(redis_server):
    # Four fast standalones, a slow trainer and room for a full cycle of backlog (staleness 1):
    # after the first cycles the queue holds more than ratio x step_required, so the gap is <= 0.
    stack = await run_stack(redis_server.url, rollout={"nnodes": 1, "n_gpus_per_node": 4},
                            trainer={"time_per_sample_s": 40.0},
                            async_training={"staleness_threshold": 1.0,
                                            "dynamic_schedule_deactivate_ratio": 0.1})
    cycles = sync_cycles(await stack.audit())
    sync = cc.SyncWeights.kind
    skipped = [c for c in cycles[1:] if (sync, "standalone") in c and (sync, "hybrid") not in c]
    assert skipped, f"every sync activated hybrids: {cycles}"
    for cycle in skipped:
        assert (cc.WakeReplicas.kind, "hybrid") not in cycle
        assert (cc.AddReplicas.kind, "hybrid") not in cycle


async def test_requests_aborted_on_hybrids_finish_on_standalones_counted_as_handed_over_with_their_versions(
        redis_server):
    # Responses long enough, and versions enough, that requests are still decoding when the standalones
    # sync (the sim engine decodes at the modelled rate since it runs the planner's replica; the old
    # one lost progress, so 1200 tokens over 8 versions were enough).
    stack = await run_stack(redis_server.url, data={"max_response_length": 4096, "total_rollout_steps": 128},
                            rollout={"sim": {"response_length": {"mean": 2400, "std": 600}}})
    trajectories = [t for s in await stack.samples() for t in s.trajectories]
    moved = [t for t in trajectories if t.replica_ids[0].startswith("hybrid")
             and t.replica_ids[-1].startswith("standalone")]
    assert moved, "no trajectory was aborted on a hybrid and finished on a standalone"
    assert all(t.num_attempts > 1 for t in moved)
    redis = connect(redis_server.url)
    try:
        cycles = [decode(f).metrics for _, f in await redis.xrange(stack.names.metrics)]
    finally:
        await redis.aclose()
    # the rollouter counts them per sample and version; a cycle's metrics carry the count of the window
    # before it (the initial sync's report, of anything handed over before it, closes no cycle)
    handed_over = sum(m[HANDED_OVER] for m in cycles)
    assert handed_over >= len({t.request_id.rsplit("/", 1)[0] for t in moved if t.min_version >= 1}) > 0
    assert all(0 <= m[HANDED_OVER_ON_TIME] <= m[HANDED_OVER] for m in cycles)
    assert any(t.max_version > t.min_version for t in trajectories), \
        "no partial rollout crossed a weight sync"
    assert all(t.min_version <= t.max_version for t in trajectories)


async def test_without_partial_rollout_every_sample_is_trained_once_and_no_response_is_cut_before_a_token(
        redis_server):
    # a fast trainer and long responses (~20 modelled s): many are still decoding at every sync and switch
    stack = await run_stack(redis_server.url, async_training={"partial_rollout": False},
                            trainer={"time_per_sample_s": 0.5},
                            data={"total_rollout_steps": 64, "n": 2, "max_response_length": 2048},
                            rollout={"sim": {"response_length": {"mean": 1024, "std": 256}}})
    counts = await stack.accounting()
    assert (counts[AccountingField.TRAINED], counts[LOST]) == (64, 0)
    trajectories = [t for s in await stack.samples() for t in s.trajectories]
    assert all(t.response_token_ids for t in trajectories), "a response was trained empty"
    assert any(t.finish_reason is FinishReason.ABORT for t in trajectories), "no abort cut a response"
    state = stack.names.rollouter_state
    cut = int(await stack.buses[0].redis.hget(state, RolloutStateField.CUT_SAMPLES) or 0)
    samples = await stack.samples()
    with_cut = sum(any(t.finish_reason is FinishReason.ABORT for t in s.trajectories) for s in samples)
    assert 0 < cut <= with_cut  # counted for the controller's windows (core.measure), at most once per sample
    first_live = min(e.t for e in await stack.audit() if e.detail.startswith("reset_staleness"))
    assert min(s.enqueued_at for s in await stack.samples()) > first_live, "a sample beat the first sync"


async def test_without_partial_rollout_the_live_controller_counts_the_samples_in_flight_a_sync_will_cut(
        redis_server):
    # the controller service reads the rollouter's active_tasks at each sync into the policy's context
    stack = await run_stack(redis_server.url, trainer={"time_per_sample_s": 0.5},
                            async_training={"partial_rollout": False, "dynamic_schedule_policy": "adaptive"},
                            data={"total_rollout_steps": 64, "n": 2, "max_response_length": 2048},
                            rollout={"sim": {"response_length": {"mean": 1024, "std": 256}}})
    assert (await stack.accounting())[LOST] == 0
    decisions = [e.decision for e in await stack.audit() if e.decision and "queued_after_sync" in e.decision]
    assert decisions, "no audited adaptive decision"
    assert any(d["queued_after_sync"] > d["queued"] for d in decisions), "no sample in flight at any sync"
    activations = [d for d in decisions if d["decision"] == "activate"]
    assert all(d["wait_for_samples"] > d["queued_after_sync"] for d in activations)


async def test_static_fully_async_with_standalones_keeps_hybrids_asleep(redis_server):
    static = {"dynamic_schedule_policy": "static_fully_async"}
    stack = await run_stack(redis_server.url, async_training=static)
    events = await stack.audit()
    assert not [e for e in events if e.kind is AuditKind.SWITCH]
    hybrid_states = [e.state for e in events
                     if e.kind is AuditKind.REPLICA_STATE and e.subject.startswith("hybrid")]
    assert hybrid_states and all(state is ReplicaState.SLEEPING for state in hybrid_states)
    assert (await stack.accounting())[LOST] == 0


async def test_colocated_mode_without_standalones_completes(redis_server):
    stack = await run_stack(redis_server.url, rollout={"nnodes": 0},
                            async_training={"dynamic_schedule_policy": "static_fully_async"})
    counts = await stack.accounting()
    assert counts[AccountingField.TRAINED] == 64 and counts[LOST] == 0
    assert activations(await stack.audit())


async def test_admin_forced_activation_happens_at_the_next_sync_with_the_normal_ordering(redis_server):
    static = {"dynamic_schedule_policy": "static_fully_async"}
    stack = Stack(sim_config(async_training=static), redis_server.url)
    await stack.start()
    assert stack.controller is not None
    transport = httpx.ASGITransport(app=build_app(stack.controller, PrometheusExporter(), token="t"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://admin",
                                     headers={"Authorization": "Bearer t"}) as client:
            response = await client.post("/activate")
            assert response.status_code == 202
            assert (await client.put("/policy", json={"deactivate_ratio": 2})).status_code == 422
            unknown = await client.put("/policy", json={"name": "nope"})
            assert unknown.status_code == 400 and "registered" in unknown.text
            assert (await client.get("/status")).json()["policy"]["name"] == "static_fully_async"
            await stack.wait_done(timeout_s=90)
            assert "dynamic_resource_mq_size" in (await client.get("/metrics")).text
    finally:
        await stack.close()
    assert activations(await stack.audit())
    assert (await stack.accounting())[LOST] == 0


def spawn(service: str, config_path, redis_url: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", f"services.{service}", "--config", str(config_path),
                             "--redis-url", redis_url, "--log-level", "WARNING", *extra])


@pytest.mark.parametrize(("service", "name", "extra"), [
    ("controller", "controller", ()),
    ("rollouter", "rollouter", ()),
    ("trainer", "trainer", ()),
    ("rollout_worker", "standalone_0", ("--replica-id", "standalone_0")),
])
async def test_a_service_killed_mid_run_is_restarted_and_nothing_is_lost(redis_server, tmp_path, service,
                                                                        name, extra):
    config = sim_config(data={"total_rollout_steps": 96})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config_to_dict(config)))
    stack = Stack(config, redis_server.url)
    proc = spawn(service, config_path, redis_server.url, *extra)
    await stack.start(without=(name,))
    try:
        redis = stack.buses[0].redis
        while int(await redis.hget(stack.names.trainer_state, TrainerStateField.VERSION) or 0) < 3:
            await asyncio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)  # a crash: no cleanup, wherever it was
        proc.wait()
        proc = spawn(service, config_path, redis_server.url, *extra)
        await stack.wait_done(timeout_s=90)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        await stack.close()
    counts = await stack.accounting()
    assert counts[AccountingField.TRAINED] == 96 and counts[LOST] == 0
    trained = [s.sample_id for s in await stack.samples()]
    assert len(trained) == len(set(trained)), "a sample reached the MessageQueue twice"


async def test_malformed_entries_on_every_stream_are_dead_lettered_and_the_run_completes(redis_server):
    stack = Stack(sim_config(), redis_server.url)
    names = stack.names
    await stack.start()
    try:
        redis = stack.buses[0].redis
        streams = [names.lb_requests, names.lb_results, names.rollouter_results, names.trainer_events,
                   names.mq, names.worker_requests("standalone_0"), names.rollouter_commands]
        for stream in streams:
            await redis.xadd(stream, {"type": "generate", "request_id": "no-sample-id"})
            await redis.xadd(stream, {"garbage": "\\xff"})
        await stack.wait_done(timeout_s=90)
        dead = await redis.xrange(names.dead_letters)
    finally:
        await stack.close()
    reasons = [fields[b"dlq_reason"].decode() for _, fields in dead]
    assert len(dead) == 2 * len(streams), reasons
    assert all("malformed" in r or "not a sample" in r for r in reasons)
    assert (await stack.accounting())[LOST] == 0


SEED_METRICS = (
    "dynamic_resource/train_resource_utilization", "dynamic_resource/train_compute_time_s",
    "dynamic_resource/train_allocated_time_s", "dynamic_resource/rollout_resource_utilization",
    "dynamic_resource/resource_utilization", "dynamic_resource/mq_size",
    "fully_async/rollouter/step_generated_samples", "fully_async/rollouter/idle_ratio",
    "fully_async/trainer/idle_ratio", "fully_async/total_wait_time", "timing_s/wait_for_enough_samples",
    "fully_async/partial/total_partial_num", "fully_async/partial/partial_ratio",
    "fully_async/partial/max_partial_span", "fully_async/count/stale_trajectory_processed",
    "fully_async/count/current_param_version", "fully_async/count/total_generated_samples",
    "fully_async/processing_time/tp99", "perf/throughput",
)


async def test_every_cycle_carries_the_seed_metrics_and_the_ratios_match_their_definitions(redis_server):
    stack = await run_stack(redis_server.url)
    redis = connect(redis_server.url)
    try:
        cycles = [decode(f) for _, f in await redis.xrange(stack.names.metrics)]
    finally:
        await redis.aclose()
    assert len(cycles) == 64 // 8  # one per weight version
    config = stack.config
    a, b = config.trainer.num_gpus, config.rollout.num_standalone_gpus
    for cycle in cycles:
        assert isinstance(cycle, CycleMetrics)
        m = cycle.metrics
        assert set(SEED_METRICS) <= set(m), sorted(set(SEED_METRICS) - set(m))
        assert m["dynamic_resource/train_resource_utilization"] == pytest.approx(
            m["dynamic_resource/train_compute_time_s"] / m["dynamic_resource/train_allocated_time_s"])
        x = min(1.0, max(0.0, m["timing_s/wait_for_enough_samples"] / m["timing_s/step"]))
        u_train, u_rollout = m["dynamic_resource/train_resource_utilization"], m[
            "dynamic_resource/rollout_resource_utilization"]
        assert m["dynamic_resource/resource_utilization"] == pytest.approx(
            ((1 - x) * a * u_train + (x * a + b) * u_rollout) / (a + b))
        assert 0.0 <= u_rollout <= 1.0 and 0.0 <= u_train <= 1.0


async def test_the_engines_report_their_batch_and_decode_time_with_every_finished_attempt(
        redis_server):
    stack = await run_stack(redis_server.url)
    redis = connect(redis_server.url)
    try:
        cycles = [decode(f).metrics for _, f in await redis.xrange(stack.names.metrics)]
    finally:
        await redis.aclose()
    fits = [DecodeFit.from_metrics(m) for m in cycles]
    measured = [fit for fit in fits if fit.w > 0]
    # every version after the first closes with finished attempts that carried decode time, tokens, batch
    assert len(measured) >= len(fits) - 1
    assert all(1.0 <= fit.mean_inflight <= stack.config.rollout.max_num_seqs for fit in measured)
    assert all(fit.y / fit.w > 0 for fit in measured)  # seconds per decoded token
    assert all(fit.c / fit.w >= fit.mean_inflight for fit in measured)  # each request holds a token or more
    assert all(m[DECODE_LOAD_COST] >= 0 for m in cycles)  # what the controller fitted, for a dashboard


async def test_a_worker_that_dies_for_good_is_routed_around_and_its_stranded_requests_are_retried(
        redis_server, tmp_path):
    config = sim_config(data={"total_rollout_steps": 96})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config_to_dict(config)))
    stack = Stack(config, redis_server.url)
    worker = spawn("rollout_worker", config_path, redis_server.url, "--replica-id", "standalone_0")
    await stack.start(without=("standalone_0",))
    try:
        redis = stack.buses[0].redis
        while int(await redis.hget(stack.names.trainer_state, TrainerStateField.VERSION) or 0) < 2:
            await asyncio.sleep(0.02)
        worker.send_signal(signal.SIGKILL)  # never comes back
        worker.wait()
        await stack.wait_done(timeout_s=120)
    finally:
        await stack.close()
    counts = await stack.accounting()
    assert counts[AccountingField.TRAINED] == 96 and counts[LOST] == 0
    assert [e for e in await stack.audit() if e.kind is AuditKind.LB and e.alive is False
            and e.replica_ids == ["standalone_0"]]


async def test_a_weight_push_that_fails_falls_back_to_the_filesystem_and_the_run_loses_nothing(redis_server):
    """The sim trainer cannot push, so every push the trainer tries fails: each sync must
    still reach every replica (through update_weights) and training must finish."""
    stack = Stack(sim_config(), redis_server.url)
    await stack.start(without=("trainer",))
    trainer = stack.start_trainer()  # its task has not run yet: configure before the first sync
    trainer.transports = dict.fromkeys(stack.config.standalone_ids + stack.config.hybrid_ids, "gloo")
    try:
        await stack.wait_done(timeout_s=90)
        states = await stack.buses[0].redis.hgetall(stack.names.replica_states)
    finally:
        await stack.close()
    counts = await stack.accounting()
    assert counts[AccountingField.TRAINED] == counts[AccountingField.FED] == 64 and counts[LOST] == 0
    events = await stack.audit()
    pushes = [e for e in events if e.kind is AuditKind.PUSH]
    syncs = [e for e in events if e.kind is AuditKind.COMMAND and e.command == cc.SyncWeights.kind]
    assert pushes and len(pushes) == len(syncs)
    assert all(e.ok is False and e.error.startswith("ValueError") for e in pushes)
    final = stack.config.data.total_rollout_steps // 8  # versions: 64 prompts / (4 x 2) per version
    standalone = {k.decode(): v.decode() for k, v in states.items() if k.startswith(b"standalone")}
    assert standalone == {r: f"serving:{final}" for r in stack.config.standalone_ids}
