"""The `gloo` weight-transfer backend: vLLM's NCCL engines on a `torch.distributed` gloo group.

Where it sits: shared/weight_transfer.py registers these classes in vLLM's factories (vLLM
imports this module by name, in its engine processes too), so a CPU host runs the same push
handshake as a CUDA host running `nccl`; only the communicator and packing differ (gloo has
no CUDA streams, so tensors go one by one, unpacked). Imports vLLM: import it only where vLLM
is installed.
"""

from __future__ import annotations

import datetime
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLTrainerInitInfo,
    NCCLTrainerWeightTransferEngine,
    NCCLWeightTransferEngine,
    NCCLWeightTransferUpdateInfo,
)

from shared.weight_transfer import TIMEOUT_S, PushAborted

PORT_BUSY_WAIT_S = 30.0
"""How long the trainer waits for a fixed rendezvous port still held by the group it just aborted
(that group's stores go once its last op has failed: promptly for a dead peer, at gloo's timeout
for a stopped one)."""


def _store(address: str, port: int, world_size: int, is_master: bool, timeout: datetime.timedelta) -> Any:
    deadline = time.monotonic() + PORT_BUSY_WAIT_S
    while True:
        try:
            return dist.TCPStore(address, port, world_size, is_master=is_master, timeout=timeout,
                                 wait_for_workers=False)
        except dist.DistNetworkError as exc:
            if not (is_master and "EADDRINUSE" in str(exc) and time.monotonic() < deadline):
                raise
            time.sleep(0.2)


class GlooCommunicator:
    """The slice of vLLM's PyNcclCommunicator the NCCL engines use, on a gloo process group.
    Rank 0 (the trainer) hosts the rendezvous store.

    `abort()` is the twin of NCCL's `ncclCommAbort`: a broadcast blocked on a peer that stopped
    returns at once with PushAborted. gloo's own `ProcessGroup.abort()` does not release a pending
    op (tried on torch 2.13: the op waits for the peer's socket to close or gloo's timeout), so the
    wait here is on the op's future and the abort flag together."""

    def __init__(self, *, master_address: str, master_port: int, rank: int, world_size: int) -> None:
        timeout = datetime.timedelta(seconds=TIMEOUT_S)
        self._store: Any = _store(master_address, master_port, world_size, rank == 0, timeout)
        self._group: Any = dist.ProcessGroupGloo(dist.PrefixStore("dynsched-weights", self._store),
                                                 rank, world_size, timeout)
        self._aborted = threading.Event()
        self._pending: threading.Event | None = None

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        if self._group is None or self._aborted.is_set():
            raise PushAborted("the gloo weight group was aborted")
        options = dist.BroadcastOptions()
        options.rootRank = src
        work = self._group.broadcast([tensor], options)
        finished = self._pending = threading.Event()
        if self._aborted.is_set():  # abort() ran between the check above and `_pending`
            finished.set()
        work.get_future().add_done_callback(lambda _: finished.set())
        finished.wait()
        error = ""
        if self._aborted.is_set():
            error = "the gloo weight group was aborted during a broadcast"
        else:
            try:
                work.wait()
            except RuntimeError as exc:  # the op's own error, e.g. a peer's socket closed
                error = str(exc)
        # No frame of a raised error may hold the op: it holds the group, the group its store, and
        # the store the rendezvous port that the next group binds again (rollout.weight_transfer_port).
        del work
        if error:
            raise PushAborted(error)

    def abort(self) -> None:
        """Release a blocked broadcast (from another thread); later ones raise at once."""
        self._aborted.set()
        if self._pending is not None:
            self._pending.set()

    def destroy(self) -> None:
        self.abort()
        # A gloo group whose op still waits on a stopped peer blocks its destructor until that op
        # ends (the peer's socket closes, or gloo's timeout): let it end on a daemon thread.
        refs = [self._group, self._store]
        self._group = self._store = None
        threading.Thread(target=refs.clear, name="gloo-group-drop", daemon=True).start()


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
                + self.parallel_config.rank + init_info.rank_offset)  # as vLLM's worker_init_process_group
        self.model_update_group = GlooCommunicator(  # type: ignore[assignment]
            master_address=init_info.master_address, master_port=init_info.master_port,
            rank=rank, world_size=init_info.world_size)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # no accelerator to synchronise

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
        engine = cls(client=client, source=source, is_sender=True, packed=False)
        payload = worker_init_payload(NCCLWeightTransferInitInfo(
            master_address=init_info.master_address, master_port=init_info.master_port,
            rank_offset=1, world_size=init_info.world_size))
        with ThreadPoolExecutor(max_workers=1) as pool:  # the workers block in the rendezvous too
            joined = pool.submit(client.init_weight_transfer_engine, payload)
            engine.model_update_group = GlooCommunicator(  # type: ignore[assignment]
                master_address=init_info.master_address, master_port=init_info.master_port,
                rank=0, world_size=init_info.world_size)
            joined.result()
        return engine

    def _broadcast(self, source: Any, meta: Any) -> None:
        assert self.model_update_group is not None
        for _name, tensor in self._checked_iter(source, meta):
            self.model_update_group.broadcast(tensor.detach().contiguous(), src=0)
