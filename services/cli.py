"""`dynsched`: the command line of the system.

Where it sits: the only user-facing entry point. `run` and `up` hand the config to
services/launcher.py (which starts Redis and every service as its own process);
`status`, `activate`, `deactivate` and `policy` find the controller's admin API
through Redis (`names.controller_admin`) and talk to it over HTTP; `simulate` and
`plan` come from `sim.cli` when the simulator is installed and read the same config
file; `config-check` validates a config, `config-schema` prints its JSON schema.
Every failure prints one clear line on stderr and exits non-zero: 2 for bad
arguments (argparse), 1 for everything else, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from core.flow import FlowLimits
from policies.check import load_checked_config
from services import launcher
from shared.admin_auth import bind_admin_socket, check_bind, load_admin_token
from shared.config import Config, config_json_schema
from shared.names import DEFAULT_NAMESPACE, Names, RunStatus

DEFAULT_REDIS_URL = os.environ.get("DYNSCHED_REDIS_URL", "redis://127.0.0.1:6379/0")
HTTP_TIMEOUT_S = 10.0
PROG = "dynsched"


class CliError(Exception):
    """A failure to report as one line on stderr (exit status 1)."""


# -- run / up ------------------------------------------------------------------------------------------


def check_config(config_path: str) -> Config:
    """Everything a user can get wrong in a config file, found before any service starts: the file,
    its YAML, every key and value (shared/config.py), the policy module and name (policies/check.py).
    CliError, one line naming the file and key."""
    if not Path(config_path).is_file():
        raise CliError(f"config file not found: {config_path}")
    try:
        config = load_checked_config(config_path)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    flow = FlowLimits.from_config(config)
    if flow.total_train_steps == 0:
        raise CliError(f"{config_path}: data.total_rollout_steps={flow.total_rollout_steps} trains nothing: "
                       f"a weight version takes {flow.step_required} samples (ppo_mini_batch_size x "
                       "require_batches x trigger_parameter_sync_step)")
    return config


def check_admin(config: Config) -> None:
    """A controller told to bind off loopback without an admin token, or to a fixed port another process
    holds, would refuse to start (the second after its restart budget): say so before anything starts
    (the controller reads the same environment and binds the same way)."""
    host, port = config.run.admin_host, config.run.admin_port
    try:
        check_bind(host, load_admin_token())
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if port == 0:
        return
    try:
        bind_admin_socket(host, port).close()
    except OSError as exc:
        raise CliError(f"run.admin_port={port} cannot be bound on {host} ({exc.strerror}): another "
                       "process holds it (an earlier run?); pick another port, or 0 for a free one") from exc


def check_redis(redis_url: str | None) -> None:
    """A given --redis-url must answer before anything starts (None: the launcher starts its own)."""
    if redis_url is None:
        return
    try:
        with redis.Redis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0) as client:
            client.ping()
    except (redis.RedisError, ValueError) as exc:
        raise CliError(f"cannot reach Redis at {redis_url}: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def default_out_dir(config_path: str, prefix: str = "") -> Path:
    return Path("runs") / f"{prefix}{Path(config_path).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_command(*, config_path: str, out_dir: Path, redis_url: str | None, fresh: bool,
                timeout_s: float | None, progress: bool) -> int:
    """Run one training job end to end; print where its outputs are. Non-zero if a sample was lost."""
    summary = launcher.run_job(config_path, out_dir, redis_url, fresh=fresh, progress=progress,
                               timeout_s=timeout_s)
    samples, switches = summary["samples"], summary["switches"]
    print(f"{summary.get('status', '?')} in {summary['wall_time_s']:.1f}s: policy {summary['policy']}, "
          f"{summary['param_versions']} weight versions, {summary['micro_steps']} micro-steps")
    print("samples: " + ", ".join(f"{key}={value}" for key, value in samples.items()))
    print(f"switches: {switches['activations']} activations, {switches['deactivations']} deactivations")
    charts = "".join(f", {out_dir}/{name}" for name in summary.get("charts", ()))
    print(f"outputs: {out_dir}/summary.json, "
          f"{out_dir}/metrics.jsonl ({summary.get('num_cycles', 0)} cycles), "
          f"{out_dir}/audit.jsonl{charts}, logs in {out_dir}/logs/")
    if samples[launcher.LOST] != 0:
        print(f"{PROG}: error: {samples[launcher.LOST]} sample(s) lost "
              "(fed != generating+queued+trained+dropped)", file=sys.stderr)
        return 1
    return 0


def up_command(*, config_path: str, out_dir: Path, redis_url: str | None, fresh: bool) -> int:
    """Start every service and keep them running until Ctrl-C (or SIGTERM), restarting a crashed one."""
    with launcher.Job(config_path=config_path, out_dir=out_dir, redis_url=redis_url, fresh=fresh) as job:
        print(f"redis: {job.redis_url} (namespace {job.names.namespace}); logs: {job.log_dir}", flush=True)
        address: str | None = None
        status: RunStatus | None = None
        while True:
            if address is None and (address := launcher.admin_address(job.redis, job.names)):
                print(f"admin API: http://{address}   try: {PROG} status --redis-url {job.redis_url} "
                      f"--namespace {job.names.namespace}", flush=True)
            if (new_status := job.poll()) is RunStatus.DONE and status is not RunStatus.DONE:
                print("training finished; the services stay up until Ctrl-C", flush=True)
            if new_status is RunStatus.DONE:
                job.supervise()  # up after training too: a crashed service is still restarted
            status = new_status
            time.sleep(launcher.POLL_INTERVAL_S)


# -- admin API -----------------------------------------------------------------------------------------


def find_admin(*, redis_url: str, namespace: str) -> str:
    """The controller's admin "host:port", as it published it in Redis."""
    names = Names(namespace)
    try:
        with redis.Redis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0) as client:
            address = launcher.admin_address(client, names)
    except (redis.RedisError, ValueError) as exc:
        raise CliError(f"cannot read Redis at {redis_url}: {_one_line(exc)}") from exc
    if not address:
        raise CliError(f"no controller admin address at {names.controller_admin} on {redis_url}; "
                       f"is a run up there (namespace {namespace!r})? "
                       "Pass --redis-url/--namespace or --admin.")
    return address


