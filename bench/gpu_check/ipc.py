"""CUDA IPC between two processes, in the format of vLLM 0.32's packed IPC weight transfer.

What `ipc` pushes do (shared/weight_transfer.py, vLLM's `packed_ipc_producer` / `packed_ipc_consumer`):
the trainer exports ONE uint8 staging buffer once (`reduce_tensor`), and ships, per chunk, the names,
dtype names, shapes, byte sizes and the handle dict `{gpu_uuid: rebuild_cuda_tensor args}` (pickled,
base64, as `ipc_handles_pickled`); the replica looks its own GPU's UUID up, rewrites args[6] (the
device index) to its own index, rebuilds the buffer once and reuses the mapping for every chunk
(`PackedBufferImporter`), clones each tensor out, and acks; only then is the buffer refilled in
place. After the last chunk the replica drops its mapping and the trainer's `ipc_collect` returns
the memory. Checks: each chunk byte-identical, one rebuild for three chunks, memory back.

With two or more GPUs the producer uses GPU 1 and the consumer sees only that GPU (as index 0), so
the index rewrite is exercised; vLLM's own consumer is used when vLLM is installed.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pickle
import subprocess
import sys
from typing import Any

from bench.gpu_check.common import Result, cuda_or_reason, gib, main

NUM_CHUNKS = 3
SPECS = (("layer.{k}.w", "float32", [1024, 512]), ("layer.{k}.b", "bfloat16", [4096]),
         ("layer.{k}.e", "float16", [333, 7]))
BUFFER_BYTES = 256 << 20
"""The staging buffer (vLLM's default is 1 GiB); each chunk fills a prefix of it."""
RETURNED_TOLERANCE_BYTES = 64 << 20
ACK = "ACK "
"""Marks the consumer's replies on its stdout (library logs may share it)."""


def _read_ack(stdout: Any) -> dict[str, Any]:
    for line in stdout:
        if line.startswith(ACK):
            return dict(json.loads(line[len(ACK):]))
    return {}


def _tensors(k: int, device: Any) -> list[tuple[str, Any]]:
    import torch

    g = torch.Generator().manual_seed(k)
    return [(name.format(k=k), torch.randn(shape, generator=g).to(getattr(torch, dtype)).to(device))
            for name, dtype, shape in SPECS]


def _digest(tensors: list[tuple[str, Any]]) -> str:
    h = hashlib.sha256()
    for name, t in tensors:
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def _unpack(buffer: Any, msg: dict[str, Any]) -> list[tuple[str, Any]]:
    """vLLM's unpack_tensor + clone, for hosts without vLLM."""
    import torch

    parts = buffer[: sum(msg["tensor_sizes"])].split(msg["tensor_sizes"])
    return [(n, p.contiguous().view(getattr(torch, d)).view(s).clone())
            for n, d, s, p in zip(msg["names"], msg["dtype_names"], msg["shapes"], parts, strict=True)]


def consumer() -> None:
    """The replica's side: one JSON line per chunk on stdin, one ack per line on stdout."""
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    index = torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    cache: dict[tuple[Any, ...], Any] = {}
    try:
        from vllm.distributed.weight_transfer.packed_tensor import PackedBufferImporter, packed_ipc_consumer
        importer: Any = PackedBufferImporter()
    except ImportError:
        packed_ipc_consumer = importer = None
    rebuilds = 0
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("close"):
            cache.clear()
            if importer is not None:
                importer.close()
            torch.cuda.synchronize()
            print(ACK + json.dumps({"closed": True, "rebuilds": rebuilds}), flush=True)
            return
        handle = pickle.loads(base64.b64decode(msg["ipc_handles_pickled"]))
        args = list(handle[uuid])  # KeyError: no handle for this GPU (the hybrid on another GPU)
        sent_index = args[6]
        if importer is not None:
            before = importer._entry
            tensors = packed_ipc_consumer(ipc_handle=handle, names=msg["names"], shapes=msg["shapes"],
                                          dtype_names=msg["dtype_names"], tensor_sizes=msg["tensor_sizes"],
                                          device_index=index, importer=importer)
            rebuilds += importer._entry is not before
        else:
            args[6] = index
            key = tuple(args)
            if key not in cache:
                cache.clear()
                cache[key] = rebuild_cuda_tensor(*args)
                rebuilds += 1
            tensors = _unpack(cache[key], msg)
        print(ACK + json.dumps({"chunk": msg["chunk"], "sha256": _digest(tensors), "sent_index": sent_index,
                          "index": index, "uuid": uuid, "vllm_consumer": importer is not None}), flush=True)


def run(args: argparse.Namespace, result: Result) -> Result:
    if args.consumer:
        consumer()
        return None  # type: ignore[return-value]
    no_cuda = cuda_or_reason()
    if no_cuda:
        return result.skip(f"needs CUDA: {no_cuda}")
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    index = 1 if torch.cuda.device_count() > 1 else 0
    torch.cuda.set_device(index)
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    free_start = torch.cuda.mem_get_info(index)[0]  # before the consumer's context exists
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"}
    cmd = [sys.executable, "-m", "bench.gpu_check.ipc", "--result", os.devnull, "--consumer"]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdin is not None and child.stdout is not None
    sizes = [t.numel() * t.element_size() for _, t in _tensors(0, "cpu")]
    buffer = torch.empty(BUFFER_BYTES, dtype=torch.uint8, device=f"cuda:{index}")
    _, ipc_args = reduce_tensor(buffer)  # exported once, as packed_ipc_producer does
    handle = base64.b64encode(pickle.dumps({uuid: ipc_args})).decode()
    acks = []
    for k in range(NUM_CHUNKS):
        tensors = _tensors(k, f"cuda:{index}")
        flat = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, t in tensors])
        buffer[: flat.numel()].copy_(flat)  # in place: the consumer acked the previous chunk
        torch.cuda.current_stream().synchronize()
        msg = {"chunk": k, "names": [n for n, _ in tensors], "shapes": [list(t.shape) for _, t in tensors],
               "dtype_names": [str(t.dtype).split(".")[-1] for _, t in tensors], "tensor_sizes": sizes,
               "ipc_handles_pickled": handle}
        child.stdin.write(json.dumps(msg) + "\n")
        child.stdin.flush()
        ack = _read_ack(child.stdout)
        acks.append(ack)
        result.check(f"chunk_{k}_byte_identical", ack.get("sha256") == _digest(tensors))
    child.stdin.write(json.dumps({"close": True}) + "\n")
    child.stdin.flush()
    closed = _read_ack(child.stdout)
    child.wait(60)
    result.check("one_rebuild_for_all_chunks", closed.get("rebuilds") == 1)
    del buffer, tensors, flat
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    free_end = torch.cuda.mem_get_info(index)[0]
    result.data.update(acks=acks, producer_index=index, uuid=uuid, buffer_bytes=BUFFER_BYTES,
                       free_start_gib=gib(free_start), free_end_gib=gib(free_end),
                       index_rewritten=bool(acks and acks[0].get("sent_index") != acks[0].get("index")))
    result.check("memory_returned_after_collection", free_end >= free_start - RETURNED_TOLERANCE_BYTES)
    return result


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--consumer", action="store_true", help=argparse.SUPPRESS)


if __name__ == "__main__":
    main("ipc", run, add_args)
