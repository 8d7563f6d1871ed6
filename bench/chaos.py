"""Random faults against a real sim run: does every run finish, with nothing lost or trained twice?

Where it sits: a bench over `services.launcher.Job` (every service its own process, an embedded
redis-server), as `dynsched run` runs it. Each trial starts `configs/sim_small.yaml` (hybrids switching
every cycle, `fixed_ratio`), waits a random number of micro-steps, then SIGKILLs a random set of services
(controller, trainer, rollouter, load balancer, any rollout worker, Redis itself) at a random moment,
once or twice (or, with `--hang-share`, SIGSTOPs some of them: hung, neither exiting nor answering; with
`--term-share`, SIGTERMs some: a clean stop, exit status 0, through each service's shutdown path; with
`--redis-hang-share`, SIGSTOPs Redis for good instead of killing it: the launcher must see it answer no
PING and kill and restart it);
the launcher must restart them and the run must end DONE with `lost` 0 and `duplicated`
0 and every fed sample trained, and no service the faults did not hit may have been restarted (a
collateral crash: a peer's fault that stopped another service; not counted in a trial whose Redis hung,
where every service waited on Redis as long as the launcher did and may have ended itself as stuck).
A trial that does not finish within `--timeout-s` is a failure, reported with its seed and the tail of
each service log (of each collateral crash's), so it can be replayed (`--seed`).

The fault tests (tests/test_faults_*.py) each pin one injection; this draws many, including the ones
nobody wrote a test for (a kill during a weight sync, during a switch, two services at once).

Run: ``python -m bench.chaos [--trials 10] [--seed 0] [--time-scale 0.02] [--samples 256] [--hang-share 0.5]
[--term-share 0.3] [--redis-hang-share 0.5] [--mq-faults] [--policy fixed_ratio] [--set KEY=VALUE ...]
[--out FILE]``
(~1 minute per trial on a quiet machine). ``--policy`` and ``--set`` (dotted config keys) put other paths
under the faults, e.g. the fast switch mechanics: ``--policy adaptive --set
async_training.dynamic_schedule_fold_hybrid_sync=true --set async_training.dynamic_schedule_overlap_wake=true
--set async_training.dynamic_schedule_overlap_sleep=true``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import parse_sets, write_result
from bench.live_run import live_config
from services import launcher
from services.launcher import DUPLICATED, LOST
from shared.names import AccountingField, RunStatus

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HANG_STALE_S = 10.0
"""`run.loop_stale_s` of the trials (the default 120 s is for engines that start for minutes): a hung
service is killed about 15 s after its last report, so a trial does not wait minutes for it."""
REDIS = "redis"
"""The embedded Redis server as a fault target (its process belongs to the launcher, not to `procs`)."""
MQ = "mq"
"""The MessageQueue stream as a fault target (`--mq-faults`): an operator's `XTRIM MAXLEN 0` or `DEL`."""
MQ_FAULTS = ("trim", "delete")


SIGNALS = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP, "term": signal.SIGTERM}
"""Per fault kind: `hang` is a process that neither exits nor answers, `term` a clean stop (exit 0)."""


def inject(job: launcher.Job, target: str, fault: str) -> None:
    """Send one target its fault's signal (`SIGNALS`; the embedded Redis is killed or hung)."""
    if target == REDIS:
        if job.embedded is not None and job.embedded.proc is not None:
            job.embedded.proc.send_signal(SIGNALS["hang" if fault == "hang" else "kill"])
        return
    if target == MQ:
        if fault == "trim":
            job.redis.xtrim(job.names.mq, maxlen=0)
        else:
            job.redis.delete(job.names.mq)
        return
    proc = job.procs.get(target)
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, SIGNALS[fault])


def draw_fault(draw: float, *, hang_share: float, term_share: float) -> str:
    """The fault kind for a uniform `draw` in [0, 1): `hang` below hang_share, then `term` for the next
    term_share, else `kill` (one draw per victim, so the shares do not change other seeds' faults)."""
    if draw < hang_share:
        return "hang"
    return "term" if draw < hang_share + term_share else "kill"


def redis_fault(rng: random.Random, *, redis_hang_share: float) -> str:
    """Redis's fault: `kill`, or `hang` for redis_hang_share of them (no draw at 0, so the seeds of
    trials without Redis hangs draw the faults they always drew)."""
    return "hang" if redis_hang_share and rng.random() < redis_hang_share else "kill"


def collateral_restarts(summary: dict[str, Any], faults: list[dict[str, Any]]) -> dict[str, int]:
    """Services restarted (after a crash or a hang) that no fault hit: a peer's fault that made another
    service exit is a bug even when the restart hides it (the run finishes, and the restart budget pays).
    None after a Redis hang: every service then waited on Redis as long as the launcher did."""
    if any(fault.get("hang") == REDIS for fault in faults):
        return {}
    victims = {target for fault in faults for key, target in fault.items() if key in SIGNALS}
    restarted: dict[str, int] = {}
    for kind in ("restarts", "hung_kills"):
        for name, count in (summary.get(kind) or {}).items():
            if name not in victims:
                restarted[name] = restarted.get(name, 0) + count
    return restarted