def call_admin(address: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One admin request; its JSON answer, or CliError carrying the server's own error text."""
    url = f"http://{address}{path}"
    try:
        token = load_admin_token()
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, url, json=body, headers=headers, timeout=HTTP_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise CliError(f"{method} {url} failed: {exc}") from exc
    if response.is_error:
        raise CliError(f"{method} {url} -> HTTP {response.status_code}: {_error_text(response)}")
    try:
        return response.json()
    except ValueError:
        return response.text


def _error_text(response: httpx.Response) -> str:
    """FastAPI's `detail` (a message, or validation errors as `field: message`), else the raw body."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return response.text
    if isinstance(detail, list) and all(isinstance(item, dict) and "msg" in item for item in detail):
        return "; ".join(".".join(str(p) for p in item.get("loc", ())) + f": {item['msg']}"
                         for item in detail)
    return detail if isinstance(detail, str) else response.text


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True) if not isinstance(value, str) else value)


def policy_body(*, name: str | None, ratio: float | None) -> dict[str, Any] | None:
    """The PUT /policy body, or None for a plain GET (nothing to change). The server validates values."""
    body = {key: value for key, value in (("name", name), ("deactivate_ratio", ratio)) if value is not None}
    return body or None


# -- wiring --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Fully-async RL post-training with dynamic GPU "
                                     "scheduling, as services over Redis streams.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run one training job to the end and write its outputs")
    up = commands.add_parser("up", help="start every service and keep it running until Ctrl-C")
    for sub in (run, up):
        sub.add_argument("--config", required=True, help="run config YAML (see configs/)")
        sub.add_argument("--out", type=Path, help="output folder (default runs/<config>-<time>)")
        sub.add_argument("--redis-url", help="use this Redis instead of starting an embedded one")
        sub.add_argument("--fresh", action="store_true",
                         help="delete the keys already under the run's namespace on --redis-url")
    run.add_argument("--timeout-s", type=float, help="fail the run if it takes longer than this")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    status = commands.add_parser("status", help="print the controller's /status")
    activate = commands.add_parser("activate", help="force the hybrids on at the next safe point")
    deactivate = commands.add_parser("deactivate", help="force the hybrids off at the next safe point")
    policy = commands.add_parser("policy", help="show the policy, or change its name / deactivate ratio")
    policy.add_argument("--name",
                        help="registered policy name, e.g. default, fixed_ratio, static_fully_async")
    policy.add_argument("--ratio", type=float, help="dynamic_schedule_deactivate_ratio")
    for sub in (status, activate, deactivate, policy):
        sub.add_argument("--redis-url", default=DEFAULT_REDIS_URL,
                         help="Redis holding the admin address (default $DYNSCHED_REDIS_URL or %(default)s)")
        sub.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="run.namespace (default %(default)s)")
        sub.add_argument("--admin", metavar="HOST:PORT", help="talk to this admin address, skipping Redis")
    add_config_subcommands(commands)
    add_sim_subcommands(commands)
    return parser


def add_config_subcommands(commands: Any) -> None:
    """`config-check FILE` (every check `run` makes before starting anything) and `config-schema`."""
    check = commands.add_parser("config-check", help="validate a config file (one line per mistake)")
    check.add_argument("config", help="run config YAML")
    check.set_defaults(handler=config_check_command)
    schema = commands.add_parser("config-schema", help="print the config file's JSON schema (for editors)")
    schema.set_defaults(handler=lambda args: print_json(config_json_schema()))


def config_check_command(args: argparse.Namespace) -> int:
    config = load_checked_config(args.config)
    at = config.async_training
    policy = at.dynamic_schedule_policy if at.use_dynamic_resource_scheduling else "static_fully_async"
    print(f"{args.config}: ok ({len(config.standalone_ids)} standalone + {len(config.hybrid_ids)} hybrid "
          f"replicas, policy {policy})")
    return 0


def add_sim_subcommands(commands: Any) -> None:
    """`simulate`, `plan` and `validate` from the discrete-event simulator, when it is there."""
    try:
        sim_cli = importlib.import_module("sim.cli")
    except ImportError:
        return
    add = getattr(sim_cli, "add_subcommands", None)
    if callable(add):
        add(commands)
    add_validate = getattr(importlib.import_module("sim.validate"), "add_subcommand", None)
    if callable(add_validate):
        add_validate(commands)  # `validate`: a scenario's published rows vs the model


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.command == "up" else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.command in ("run", "up"):  # the children live in their own sessions: we stop them, in order
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal was closed
            signal.signal(sig, _raise_interrupt)
    try:
        if args.command in ("run", "up"):
            check_admin(check_config(args.config))
            check_redis(args.redis_url)
            out_dir = args.out or default_out_dir(args.config, "up-" if args.command == "up" else "")
            if args.command == "up":
                return up_command(config_path=args.config, out_dir=out_dir, redis_url=args.redis_url,
                                  fresh=args.fresh)
            return run_command(config_path=args.config, out_dir=out_dir, redis_url=args.redis_url,
                               fresh=args.fresh, timeout_s=args.timeout_s, progress=not args.no_progress)
        if args.command in ("status", "activate", "deactivate", "policy"):
            address = args.admin or find_admin(redis_url=args.redis_url, namespace=args.namespace)
            if args.command == "policy":
                body = policy_body(name=args.name, ratio=args.ratio)
                print_json(call_admin(address, "PUT" if body else "GET", "/policy", body))
            else:
                print_json(call_admin(address, "GET" if args.command == "status" else "POST",
                                      f"/{args.command}"))
            return 0
        return int(args.handler(args) or 0)  # a subcommand registered by sim.cli (simulate, plan)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; services stopped", file=sys.stderr)
        return 130
    except redis.RedisError as exc:  # Redis went away mid-run
        print(f"{PROG}: error: Redis: {_one_line(exc)}", file=sys.stderr)
        return 1
    except (CliError, launcher.ServiceCrashed, OSError, ValueError, RuntimeError, TimeoutError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
