"""One-shot check of the CUDA paths on a GPU host: `python -m bench.gpu_check --out DIR`.

Where it sits: the CPU tests prove the push protocol, the fault handling and the offload's
bookkeeping (docs/real_training.md); what only a GPU can show is here, one step per module, each
run in its own process under its own timeout, each writing one JSON result:

- `host`: driver, compute mode, torch's CUDA, NCCL, GPU names and UUIDs, vLLM if installed.
- `offload`: TorchGRPOTrainer.release_gpu / acquire_gpu on a ~0.5 B-param model, with thresholds.
- `ipc`: two processes exchange three chunks through one CUDA-IPC staging buffer, vLLM's format.
- `nccl`: two NCCL ranks on one GPU over sockets: a packed broadcast, then a rank killed mid-broadcast.
- `vllm`: (vLLM installed) real sleep level 1 + wake, one NCCL push and one CUDA-IPC push.

`--dry-run` runs what a CPU can (host facts, the offload's bookkeeping on CPU) and reports every
other step as skipped with the reason; a test runs it.
"""
