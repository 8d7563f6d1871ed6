"""Push weight transports: vLLM's weight-transfer API, driven over our command streams.

Where it sits: `shared/weights.py` (filesystem) is the durable transport, written for every
version; a push transport is a fast path the controller tries first for a weight sync and
falls back from to the filesystem when the push fails (docs/real_training.md):

- `nccl`: standalone replicas. The trainer broadcasts from GPU as rank 0 of one NCCL group
  with every standalone worker (vLLM's `NCCLTrainerWeightTransferEngine`, packed).
- `ipc`: hybrid replicas on the trainer's GPUs. CUDA IPC handles of a bounded GPU staging
  buffer (vLLM's `IPCTrainerWeightTransferEngine`, packed), so it works after the trainer has
  offloaded its params to CPU to make room for the woken hybrids.
- `gloo`: the NCCL engine's twin on `torch.distributed` gloo, for CPU hosts (shared/gloo_transfer.py).
  It runs the same handshake (init, start, update, finish) through the same vLLM worker API, so
  CI exercises the push protocol with real vLLM and torch; only the communicator differs.

The trainer side runs vLLM's trainer engines with a client (the four methods of vLLM's
`VLLMWeightSyncClient`) that sends each call to the target rollout workers as a command; the
worker side is vLLM's own (`AsyncLLM.init_weight_transfer_engine` and friends), configured by
`weight_transfer_config`. `gloo` is registered in vLLM's factories by `register_vllm_plugin`,
which vLLM calls in its engine processes through the `vllm.general_plugins` entry point.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
import pickle
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from shared.vocab import PUSH_ACTIONS, PushStep

log = logging.getLogger(__name__)

PUSH_TRANSPORTS = ("nccl", "ipc", "gloo")
TRANSPORTS = ("filesystem", *PUSH_TRANSPORTS)
PER_REPLICA_TRANSPORTS = ("ipc",)
"""Pushed to one replica at a time: CUDA IPC reaches only a replica on the trainer's own GPU, so a
hybrid on another GPU must fail alone (and reload from the filesystem), not fail its neighbour."""
RENDEZVOUS_TRANSPORTS = ("nccl", "gloo")
"""Form a group at a TCP rendezvous hosted by the trainer (rollout.weight_transfer_port)."""
GLOO_MODULE = "shared.gloo_transfer"
TIMEOUT_S = 300.0
"""Rendezvous and per-operation limit of a gloo push; the first push waits for the workers' engines
to start (tens of seconds on a loaded CPU host)."""
TARGET_KEY = "target_incarnation"
"""Command data key: the worker process a push step is for. A worker refuses a step addressed to
another incarnation (a command replayed after it restarted: its old group is gone)."""
WATCH_POLL_S = 0.1


class PushAborted(RuntimeError):
    """A push was aborted: its deadline passed or a target failed; the group is unusable."""


def push_plan(transports: Mapping[str, str], replica_ids: Sequence[str],
              roles: Sequence[Collection[str]]) -> list[tuple[str, tuple[str, ...]]]:
    """(transport, group) for each push of one sync to `replica_ids`: the replicas of each role (the
    standalones, the hybrids) apart, each role over its own transport (`transports`: replica id ->
    push transport; absent or 'filesystem': not pushed), split by `push_groups`. A replica belongs to
    one push group for good: vLLM's engine holds one transfer group, so a sync that also pushes the
    hybrids (`dynamic_schedule_fold_hybrid_sync`) must not form a group of standalones and hybrids
    that the next sync, without them, would replace (a gloo push hung, then fell back, each time)."""
    plan = []
    for role in roles:
        members = [r for r in replica_ids if r in role]
        for transport in dict.fromkeys(transports.get(r, "") for r in members):
            if transport and transport != "filesystem":
                group = [r for r in members if transports.get(r) == transport]
                plan += [(transport, g) for g in push_groups(transport, group)]
    return plan


def push_groups(transport: str, replica_ids: Sequence[str]) -> list[tuple[str, ...]]:
    """How one sync's push to `replica_ids` is split: one group for a broadcast transport, one
    push per replica for a per-device one (each can fail, and fall back, alone)."""
    if transport in PER_REPLICA_TRANSPORTS:
        return [(r,) for r in replica_ids]
    return [tuple(replica_ids)] if replica_ids else []


def register_vllm_plugin() -> None:
    """vLLM `general_plugins` entry point: make `gloo` a weight-transfer backend (idempotent)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if "gloo" not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine("gloo", GLOO_MODULE, "GlooWeightTransferEngine")
    if "gloo" not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine("gloo", GLOO_MODULE, "GlooTrainerWeightTransferEngine")


