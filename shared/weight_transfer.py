"""Push weight transports: vLLM's weight-transfer API, driven over our command streams.

Where it sits: `shared/weights.py` (filesystem) is the durable transport, written for every
version; a push transport is a fast path the controller tries first for a weight sync and
falls back from to the filesystem when the push fails (docs/real_training.md):

- `nccl`: standalone replicas. The trainer broadcasts from GPU as rank 0 of one NCCL group
  with every standalone worker (vLLM's `NCCLTrainerWeightTransferEngine`, packed).
- `ipc`: hybrid replicas on the trainer's GPUs. CUDA IPC handles of a bounded GPU staging
  buffer (vLLM's `IPCTrainerWeightTransferEngine`, packed), so it works after the trainer has
  offloaded its params to CPU to make room for the woken hybrids.
- `gloo`: the NCCL engine's twin on `torch.distributed` gloo, for CPU hosts. It runs the same
  handshake (init, start, update, finish) through the same vLLM worker API, so CI exercises
  the push protocol with real vLLM and torch; only the communicator differs.

The trainer side runs vLLM's trainer engines with a client (the four methods of vLLM's
`VLLMWeightSyncClient`) that sends each call to the target rollout workers as a command; the
worker side is vLLM's own (`AsyncLLM.init_weight_transfer_engine` and friends), configured by
`weight_transfer_config`. `gloo` is registered in vLLM's factories by `register_vllm_plugin`,
which vLLM calls in its engine processes through the `vllm.general_plugins` entry point.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

PUSH_TRANSPORTS = ("nccl", "ipc", "gloo")
TRANSPORTS = ("filesystem", *PUSH_TRANSPORTS)
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
        WeightTransferEngineFactory.register_engine("gloo", __name__, "GlooWeightTransferEngine")
    if "gloo" not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine("gloo", __name__, "GlooTrainerWeightTransferEngine")


def trainer_engine(transport: str, *, client: Any, module: Any, world_size: int,
                   master_address: str, master_port: int) -> Any:
    """Rendezvous with the workers behind `client` and return vLLM's trainer-side engine."""
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    register_vllm_plugin()
    info: Any
    if transport == "ipc":
        info = IPCTrainerInitInfo(rank=0, packed=True)
    elif transport in ("nccl", "gloo"):
        info_cls = NCCLTrainerInitInfo if transport == "nccl" else _gloo_engines()["GlooTrainerInitInfo"]
        info = info_cls(rank=0, master_address=master_address, master_port=master_port,
                        world_size=world_size)
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


class LocalSyncClient:
    """vLLM's VLLMWeightSyncClient onto in-process engines (anything with `transfer`, e.g.
    VllmEngine), for tests and benchmarks; the services use StreamSyncClient instead. Its calls
    come from the transfer thread and run on `loop`, where the engines live."""

    def __init__(self, engines: Sequence[Any], loop: asyncio.AbstractEventLoop, *, version: int) -> None:
        self.engines = list(engines)
        self.loop = loop
        self.version = version
        self.replica_ids = [f"local_{i}" for i in range(len(self.engines))]
        self.replica_world_size = 1

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._all("init", [init_info_for(init_info, i, 1) for i in range(len(self.engines))])

    def start_weight_update(self) -> None:
        self._all("start", [{}] * len(self.engines))

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._all("update", [wire_safe(update_info)] * len(self.engines))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish", [{}] * len(self.engines))

    def _all(self, step: str, infos: list[dict[str, Any]]) -> None:
        async def run() -> None:
            await asyncio.gather(*(engine.transfer(step, info, version=self.version)
                                   for engine, info in zip(self.engines, infos, strict=True)))

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=TIMEOUT_S)


class GlooCommunicator:
    """The slice of vLLM's PyNcclCommunicator the NCCL engines use, on a gloo process group."""

    def __init__(self, *, master_address: str, master_port: int, rank: int, world_size: int) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=TIMEOUT_S)
        self._store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0,
                                    timeout=timeout, wait_for_workers=False)
        self._group = dist.ProcessGroupGloo(dist.PrefixStore("dynsched-weights", self._store),
                                            rank, world_size, timeout)

    def broadcast(self, tensor: Any, src: int, stream: Any = None) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = src
        self._group.broadcast([tensor], options).wait()

    def destroy(self) -> None:
        self._group = None
        self._store = None


def __getattr__(name: str) -> Any:
    """The gloo engines subclass vLLM's NCCL engines, so they are built on first use (vLLM stays
    an optional dependency of this module)."""
    if name.startswith("Gloo"):
        return _gloo_engines()[name]
    raise AttributeError(name)


_ENGINES: dict[str, type] = {}


def _gloo_engines() -> dict[str, type]:
    if _ENGINES:
        return _ENGINES
    import torch
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
        NCCLWeightTransferEngine,
        NCCLWeightTransferUpdateInfo,
    )

    @dataclass
    class GlooTrainerInitInfo(NCCLTrainerInitInfo):
        backend: ClassVar[str] = "gloo"
        packed: bool = False  # packing uses CUDA streams

    class GlooWeightTransferEngine(NCCLWeightTransferEngine):
        """Worker side: NCCL's engine with a gloo group, unpacked, no device synchronisation."""

        def init_transfer_engine(self, init_info: NCCLWeightTransferInitInfo) -> None:
            assert init_info.master_address is not None and init_info.master_port is not None
            self.packed = False
            rank = (self.parallel_config.data_parallel_index * self.parallel_config.world_size
                    + self.parallel_config.rank + init_info.rank_offset)
            self.model_update_group = GlooCommunicator(  # type: ignore[assignment]
                master_address=init_info.master_address, master_port=init_info.master_port,
                rank=rank, world_size=init_info.world_size)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
            if self.model_update_group is None:
                raise RuntimeError("gloo weight transfer not initialized")
            for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names,
                                               update_info.shapes, strict=True):
                weight = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
                self.model_update_group.broadcast(weight, src=0)
                self.model.load_weights([(name, weight)])

    class GlooTrainerWeightTransferEngine(NCCLTrainerWeightTransferEngine):
        """Trainer side: rank 0 of the gloo group; the handshake is NCCL's."""

        init_info_cls = GlooTrainerInitInfo

        @classmethod
        def trainer_init(cls, init_info: Any, *, client: Any, source: Any = None) -> Any:
            from concurrent.futures import ThreadPoolExecutor

            engine = cls(client=client, source=source, is_sender=True, packed=False)
            payload = worker_init_payload(NCCLWeightTransferInitInfo(
                master_address=init_info.master_address, master_port=init_info.master_port,
                rank_offset=1, world_size=init_info.world_size))
            with ThreadPoolExecutor(max_workers=1) as pool:  # workers block in the rendezvous too
                joined = pool.submit(client.init_weight_transfer_engine, payload)
                engine.model_update_group = GlooCommunicator(  # type: ignore[assignment]
                    master_address=init_info.master_address, master_port=init_info.master_port,
                    rank=0, world_size=init_info.world_size)
                joined.result()
            return engine

        def _broadcast(self, source: Any, meta: Any) -> None:
            assert self.model_update_group is not None
            pairs: Iterator[tuple[str, torch.Tensor]] = self._checked_iter(source, meta)
            for _name, tensor in pairs:
                self.model_update_group.broadcast(tensor.detach().contiguous(), src=0)

    _ENGINES.update(GlooTrainerInitInfo=GlooTrainerInitInfo, GlooWeightTransferEngine=GlooWeightTransferEngine,
                    GlooTrainerWeightTransferEngine=GlooTrainerWeightTransferEngine)
    return _ENGINES
