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
import pickle
from collections.abc import Sequence
from typing import Any

from shared.vocab import PushStep

PUSH_TRANSPORTS = ("nccl", "ipc", "gloo")
TRANSPORTS = ("filesystem", *PUSH_TRANSPORTS)
GLOO_MODULE = "shared.gloo_transfer"
TIMEOUT_S = 300.0
"""Rendezvous and per-operation limit of a gloo push; the first push waits for the workers' engines
to start (tens of seconds on a loaded CPU host)."""


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


class SyncClient:
    """vLLM's VLLMWeightSyncClient for `replica_ids`: each of its four calls becomes one step
    (init, start, update, finish) per replica, with that replica's payload, delivered by `_send`
    and done on every replica before the call returns. Subclasses say how a step is delivered."""

    replica_ids: list[str]
    replica_world_size: int
    version: int
    incarnations: tuple[str, ...] = ()
    """The targets' worker processes, when known: the trainer forms its group anew when they change."""

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
        self.engines = list(engines)
        self.loop = loop
        self.version = version
        self.replica_ids = [f"local_{i}" for i in range(len(self.engines))]
        self.replica_world_size = 1

    def _send(self, step: PushStep, payloads: list[dict[str, Any]]) -> None:
        async def run() -> None:
            await asyncio.gather(*(engine.transfer(step, payload, version=self.version)
                                   for engine, payload in zip(self.engines, payloads, strict=True)))

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=TIMEOUT_S)
