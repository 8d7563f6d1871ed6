"""Start a whole dynsched run on this machine: Redis, every service, the outputs.

Where it sits: behind `dynsched run` / `dynsched up` (services/cli.py); `run_job` is the
entry for tests. It knows the services only as `python -m services.<name>` command lines
and reads back only Redis (the run-state contract in shared/names.py) and, at the end,
the controller's admin API. A run, in order:
  1. Redis: the given URL, or an embedded `redis-server` on a free port (AOF, restarted if it dies
     or answers no PING for `redis_hung_after_s`; services/embedded_redis.py). Every Redis call
     retries for `run.redis_retry_window_s`.
  2. Claim the namespace: refuse if keys already live under it (a user's Redis is
     never flushed) unless `fresh` deletes exactly those keys.
  3. `run_state.status = running`; one subprocess per service (per rollout replica),
     stdout/stderr in `OUT/logs/<name>.log`.
  4. Watch: progress from `trainer_state.global_steps`; the audit and metrics streams (capped at
     `run.event_stream_maxlen`) appended to `audit.jsonl` and `metrics.jsonl` at each poll; a
     child exiting non-zero is restarted with a backoff (services/restarts.py); past
     `run.max_restarts_per_minute` the run is marked failed, everything stops and
     `ServiceCrashed` names the service and its log. A child that hangs instead (its health
     report, shared/health.py, missing or stale for `run.hung_grace_s` after its first one) is
     SIGKILLed, with its process group, and restarted the same way (`hung_kills`).
  5. At `status == done`: `GET /status` once, stop every child (SIGTERM, then SIGKILL),
     finish `metrics.jsonl`, `audit.jsonl`, write `summary.json` (services/run_outputs.py); stop
     the embedded Redis. A run that fails writes them too, with what it knows: from Redis, or,
     when Redis stays unreachable, from the last state the launcher read (never a traceback).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from core.flow import FlowLimits
from services.embedded_redis import EmbeddedRedis as EmbeddedRedis
from services.embedded_redis import redis_executable as redis_executable
from services.processes import LOG_TAIL_LINES as LOG_TAIL_LINES
from services.processes import STOP_TIMEOUT_S as STOP_TIMEOUT_S
from services.processes import ServiceSpec as ServiceSpec
from services.processes import kill_group, stop_signals_held
from services.processes import log_tail as log_tail
from services.processes import service_specs as service_specs
from services.processes import start_service as start_service
from services.processes import stop_services as stop_services
from services.progress import Progress
from services.restarts import WINDOW_S, HangWatch, RestartBudget
from services.run_outputs import DUPLICATED as DUPLICATED
from services.run_outputs import LOST as LOST
from services.run_outputs import StreamExport, fetch_admin_status, read_hash, run_exports, write_outputs
from services.run_outputs import admin_address as admin_address
from services.run_outputs import read_stream as read_stream
from services.run_outputs import sample_counts as sample_counts
from services.state_kept import lost_state_reason
from shared.bus import text
from shared.config import Config, load_config
from shared.health import judge
from shared.names import Names, RunStateField, RunStatus, TrainerStateField
from shared.redis_client import connect_sync

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
POLL_INTERVAL_S = 0.2
KNOWN_REFRESH_S = 5.0  # how often `poll` re-reads the sample hashes a summary without Redis would use
MIN_REDIS_HUNG_AFTER_S = 2.0
"""The embedded Redis is never killed as hung sooner (a retry window of 0 s would otherwise kill it at its
first slow PING)."""


class ServiceCrashed(RuntimeError):
    """A service process kept exiting non-zero past its restart budget; the run was stopped."""


class RedisStateLost(RuntimeError):
    """Redis no longer holds the run state the launcher wrote at the start, or part of the sample ledger
    (services/state_kept.py). The ledger cannot be trusted past that point, so the run is stopped and
    marked failed instead of going on as a new run."""


class NamespaceInUse(ValueError):
    """Keys already live under the run's namespace on the given Redis."""


def claim_namespace(client: redis.Redis, names: Names, *, fresh: bool) -> None:
    """Make sure nothing lives under the namespace; with `fresh`, delete exactly those keys."""
    keys = list(client.scan_iter(match=names.pattern, count=1000))
    if keys and not fresh:
        shown = ", ".join(text(k) for k in keys[:3])
        raise NamespaceInUse(f"{len(keys)} key(s) already exist under namespace {names.namespace!r} "
                             f"(e.g. {shown}); pass --fresh to delete them, or set run.namespace")
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start:start + 1000])


def micro_steps_done(trainer_state: dict[str, str]) -> int:
    """Micro-steps the trainer has completed, from its `trainer_state` hash (global_steps counts from 1)."""
    return max(0, int(trainer_state.get(TrainerStateField.GLOBAL_STEPS, "1")) - 1)