def trainer_engine(transport: str, *, client: Any, module: Any, world_size: int,
                   master_address: str, master_port: int) -> Any:
    """Rendezvous with the workers behind `client` and return vLLM's trainer-side engine."""
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    register_vllm_plugin()
    rendezvous = {"master_address": master_address, "master_port": master_port, "world_size": world_size}
    info: Any
    if transport == "ipc":
        info = IPCTrainerInitInfo(rank=0, packed=True)  # a bounded staging buffer, see the module doc
    elif transport == "nccl":
        info = NCCLTrainerInitInfo(rank=0, **rendezvous)  # type: ignore[arg-type]
    elif transport == "gloo":
        from shared.gloo_transfer import GlooTrainerInitInfo

        info = GlooTrainerInitInfo(rank=0, **rendezvous)  # type: ignore[arg-type]
    else:
        raise ValueError(f"not a push transport: {transport!r} (one of {PUSH_TRANSPORTS})")
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=ModuleSource(module))


def wire_safe(update_info: dict[str, Any]) -> dict[str, Any]:
    """CUDA IPC handles hold tuples of torch types that msgpack cannot carry: pickle them into
    `ipc_handles_pickled`, which vLLM's IPC engine unpickles (as for its HTTP client)."""
    if update_info.get("ipc_handles") is None:
        return update_info
    out = {k: v for k, v in update_info.items() if k != "ipc_handles"}
    out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(update_info["ipc_handles"])).decode()
    return out


def init_info_for(init_info: dict[str, Any], index: int, replica_world_size: int) -> dict[str, Any]:
    """Replica `index` of the targets takes ranks after the trainer (rank 0) and the replicas
    before it: vLLM adds its own TP/DP rank to `rank_offset`."""
    if "rank_offset" not in init_info:
        return init_info
    return {**init_info, "rank_offset": int(init_info["rank_offset"]) + index * replica_world_size}


def abort_group(engine: Any) -> None:
    """Abort a trainer engine's communicator so a broadcast blocked on a dead or stopped peer
    returns: gloo's abort, or vLLM's PyNcclCommunicator.destroy (ncclCommAbort). IPC has none."""
    group = getattr(engine, "model_update_group", None)
    if group is None:
        return
    abort = getattr(group, "abort", None) or group.destroy
    abort()


def close_group(engine: Any) -> None:
    """Shut a trainer engine down and let go of its rendezvous store now, not at the next garbage
    collection: a fixed rollout.weight_transfer_port must be free for the group formed next. (A
    failed push's traceback still holds vLLM's PyNcclCommunicator; its `group` holds the store.)"""
    group = getattr(engine, "model_update_group", None)
    engine.shutdown()
    if group is not None and hasattr(group, "group"):
        group.group = None