def run_trial(seed: int, *, time_scale: float, samples: int, timeout_s: float,
              hang_share: float = 0.0, term_share: float = 0.0, redis_hang_share: float = 0.0,
              mq_faults: bool = False, policy: str = "fixed_ratio",
              changes: dict[str, Any] | None = None) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="chaos_") as tmp:
        directory = Path(tmp)
        config = live_config(directory, time_scale=time_scale, total_rollout_steps=samples, policy=policy,
                             run={"loop_stale_s": HANG_STALE_S, "hung_grace_s": HANG_STALE_S / 2},
                             changes=changes)
        total = None
        faults: list[dict[str, Any]] = []
        started = time.monotonic()
        with launcher.Job(config_path=config, out_dir=directory / "run") as job:
            total = launcher.total_micro_steps(job.config)
            targets = [*sorted(job.procs), REDIS, *([MQ] if mq_faults else [])]
            plan = sorted(rng.sample(range(1, max(2, total - 1)), k=min(2, max(1, total - 2))))
            status = None
            for at_step in plan:
                while job.completed_micro_steps() < at_step and time.monotonic() - started < timeout_s:
                    if job.poll() not in (None, RunStatus.RUNNING):
                        break
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 1.0))  # somewhere inside the micro-step, the sync or a switch
                victims = rng.sample(targets, k=rng.choice((1, 1, 2)))
                for victim in victims:
                    if victim == REDIS:
                        fault = redis_fault(rng, redis_hang_share=redis_hang_share)
                    elif victim == MQ:
                        fault = rng.choice(MQ_FAULTS)
                    else:
                        fault = draw_fault(rng.random(), hang_share=hang_share, term_share=term_share)
                    inject(job, victim, fault)
                    faults.append({"after_micro_step": job.completed_micro_steps(), fault: victim})
            while time.monotonic() - started < timeout_s:
                status = job.poll()
                if status is not None and status is not RunStatus.RUNNING:
                    break
                time.sleep(0.2)
            elapsed_s = time.monotonic() - started
            summary = job.summary(wall_time_s=elapsed_s, admin={}) if status is RunStatus.DONE else {}
            collateral = collateral_restarts(summary, faults)
            shown = collateral if status is RunStatus.DONE else job.procs
            logs = {name: launcher.log_tail(directory / "run" / "logs" / f"{name}.log") for name in shown}
        counts = summary.get("samples", {})
        ok = (status is RunStatus.DONE and counts.get(LOST) == 0 and counts.get(DUPLICATED) == 0
              and counts.get(AccountingField.FED) == samples and not collateral)
        return {"seed": seed, "ok": ok, "status": str(status), "faults": faults, "collateral": collateral,
                "wall_s": round(elapsed_s, 1), "micro_steps": total, "samples": counts,
                "restarts": summary.get("restarts"), "logs": logs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="first trial's seed (trial k uses seed + k)")
    parser.add_argument("--time-scale", type=float, default=0.02)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--hang-share", type=float, default=0.0,
                        help="share of faults that SIGSTOP a service instead of killing it (not Redis)")
    parser.add_argument("--term-share", type=float, default=0.0,
                        help="share of faults that SIGTERM a service (a clean stop) instead (not Redis)")
    parser.add_argument("--redis-hang-share", type=float, default=0.0,
                        help="share of Redis's faults that SIGSTOP it for good instead of killing it")
    parser.add_argument("--mq-faults", action="store_true",
                        help="the MessageQueue is a target too: XTRIM MAXLEN 0 or DEL of the stream")
    parser.add_argument("--policy", default="fixed_ratio", help="the trials' dynamic scheduling policy")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a dotted config key of the trials' config (repeatable)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    changes = parse_sets(args.set)
    results = []
    for k in range(args.trials):
        result = run_trial(args.seed + k, time_scale=args.time_scale, samples=args.samples,
                           timeout_s=args.timeout_s, hang_share=args.hang_share,
                           term_share=args.term_share, redis_hang_share=args.redis_hang_share,
                           mq_faults=args.mq_faults, policy=args.policy,
                           changes=changes)
        results.append(result)
        collateral = f" collateral restarts {result['collateral']}" if result["collateral"] else ""
        print(f"seed {result['seed']}: {'ok  ' if result['ok'] else 'FAIL'} {result['status']} "
              f"{result['wall_s']:6.1f}s faults {result['faults']} samples {result['samples']}{collateral}",
              flush=True)
        for name, tail in result["logs"].items():
            print(f"--- {name}\n{tail}")
    failed = [r["seed"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)} of {len(results)} trials finished with nothing lost; "
          f"failed seeds: {failed}")
    write_result(args.out, {"trials": results})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