def total_micro_steps(config: Config) -> int:
    limits = FlowLimits.from_config(config)
    return limits.total_train_steps * limits.trigger_parameter_sync_step


def redis_hung_after_s(config: Config) -> float:
    """Seconds without an answered PING after which the embedded Redis is killed as hung: a hung service's
    budget, but at most half the retry window, so every client is still retrying when it comes back."""
    run = config.run
    return max(MIN_REDIS_HUNG_AFTER_S, min(run.stuck_loop_exit_s, run.redis_retry_window_s / 2))


class Job:
    """One launched run: Redis, the namespace claim, the services; leaving the `with` stops them all.

    While it runs, `poll` restarts a crashed child (and the embedded Redis) within its budget. On an
    exception (a child past its budget, Ctrl-C, a timeout, Redis unreachable past the retry window)
    the run is marked failed where Redis can still be reached, and the outputs so far are written.
    """

    def __init__(self, *, config_path: str | Path, out_dir: str | Path, redis_url: str | None = None,
                 fresh: bool = False) -> None:
        self.config_path = Path(config_path).resolve()
        self.config = load_config(self.config_path)
        self.names = Names(self.config.run.namespace)
        self.out_dir = Path(out_dir)
        self.log_dir = self.out_dir / "logs"
        self.redis_url = redis_url or ""
        self.fresh = fresh
        self.embedded = None if redis_url else EmbeddedRedis(
            log_path=self.log_dir / "redis.log", hung_after_s=redis_hung_after_s(self.config))
        self.client: redis.Redis | None = None
        self.specs = {spec.name: spec for spec in service_specs(self.config)}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.budgets = {name: RestartBudget(self.config.run.max_restarts_per_minute) for name in self.specs}
        self.restarts = dict.fromkeys(self.specs, 0)
        self.hung_kills = dict.fromkeys(self.specs, 0)
        self.watches: dict[str, HangWatch] = {}
        self._last_reports: dict[str, str] = {}
        self._restart_at_s: dict[str, float] = {}
        self.exit_codes: dict[str, int] = {}
        self.total_micro_steps = total_micro_steps(self.config)
        self.known: dict[str, dict[str, str]] = {}
        """The hashes as last read from Redis: the summary of a run whose Redis is gone."""
        self._known_at_s = float("-inf")
        self._owns_namespace = False
        self.exports: dict[str, StreamExport] | None = None
        """metrics.jsonl and audit.jsonl, appended at each `poll` (the streams are capped)."""
        self._started_s = time.monotonic()
        self.run_id = ""
        """`run_state.started_at` as this launcher wrote it; a poll that reads another value (or none)
        raises RedisStateLost."""

    def __enter__(self) -> Job:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.embedded is not None:
                self.redis_url = self.embedded.start()
            self.client = connect_sync(self.redis_url, retry_window_s=self.config.run.redis_retry_window_s,
                                       on_failure=self.embedded.ensure_running if self.embedded else None)
            claim_namespace(self.client, self.names, fresh=self.fresh)
            self._owns_namespace = True
            self.exports = run_exports(self.names, self.out_dir)
            self.run_id = repr(time.time())
            self.client.hset(self.names.run_state, mapping={RunStateField.STATUS: RunStatus.RUNNING,
                                                            RunStateField.STARTED_AT: self.run_id})
            shutil.copyfile(self.config_path, self.out_dir / "config.yaml")
            self._started_s = time.monotonic()
            for name in self.specs:
                with stop_signals_held():
                    self.procs[name] = self._start(name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            if exc is not None and self._owns_namespace:
                self.stop()
                redis_down = isinstance(exc, redis.ConnectionError | redis.TimeoutError)
                self.write_failed_outputs(f"{type(exc).__name__}: {exc}", redis_down=redis_down,
                                          state_lost=isinstance(exc, RedisStateLost))
        except Exception as write_exc:  # the original failure matters more than these outputs
            log.warning("could not write the outputs of the failed run: %s", write_exc)
        finally:
            self.close()

    @property
    def redis(self) -> redis.Redis:
        assert self.client is not None, "Job used outside its `with` block"
        return self.client

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started_s

    def read(self, key: str) -> dict[str, str]:
        """A hash of the run, remembered in `known`."""
        self.known[key] = read_hash(self.redis, key)
        return self.known[key]

    def poll(self) -> RunStatus | None:
        """The run's status (None before it is set); restarts crashed children (ServiceCrashed past a
        budget), RuntimeError when the run failed."""
        if self.embedded is not None:
            self.embedded.ensure_running()
        for export in (self.exports or {}).values():
            export.drain(self.redis)
        state = read_hash(self.redis, self.names.run_state)
        self.check_state_kept(state)
        self.known[self.names.run_state] = state
        status = RunStatus(state[RunStateField.STATUS]) if RunStateField.STATUS in state else None
        if status is RunStatus.FAILED:
            reason = state.get(RunStateField.REASON, "no reason given")
            raise RuntimeError(f"the run was marked failed: {reason}")
        if status is RunStatus.DONE:
            return status
        self.supervise()
        if time.monotonic() - self._known_at_s >= KNOWN_REFRESH_S:  # for a summary without Redis
            self._known_at_s = time.monotonic()
            self.read(self.names.accounting)
            self.read(self.names.sample_states)
        if not self._restart_at_s and all(proc.poll() is not None for proc in self.procs.values()):
            raise ServiceCrashed(f"every service exited before the run was done; logs in {self.log_dir}")
        return status

    def check_state_kept(self, run_state: dict[str, str]) -> None:
        """RedisStateLost unless Redis still holds this run's state (services/state_kept.py); the hashes
        last read, in `known`, are then the run's record."""
        steps = micro_steps_done(self.known.get(self.names.trainer_state, {}))
        if reason := lost_state_reason(self.redis, self.names, run_id=self.run_id, run_state=run_state,
                                       micro_steps=steps):
            raise RedisStateLost(reason)

    def supervise(self) -> None:
        """Start again each child that exited, or was killed as hung, once its backoff has passed
        (services/restarts.py). A clean exit (status 0: `kill PID`'s SIGTERM, a `docker stop`) is
        restarted too: no service ends on its own before the run is done, and the run would wait for
        the stopped one for ever."""
        now_s = time.monotonic()
        self.kill_hung(now_s)
        for name, proc in self.procs.items():
            if name in self._restart_at_s:
                if now_s >= self._restart_at_s[name]:
                    del self._restart_at_s[name]
                    self.restarts[name] += 1
                    with stop_signals_held():
                        self.procs[name] = self._start(name)
                continue
            if proc.poll() is None:
                continue
            kill_group(proc)  # what it left (its engine processes), before its replacement starts
            path = self.log_dir / f"{name}.log"
            budget = self.budgets[name]
            if (delay_s := budget.take(now_s)) is None:
                last = log_tail(path, 1).strip()
                raise ServiceCrashed(f"service {name} exited with status {proc.returncode} after "
                                     f"{budget.recent} restart(s) within {WINDOW_S:.0f}s (run."
                                     f"max_restarts_per_minute={budget.max_per_minute}); log: {path}; "
                                     f"last line: {last}")
            log.warning("service %s exited with status %s; restarting it in %.2fs (log: %s)", name,
                        proc.returncode, delay_s, path)
            self._restart_at_s[name] = now_s + delay_s

    def _health_key(self, name: str) -> str:
        return self.names.health(self.specs[name].health_name or name)

    def kill_hung(self, now_s: float) -> None:
        """SIGKILL (its whole process group: a vLLM engine's children too) each running child whose
        health report has been missing or stale past its grace (`HangWatch`); `supervise` then restarts
        it within its budget."""
        running = [name for name, proc in self.procs.items()
                   if name not in self._restart_at_s and proc.poll() is None]
        keys = [self._health_key(name) for name in running]
        for name, key, raw in zip(running, keys, self.redis.mget(keys) if keys else [], strict=True):
            problem = judge(raw, key=key, stale_after_s=self.config.run.loop_stale_s)
            if raw is not None:
                self._last_reports[name] = text(raw)
            if not self.watches[name].hung(now_s=now_s, present=raw is not None, problem=problem):
                continue
            log.warning("service %s is hung: %s (its last report: %s); killing it to restart it", name,
                        problem, self._last_reports.get(name))
            kill_group(self.procs[name])  # a vLLM engine's children too; exited since the poll: no matter
            self.procs[name].wait()
            self.hung_kills[name] += 1
            with (self.log_dir / f"{name}.log").open("a") as log_file:
                log_file.write(f"--- killed by the launcher as hung: {problem} ---\n")

    def _start(self, name: str) -> subprocess.Popen[bytes]:
        path = self.log_dir / f"{name}.log"
        self.redis.delete(self._health_key(name))  # a report of the previous process is not this one's
        self.watches[name] = HangWatch(grace_s=self.config.run.hang_grace_s)
        if self.restarts[name]:
            with path.open("a") as log_file:
                log_file.write(f"--- restarted by the launcher (restart {self.restarts[name]}) ---\n")
        return start_service(self.specs[name], config_path=self.config_path, redis_url=self.redis_url,
                             log_path=path)

    def completed_micro_steps(self) -> int:
        return micro_steps_done(self.read(self.names.trainer_state))

    def fail(self, reason: str) -> None:
        if self.client is None:
            return
        if read_hash(self.client, self.names.run_state).get(RunStateField.STATUS) != RunStatus.DONE:
            self.client.hset(self.names.run_state, mapping={RunStateField.STATUS: RunStatus.FAILED,
                                                            RunStateField.REASON: reason[:2000]})

    def write_failed_outputs(self, reason: str, *, redis_down: bool, state_lost: bool = False) -> None:
        """Mark the run failed and write its outputs; with Redis unreachable, summary.json alone, from
        what the launcher last read (`redis_unreachable` says so). With its state lost, the summary is
        from what the launcher last read too (`redis_state_lost`), not from what Redis holds now."""
        if not redis_down:
            try:
                self.fail(reason)
                summary = self.summary(wall_time_s=self.elapsed_s, admin={}, known=state_lost)
                if state_lost:
                    summary.update(_failed_from_known(reason, flag="redis_state_lost"))
                write_outputs(self.redis, self.names, self.out_dir, summary, self.exports)
                return
            except redis.RedisError as exc:
                reason = f"{reason}; then Redis: {exc}"
        summary = self.summary(wall_time_s=self.elapsed_s, admin={}, known=True)
        summary.update(_failed_from_known(reason, flag="redis_unreachable"))
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")

    def stop(self) -> dict[str, int]:
        self.exit_codes = self.exit_codes or (stop_services(self.procs) if self.procs else {})
        return self.exit_codes

    def close(self) -> None:
        self.stop()
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.embedded is not None:
            self.embedded.stop()

    def summary(self, *, wall_time_s: float, admin: dict[str, Any], known: bool = False) -> dict[str, Any]:
        """The run's summary from Redis (`known`: from the hashes as last read, without Redis)."""
        names = self.names
        keys = (names.run_state, names.trainer_state, names.accounting, names.sample_states)
        run_state, trainer, accounting, states = (self.known.get(k, {}) if known else self.read(k)
                                                  for k in keys)
        cfg = self.config.async_training
        name = cfg.dynamic_schedule_policy if cfg.use_dynamic_resource_scheduling else "none"
        ratio = cfg.dynamic_schedule_deactivate_ratio
        policy = admin.get("policy") or {"name": name, "deactivate_ratio": ratio}
        return {
            **run_state, "config": str(self.config_path),
            "namespace": self.names.namespace, "redis_url": "embedded" if self.embedded else self.redis_url,
            "wall_time_s": round(wall_time_s, 3), "policy": policy.get("name"), "policy_config": policy,
            "param_versions": int(trainer.get(TrainerStateField.VERSION, 0)),
            "micro_steps": micro_steps_done(trainer),
            "total_micro_steps": self.total_micro_steps,
            "replicas": {"standalone": len(self.config.standalone_ids),
                         "hybrid": len(self.config.hybrid_ids)},
            "samples": sample_counts(accounting, states),
            "switches": {"activations": admin.get("activations"),
                         "deactivations": admin.get("deactivations")},
            "mode": admin.get("mode"), "exit_codes": self.exit_codes, "controller_status": admin,
            "restarts": {name: n for name, n in self.restarts.items() if n},
            "hung_kills": {name: n for name, n in self.hung_kills.items() if n},
            "redis_restarts": self.embedded.restarts if self.embedded else None,
            "redis_hung_kills": self.embedded.hung_kills if self.embedded else None,
        }


def _failed_from_known(reason: str, *, flag: str) -> dict[str, Any]:
    """The fields a summary built from the hashes last read gets: failed, why, and `flag` saying why
    Redis's own copy was not used."""
    return {RunStateField.STATUS: RunStatus.FAILED, RunStateField.REASON: reason[:2000], flag: True}


def run_job(config_path: str | Path, out_dir: str | Path, redis_url: str | None = None, *,
            fresh: bool = False, progress: bool = True, timeout_s: float | None = None) -> dict[str, Any]:
    """Run the configured training to the end; the summary (also in `out_dir/summary.json`)."""
    with Job(config_path=config_path, out_dir=out_dir, redis_url=redis_url, fresh=fresh) as job:
        with Progress(total=job.total_micro_steps, desc=job.config.run.name, enabled=progress) as bar:
            while job.poll() is not RunStatus.DONE:
                if timeout_s is not None and job.elapsed_s > timeout_s:
                    raise TimeoutError(f"the run did not finish within {timeout_s:.0f}s; "
                                       f"logs in {job.log_dir}")
                bar.update(job.completed_micro_steps())
                time.sleep(POLL_INTERVAL_S)
            bar.update(job.completed_micro_steps())
        wall_time_s = job.elapsed_s
        admin = fetch_admin_status(admin_address(job.redis, job.names))
        job.stop()
        summary = job.summary(wall_time_s=wall_time_s, admin=admin)
        write_outputs(job.redis, job.names, job.out_dir, summary, job.exports)
    return summary
