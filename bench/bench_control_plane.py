"""Control-plane overhead of a hybrid deactivate and activate, beyond the engines' own time.

Where it sits: the controller's `Executor` runs the core's ordered command lists
over the bus. Here the real load balancer, rollouter and one rollout-worker
process per replica (`python -m services.<name>`, sim engines) run against a
throwaway redis-server, and this process plays the controller: a
`ControllerCore` (forced switches, so the policy cannot veto) produces the
lists, the real `Executor` runs them, one command at a time so each is timed.

    deactivate = remove, abort, sleep            engines' time: sleep_s
    activate   = wake, sync, add, resume, rebalance  engines' time: wake_s + weight_sync_s
    (the activation list also syncs the standalones and resets staleness; those are
     timed apart, as the controller's `ExecutionReport.switch_s` does)

overhead = switch wall time - engines' modelled time (x time_scale). Scenarios:
`modelled` (sleep/wake/sync > 0, rollouter generating), `zero_loaded` (all engine
times 0, rollouter generating) and `zero_idle` (all 0, nothing generating): pure
control-plane latency. Run: ``python -m bench.bench_control_plane --out runs/bench_cp.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from bench import write_result
from bench.bench_mq import throwaway_redis
from core import controller as cc
from core import executor as ex
from services.controller.executor import Executor
from services.controller.service import build_core
from shared.bus import Bus
from shared.config import Config, config_from_dict
from shared.names import Names
from shared.rpc import CommandClient
from shared.schema import CommandAction, WeightSyncReport
from shared.streams import connect

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 10.0
SCENARIOS: dict[str, dict[str, Any]] = {
    "modelled": {"sleep_s": 2.0, "wake_s": 2.0, "weight_sync_s": 1.0, "load": True},
    "zero_loaded": {"sleep_s": 0.0, "wake_s": 0.0, "weight_sync_s": 0.0, "load": True},
    "zero_idle": {"sleep_s": 0.0, "wake_s": 0.0, "weight_sync_s": 0.0, "load": False},
}


def percentiles_ms(values_s: list[float]) -> dict[str, float]:
    """p50/p99/mean/max in ms (nearest-rank, so p99 of 30 values is the max but one)."""
    if not values_s:
        return {"n": 0}
    ordered = sorted(values_s)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))] * 1e3

    return {"n": len(ordered), "p50_ms": rank(0.50), "p99_ms": rank(0.99),
            "mean_ms": sum(ordered) / len(ordered) * 1e3,
            "max_ms": ordered[-1] * 1e3}


def bench_config(*, namespace: str, time_scale: float, sleep_s: float, wake_s: float, weight_sync_s: float,
                 load: bool, num_standalone: int, num_hybrid: int) -> dict[str, Any]:
    """A sim config: 1-GPU replicas; `load` keeps the rollouter generating (~1 s wall per request)."""
    return {
        "run": {"name": namespace, "namespace": namespace, "time_scale": time_scale, "seed": 0},
        "data": {"total_rollout_steps": 1_000_000 if load else 1, "n": 4, "max_response_length": 256,
                 "prompt_length": 32},
        "trainer": {"ppo_mini_batch_size": 4, "num_gpus": num_hybrid, "time_per_sample_s": 1.0},
        "async_training": {"staleness_threshold": 10_000.0, "trigger_parameter_sync_step": 2,
                           "use_dynamic_resource_scheduling": True, "dynamic_schedule_policy": "default",
                           "dynamic_schedule_enable_rebalance": True, "concurrent_samples_per_replica": 4},
        "rollout": {"nnodes": 1, "n_gpus_per_node": num_standalone, "tensor_model_parallel_size": 1,
                    "retry_delay_s": 1.0,
                    "sim": {"prefill_s_per_token": 0.0, "decode_s_per_step": 0.2, "batch_slowdown": 0.002,
                            "sleep_s": sleep_s, "wake_s": wake_s, "weight_sync_s": weight_sync_s,
                            "response_length": {"mean": 100, "std": 20, "min_tokens": 8}}},
    }


@contextmanager
def service_processes(config_dict: dict[str, Any], redis_url: str, *,
                      services: tuple[str, ...]) -> Iterator[Path]:
    """Start `python -m services.<name>` for each of `services` ("rollout_worker" = one per replica),
    as the launcher does; SIGTERM (then SIGKILL) them on exit. Yields the log dir."""
    config = config_from_dict(config_dict)
    with tempfile.TemporaryDirectory(prefix="dynsched-bench-") as workdir:
        path = Path(workdir) / "config.yaml"
        path.write_text(yaml.safe_dump(config_dict))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(PROJECT_ROOT)}
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for name in services:
                extras = ([["--replica-id", r] for r in config.standalone_ids + config.hybrid_ids]
                          if name == "rollout_worker" else [[]])
                for extra in extras:
                    log_path = Path(workdir) / f"{name}{'-' + extra[1] if extra else ''}.log"
                    with log_path.open("wb") as log_file:
                        procs.append(subprocess.Popen(
                            [sys.executable, "-m", f"services.{name}", "--config", str(path), "--redis-url",
                             redis_url, "--log-level", "WARNING", *extra],
                            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT))
            yield Path(workdir)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


async def wait_ready(bus: Bus, config: Config, *, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Until every worker has a heartbeat, the LB its members and the rollouter its state hash."""
    names = bus.names
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        beats = [await bus.redis.exists(names.worker_heartbeat(r))
                 for r in config.standalone_ids + config.hybrid_ids]
        ready = await bus.redis.exists(names.lb_members, names.rollouter_state) == 2
        if all(beats) and ready:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"services not ready after {timeout_s} s")