def send_within(engine: Any, client: SyncClient, *, timeout_s: float) -> None:
    """`engine.send_weights()`, ended by `timeout_s` or by the client's first failure: then the
    client's pending calls are cancelled and the communicator aborted, so the push raises
    PushAborted instead of waiting for ever on a peer's broadcast (vLLM's NCCL send has no limit)."""
    done = threading.Event()
    deadline = time.monotonic() + timeout_s

    def watch() -> None:
        while not done.wait(WATCH_POLL_S):
            if client.failed.is_set() or time.monotonic() >= deadline:
                client.abort(client.failure or f"the push exceeded its {timeout_s:.0f}s deadline")
                log.warning("aborting the weight push to %s: %s", client.replica_ids, client.failure)
                abort_group(engine)
                return

    watcher = threading.Thread(target=watch, name="push-watchdog", daemon=True)
    watcher.start()
    try:
        engine.send_weights()
    except BaseException as exc:
        if client.failed.is_set():
            raise PushAborted(client.failure) from exc
        raise
    finally:
        done.set()
        watcher.join()
    if client.failed.is_set():  # aborted after the last byte went out: the targets' state is unknown
        raise PushAborted(client.failure)


class SyncClient:
    """vLLM's VLLMWeightSyncClient for `replica_ids`: each of its four calls becomes one step
    (init, start, update, finish) per replica, with that replica's payload, delivered by `_send`
    and done on every replica before the call returns. Subclasses say how a step is delivered.

    `abort(reason)` (from any thread) fails the push: pending calls end with PushAborted and later
    ones raise at once; `failed` is set by it and by a step that failed, for send_within's watch."""

    replica_ids: list[str]
    replica_world_size: int
    version: int
    incarnations: tuple[str, ...] = ()
    """The targets' worker processes, when known: the trainer forms its group anew when they change."""

    def __init__(self) -> None:
        self.failed = threading.Event()
        self.failure = ""
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()

    def abort(self, reason: str) -> None:
        with self._lock:
            if not self.failed.is_set():
                self.failure = reason
                self.failed.set()
            calls = list(self._calls)
        for call in calls:
            call.cancel()

    def _wait(self, step: PushStep, call: concurrent.futures.Future[Any],
              timeout_s: float | None = None) -> None:
        """Block the transfer thread on one step's fan-out; a failure fails the whole push."""
        with self._lock:
            if self.failed.is_set():
                call.cancel()
                raise PushAborted(self.failure)
            self._calls.add(call)
        try:
            call.result(timeout=timeout_s)
        except concurrent.futures.CancelledError:
            raise PushAborted(self.failure or f"{PUSH_ACTIONS[step]} cancelled") from None
        except BaseException as exc:
            self.abort(f"{PUSH_ACTIONS[step]}: {type(exc).__name__}: {exc}")
            raise
        finally:
            with self._lock:
                self._calls.discard(call)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._send(PushStep.INIT, [init_info_for(init_info, i, self.replica_world_size)
                            for i in range(len(self.replica_ids))])

    def start_weight_update(self) -> None:
        self._send(PushStep.START, [{} for _ in self.replica_ids])

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        if isinstance(update_info, list):
            raise ValueError("per-rank update payloads are not supported; one payload for all replicas")
        payload = wire_safe(update_info)
        self._send(PushStep.UPDATE, [payload for _ in self.replica_ids])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._send(PushStep.FINISH, [{} for _ in self.replica_ids])

    def _send(self, step: PushStep, payloads: list[dict[str, Any]]) -> None:
        raise NotImplementedError


class LocalSyncClient(SyncClient):
    """Onto in-process engines (anything with `transfer`, e.g. VllmEngine), for tests and
    benchmarks; the services use StreamSyncClient instead. Its calls come from the transfer
    thread and run on `loop`, where the engines live."""

    def __init__(self, engines: Sequence[Any], loop: asyncio.AbstractEventLoop, *, version: int) -> None:
        super().__init__()
        self.engines = list(engines)
        self.loop = loop
        self.version = version
        self.replica_ids = [f"local_{i}" for i in range(len(self.engines))]
        self.replica_world_size = 1

    def _send(self, step: PushStep, payloads: list[dict[str, Any]]) -> None:
        async def run() -> None:
            await asyncio.gather(*(engine.transfer(step, payload, version=self.version)
                                   for engine, payload in zip(self.engines, payloads, strict=True)))

        self._wait(step, asyncio.run_coroutine_threadsafe(run(), self.loop), timeout_s=TIMEOUT_S)
