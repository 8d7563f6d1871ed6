"""Two NCCL ranks on one GPU over the socket transport: a packed broadcast, then a kill mid-broadcast.

What the `nccl` push needs (vLLM's NCCLTrainerWeightTransferEngine, packed): rank 0 broadcasts a
uint8 buffer packed from many tensors and every rank unpacks it; the project adds that a push
whose peer dies is ended by aborting the communicator (shared/weight_transfer.py: abort_group ->
ncclCommAbort), since NCCL's broadcast itself never gives up. Two processes share GPU 0, each with
its own NCCL_HOSTID (else NCCL refuses two ranks on one GPU), P2P and SHM disabled, so NCCL talks
over sockets as it would between hosts or compose containers. Checks:

- the transport is NET/Socket (NCCL_DEBUG=INFO log of rank 0);
- the packed broadcast arrives byte for byte (sha256 per rank);
- rank 1 is SIGKILLed while an 8 GiB broadcast is in flight: rank 0 is still blocked 2 s later, and
  `abort()` on its NCCL backend releases it (the stream synchronises) within 30 s;
- rank 0's CUDA context still computes afterwards.

`--dry-run` (CPU) runs the packed broadcast over gloo and skips the kill (gloo has no such abort).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gpu_check.common import Result, cuda_or_reason, main

BIG_BYTES = 8 << 30
STUCK_CHECK_S = 2.0
IN_FLIGHT_S = 0.1
RELEASE_LIMIT_S = 30.0
SOCKET_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket",
              "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
              "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ENABLE_MONITORING": "0"}


def _wait_for(path: Path, timeout_s: float, procs: Sequence[Any] = ()) -> bool:
    """Until `path` exists; False at the timeout or as soon as one of `procs` has failed."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            return path.exists()
        time.sleep(0.01)
    return True


def _packed(device: Any) -> tuple[Any, str]:
    """Tensors of several dtypes packed into one uint8 buffer (as vLLM's pack_tensors), and its digest."""
    import torch

    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=g).to(dtype) for shape, dtype in
               (([4096, 1024], torch.float32), ([8191], torch.bfloat16), ([77, 3], torch.float16))]
    flat = torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])
    return flat.to(device), hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def _abort(device: Any) -> None:
    """ncclCommAbort on the world group's communicators (what vLLM's PyNcclCommunicator.destroy does)."""
    import torch.distributed as dist

    backend = dist.group.WORLD._get_backend(device)  # type: ignore[union-attr]
    if hasattr(backend, "abort"):
        backend.abort()
    else:
        dist.distributed_c10d._abort_process_group(dist.group.WORLD)  # type: ignore[attr-defined]


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank, sync = args.rank, Path(args.sync)
    device = torch.device("cpu") if args.backend == "gloo" else torch.device("cuda:0")
    store = dist.TCPStore("127.0.0.1", args.port, 2, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group(args.backend, store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=600),
                            device_id=device if device.type == "cuda" else None)
    out: dict[str, Any] = {"rank": rank}
    sent, digest = _packed(device)
    buffer = sent if rank == 0 else torch.empty_like(sent)
    dist.broadcast(buffer, src=0)
    out["digest_sent"] = digest
    out["digest_received"] = hashlib.sha256(buffer.cpu().numpy().tobytes()).hexdigest()
    (sync / f"packed_{rank}.json").write_text(json.dumps(out))
    if args.backend == "gloo":
        return
    big = torch.empty(BIG_BYTES, dtype=torch.uint8, device=device)
    if rank == 1:
        dist.broadcast(big, src=0, async_op=True)
        _wait_for(sync / "sending", 120)
        time.sleep(IN_FLIGHT_S)  # data is flowing
        (sync / "posted").touch()  # the parent kills this process now
        time.sleep(600)
    work = dist.broadcast(big, src=0, async_op=True)
    (sync / "sending").touch()
    released = threading.Event()

    def wait_for_broadcast() -> None:
        work.wait()
        torch.cuda.synchronize(device)  # the device, so NCCL's own stream too
        released.set()

    threading.Thread(target=wait_for_broadcast, daemon=True).start()
    _wait_for(sync / "killed", 120)
    time.sleep(STUCK_CHECK_S)
    out["blocked_after_kill"] = not released.is_set()
    t0 = time.monotonic()
    threading.Thread(target=_abort, args=(device,), daemon=True).start()
    out["released"] = released.wait(RELEASE_LIMIT_S)
    out["release_s"] = round(time.monotonic() - t0, 3)
    if out["released"]:
        x = torch.ones(1024, 1024, device=device)
        out["cuda_usable_after"] = float((x @ x).sum().item()) == 1024.0**3
    (sync / "rank_0.json").write_text(json.dumps(out))
    os._exit(0)  # the aborted group's teardown is not what is measured


def run(args: argparse.Namespace, result: Result) -> Result:
    if args.rank is not None:
        rank_main(args)
        return None  # type: ignore[return-value]
    no_cuda = cuda_or_reason()
    if no_cuda and not args.dry_run:
        return result.skip(f"needs CUDA: {no_cuda}")
    from shared.runtime import free_port

    backend = "gloo" if no_cuda else "nccl"
    sync = Path(tempfile.mkdtemp(prefix="gpu_check_nccl_"))
    port = free_port()
    ranks, logs = [], []
    for rank in (0, 1):
        env = {**os.environ, **SOCKET_ENV, "NCCL_HOSTID": f"gpu-check-rank-{rank}"}
        log = open(sync / f"rank_{rank}.log", "w")  # noqa: SIM115 (closed below)
        logs.append(log)
        ranks.append(subprocess.Popen([sys.executable, "-m", "bench.gpu_check.nccl", "--result", os.devnull,
                                       "--rank", str(rank), "--port", str(port), "--sync", str(sync),
                                       "--backend", backend], env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        for rank in (0, 1):
            arrived = _wait_for(sync / f"packed_{rank}.json", 180, ranks)
            result.check(f"packed_broadcast_reached_rank_{rank}", arrived)
        packed = [json.loads((sync / f"packed_{r}.json").read_text()) for r in (0, 1)]
        result.check("packed_broadcast_byte_identical",
                     packed[1]["digest_received"] == packed[0]["digest_sent"])
        if backend == "gloo":
            result.reason = "dry run on CPU: packed broadcast over gloo; the kill and NCCL abort need CUDA"
            return result
        result.check("transport_is_socket", "NET/Socket" in (sync / "rank_0.log").read_text())
        result.check("rank_1_posted_the_big_broadcast", _wait_for(sync / "posted", 120, ranks))
        ranks[1].send_signal(signal.SIGKILL)
        ranks[1].wait(30)
        (sync / "killed").touch()
        result.check("rank_0_reported", _wait_for(sync / "rank_0.json", 120, ranks[:1]))
        rank0 = json.loads((sync / "rank_0.json").read_text())
        result.data["rank_0"] = rank0
        result.check("rank_0_blocked_after_the_kill", rank0.get("blocked_after_kill", False))
        result.check("abort_released_rank_0", rank0.get("released", False))
        result.check("cuda_usable_after_abort", rank0.get("cuda_usable_after", False))
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        for log in logs:
            log.close()
        result.data["rank_0_log_tail"] = (sync / "rank_0.log").read_text()[-3000:]
        result.data["rank_1_log_tail"] = (sync / "rank_1.log").read_text()[-1500:]
    return result


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--sync", default="", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="nccl", help=argparse.SUPPRESS)


if __name__ == "__main__":
    main("nccl", run, add_args)
