"""A worker's end of a gloo push in its own process, so a test can kill or stall it mid-broadcast.

Not a test module: `PeerClient` (the trainer's SyncClient onto one such process) and `serve` (the
process's body) for tests/test_push_faults.py. Imports vLLM (through shared.gloo_transfer) in the
child only.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import threading
import time
from typing import Any

from shared.vocab import PushStep
from shared.weight_transfer import SyncClient

STALL_S = 3600.0


def serve(conn: Any, midway: Any, stall: bool) -> None:
    """Join the trainer's group on `init`; on `update` receive each tensor, set `midway` after the
    first and, if `stall`, stop there as a hung peer would; `finish` replies with what arrived."""
    import torch

    from shared.gloo_transfer import GlooCommunicator

    group: GlooCommunicator | None = None
    received: dict[str, Any] = {}
    while True:
        try:
            step, info = conn.recv()
        except EOFError:
            return
        if step == PushStep.INIT:
            group = GlooCommunicator(master_address=info["master_address"], master_port=info["master_port"],
                                     rank=info["rank_offset"], world_size=info["world_size"])
        elif step == PushStep.UPDATE:
            assert group is not None
            for i, (name, dtype, shape) in enumerate(zip(info["names"], info["dtype_names"], info["shapes"],
                                                         strict=True)):
                tensor = torch.empty(shape, dtype=getattr(torch, dtype))
                group.broadcast(tensor, src=0)
                received[name] = tensor.numpy().tobytes()
                if i == 0:
                    midway.set()
                    if stall:
                        time.sleep(STALL_S)
        conn.send(received if step == PushStep.FINISH else None)


class PeerClient(SyncClient):
    """The trainer's client onto one `serve` process (replica `standalone_0`)."""

    def __init__(self, *, incarnation: str, stall: bool = False) -> None:
        super().__init__()
        context = multiprocessing.get_context("spawn")
        self.replica_ids = ["standalone_0"]
        self.replica_world_size = 1
        self.version = 1
        self.incarnations = (incarnation,)
        self.midway = context.Event()
        self.received: dict[str, bytes] = {}
        self.joined_port = 0
        self._conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, self.midway, stall), daemon=True)
        self.process.start()

    def _send(self, step: PushStep, payloads: list[dict[str, Any]]) -> None:
        if step is PushStep.INIT:
            self.joined_port = int(payloads[0]["master_port"])
        call: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                self._conn.send((step, payloads[0]))
                while not call.cancelled():
                    if self._conn.poll(0.05):
                        reply = self._conn.recv()  # EOFError: the peer died
                        if step is PushStep.FINISH:
                            self.received = reply
                        call.set_result(None)
                        return
            except BaseException as exc:
                if not call.cancelled():
                    call.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        self._wait(step, call)

    def close(self) -> None:
        self.process.kill()
        self.process.join(10)