def engine_time_s(command: cc.Command, sim: dict[str, float], time_scale: float,
                  standalone_ids: tuple[str, ...]) -> float:
    """Wall seconds the sim engines themselves spend on `command` (replicas run in parallel)."""
    if isinstance(command, cc.SleepReplicas):
        return sim["sleep_s"] * time_scale
    if isinstance(command, cc.WakeReplicas):
        return sim["wake_s"] * time_scale
    if isinstance(command, cc.SyncWeights) and command.replica_ids != standalone_ids:
        return sim["weight_sync_s"] * time_scale
    return 0.0


def is_switch(command: cc.Command, standalone_ids: tuple[str, ...]) -> bool:
    """Counted in the switch time exactly as `Executor.execute` counts `switch_s`."""
    if isinstance(command, cc.WaitForSamples | cc.ResetStaleness):
        return False
    return not (isinstance(command, cc.SyncWeights) and command.replica_ids == standalone_ids)


async def run_switches(config: Config, redis_url: str, *, num_switches: int, dwell_s: float,
                       sim: dict[str, float]) -> dict[str, Any]:
    """Activate then deactivate `num_switches` times; per switch: wall, modelled, overhead, per command."""
    bus = Bus(connect(redis_url), Names(config.run.namespace))
    rpc = CommandClient(bus, timeout_s=COMMAND_TIMEOUT_S, max_attempts=1)
    core = build_core(config)
    executor = Executor(bus=bus, rpc=rpc)
    runner = ex.ExecutorCore(core=core, clock=time.monotonic)
    scale, standalones = config.run.time_scale, config.standalone_ids
    rows: dict[str, list[dict[str, float]]] = {"activate": [], "deactivate": []}
    per_command: dict[str, list[float]] = defaultdict(list)
    try:
        await wait_ready(bus, config)
        await rpc.start()
        await rpc.call(bus.names.rollouter_commands, CommandAction.SET_ACTIVE_REPLICAS,
                       value=len(standalones))
        await asyncio.sleep(dwell_s)
        for i in range(num_switches):
            step = 2 * i + 1
            core.force(True)
            activate = core.begin_sync(global_steps=step, version=i + 1, total_generated_samples=0,
                                       completed_steps=1)
            assert core.mode is cc.Mode.ACTIVATING, f"forced activation did not activate: {core.mode}"
            rows["activate"].append(await timed(executor, runner, activate, per_command, sim, scale,
                                                standalones, "activate"))
            core.finish_activate(rows["activate"][-1]["switch_s"])
            core.finish_sync(step)
            await asyncio.sleep(dwell_s)
            core.force(False)
            deactivate = core.begin_micro_step(step + 1)
            rows["deactivate"].append(await timed(executor, runner, deactivate, per_command, sim, scale,
                                                  standalones, "deactivate"))
            core.finish_deactivate(rows["deactivate"][-1]["switch_s"])
            await asyncio.sleep(dwell_s)
        mq = await bus.redis.xlen(bus.names.mq)
    finally:
        await rpc.close()
        await bus.redis.aclose()
    out: dict[str, Any] = {"samples_generated_meanwhile": mq}
    for kind, switch_rows in rows.items():
        out[kind] = {
            "switch": percentiles_ms([r["switch_s"] for r in switch_rows]),
            "modelled_ms": switch_rows[0]["modelled_s"] * 1e3 if switch_rows else 0.0,
            "overhead": percentiles_ms([r["switch_s"] - r["modelled_s"] for r in switch_rows]),
            "other_commands": percentiles_ms([r["other_s"] for r in switch_rows]),
            "raw_overhead_ms": [round((r["switch_s"] - r["modelled_s"]) * 1e3, 2) for r in switch_rows],
        }
    out["per_command_overhead"] = {k: percentiles_ms(v) for k, v in sorted(per_command.items())}
    return out


async def timed(executor: Executor, runner: ex.ExecutorCore, commands: list[cc.Command],
                per_command: dict[str, list[float]],
                sim: dict[str, float], scale: float, standalones: tuple[str, ...],
                prefix: str) -> dict[str, float]:
    """Run `commands` in order through the executor, one by one, timing each."""
    row = {"switch_s": 0.0, "modelled_s": 0.0, "other_s": 0.0}
    for command in commands:
        started = time.perf_counter()
        await perform(executor, runner.execute([command]))
        elapsed = time.perf_counter() - started
        modelled = engine_time_s(command, sim, scale, standalones)
        key = "switch_s" if is_switch(command, standalones) else "other_s"
        row[key] += elapsed
        if key == "switch_s":
            row["modelled_s"] += modelled
            per_command[f"{prefix}/{command.kind}"].append(elapsed - modelled)
    return row


async def perform(executor: Executor, plan: ex.Plan[Any]) -> None:
    """Perform a plan's operations in order, as the controller service's `_drive` does (no checkpoint
    to persist here). No trainer runs here: a weight sync is the trainer's filesystem reload, done
    by this process (update_weights to each replica, every ack awaited)."""
    result: Any = None
    while True:
        try:
            op = plan.send(result)
        except StopIteration:
            return
        if isinstance(op, ex.SyncReplicas):
            names = executor.bus.names
            await executor.rpc.call_peers(
                [(names.worker_commands(r), names.worker_heartbeat(r)) for r in op.replica_ids],
                CommandAction.UPDATE_WEIGHTS, version=op.version, weights_path=op.weights_path)
            result = WeightSyncReport(replica_ids=list(op.replica_ids), version=op.version)
        else:
            result = None if isinstance(op, ex.Checkpoint) else await executor.perform(op)


def run_scenario(name: str, *, num_switches: int, num_standalone: int, num_hybrid: int, time_scale: float,
                 dwell_s: float) -> dict[str, Any]:
    spec = dict(SCENARIOS[name])
    load = bool(spec.pop("load"))
    cfg = bench_config(namespace=f"benchcp_{name}", time_scale=time_scale, load=load,
                       num_standalone=num_standalone,
                       num_hybrid=num_hybrid, **spec)
    config = config_from_dict(cfg)
    with throwaway_redis() as port:
        url = f"redis://127.0.0.1:{port}/0"
        with service_processes(cfg, url, services=("loadbalancer", "rollout_worker", "rollouter")) as logs:
            try:
                timeout_s = STARTUP_TIMEOUT_S + num_switches * 2 * (dwell_s + 5.0)
                result = asyncio.run(asyncio.wait_for(
                    run_switches(config, url, num_switches=num_switches, dwell_s=dwell_s, sim=spec),
                    timeout_s))
            except Exception:
                for log_file in sorted(logs.glob("*.log")):
                    print(f"--- {log_file.name}\n{log_file.read_text()[-2000:]}", file=sys.stderr)
                raise
    return {"engine_s_modelled": spec, "time_scale": time_scale, "generating": load, **result}


def print_table(results: dict[str, Any]) -> None:
    print(f"{'scenario / switch':28s} {'modelled ms':>11s} {'wall p50':>9s} {'wall p99':>9s} "
          f"{'ovh p50':>8s} {'ovh p99':>8s}")
    for name, res in results["scenarios"].items():
        for kind in ("deactivate", "activate"):
            row = res[kind]
            print(f"{name + ' / ' + kind:28s} {row['modelled_ms']:11.1f} {row['switch']['p50_ms']:9.1f} "
                  f"{row['switch']['p99_ms']:9.1f} {row['overhead']['p50_ms']:8.1f} "
                  f"{row['overhead']['p99_ms']:8.1f}")
    print("per-command overhead (p50 / p99 ms), zero_idle:")
    for key, row in results["scenarios"].get("zero_idle", {}).get("per_command_overhead", {}).items():
        print(f"  {key:36s} {row['p50_ms']:7.1f} {row['p99_ms']:7.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    parser.add_argument("--num-switches", type=int, default=30,
                        help="activations (and deactivations) per scenario")
    parser.add_argument("--num-standalone", type=int, default=2)
    parser.add_argument("--num-hybrid", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.05, help="wall s per modelled s")
    parser.add_argument("--dwell-s", type=float, default=0.3,
                        help="wall s between switches (hybrids take work)")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), default=None)
    args = parser.parse_args(argv)
    if args.num_switches < 1 or args.num_standalone < 1 or args.num_hybrid < 1:
        raise ValueError(f"counts must be >= 1, got {args.num_switches}, {args.num_standalone}, "
                         f"{args.num_hybrid}")
    load_before = os.getloadavg()
    scenarios = {name: run_scenario(name, num_switches=args.num_switches, num_standalone=args.num_standalone,
                                    num_hybrid=args.num_hybrid, time_scale=args.time_scale,
                                    dwell_s=args.dwell_s)
                 for name in (args.scenario or list(SCENARIOS))}
    result = {"num_switches": args.num_switches, "replicas": {"standalone": args.num_standalone,
                                                               "hybrid": args.num_hybrid},
              "cpus": os.cpu_count(), "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]],
              "scenarios": scenarios}
    print_table(result)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
