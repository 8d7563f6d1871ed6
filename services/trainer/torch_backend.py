"""Real trainer backend: GRPO on the tiny Llama, behind TrainerBackend (docs/contracts.md).

Where it sits: the `torch` backend of the trainer service. Each micro-step gets the samples
the trainer popped from the MessageQueue (a prompt with its n scored trajectories each) and
does, timed under the original's keys:

1. `timing_s/reward`: gather the rewards the rollouter computed.
2. `timing_s/adv`: GRPO advantages, normalised within each prompt's group:
   A_i = (r_i - mean(r)) / (std(r) + eps), std unbiased as in verl; a group of one or with all
   rewards equal gets A = 0 (no baseline, no signal).
3. `timing_s/update_actor`: one AdamW step on the token-level clipped surrogate
   -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), token-mean, where
   ratio = exp(logp_theta - logp_rollout). Bypass mode: the rollout logprobs *are* the
   behaviour policy (old_log_prob is not recomputed, `timing_s/old_log_prob` is absent), so a
   trajectory stitched from several weight versions (partial rollout) or generated a few
   versions ago (staleness) is corrected token by token. Gradients are clipped by norm.

`export_weights(v)` publishes the params under their Hugging Face names through
`shared/weights.py`, so vLLM's `reload_weights` loads them. Checkpoints are indexed by param
version (model + optimizer + version) and `resume_latest()` restores the newest.
`release_gpu()`/`acquire_gpu()` drop the grads and move params and optimizer state off and back
on CUDA so co-located hybrid replicas can use the memory; on CPU they only log. `push_weights` sends the
params straight to running vLLM replicas (shared/weight_transfer.py: nccl, ipc, gloo), keeping
one vLLM trainer-side engine per (transport, replica set); a failed push drops it, so the next
push forms the group anew.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rl.model import load_pretrained, pack_batch, token_logprobs
from shared import weight_transfer, weights
from shared.runtime import free_port

log = logging.getLogger(__name__)

_CKPT_RE = re.compile(r"^ckpt_g(\d{6,})_v(\d{6,})\.pt$")


class TrajectoryLike(Protocol):
    """What the trainer reads of a trajectory (shared.schema.Trajectory has these fields)."""

    @property
    def response_token_ids(self) -> Sequence[int]: ...
    @property
    def response_logprobs(self) -> Sequence[float]: ...
    @property
    def reward(self) -> float: ...


class SampleLike(Protocol):
    """What the trainer reads of a sample (shared.schema.Sample has these fields)."""

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...
    @property
    def trajectories(self) -> Sequence[TrajectoryLike]: ...


@dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """Trainer hyper-parameters and where it reads and writes."""

    model_path: str
    """Starting model directory (HF layout); its config/tokenizer files ride along on export."""
    weights_root: str
    """Root of the filesystem weight transport the rollout workers read."""
    checkpoint_dir: str
    lr: float = 3e-4
    """Tuned on the tiny addition model: 1e-3 collapses it in one step, 1e-4 learns slowly."""
    lr_warmup_steps: int = 10
    """Linear warm-up over the first updates; Adam's first steps are sign-like and large."""
    weight_decay: float = 0.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    """DAPO's clip-higher: a wider upper bound keeps low-probability tokens learnable."""
    max_grad_norm: float = 1.0
    adv_eps: float = 1e-6
    keep_weight_versions: int = 3
    keep_checkpoints: int = 2
    """>= 2: the checkpoint being written and the one the committed progress points to."""
    device: str = "auto"
    """'auto' picks cuda when available, else cpu."""
    transfer_address: str = "127.0.0.1"
    """Where the workers reach this trainer for a push rendezvous (nccl, gloo)."""
    transfer_port: int = 0
    """The rendezvous port of the first push group formed (the next group takes the next port);
    0: a free port per group."""
    push_timeout_s: float = 300.0
    """Deadline of sending one version: past it the communicator is aborted and the push fails."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not (0 <= self.clip_ratio_low < 1 and self.clip_ratio_high >= 0):
            raise ValueError(f"bad clip ratios {self.clip_ratio_low}, {self.clip_ratio_high}")
        if self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.keep_checkpoints < 2:
            raise ValueError(f"keep_checkpoints must be >= 2 (the committed one survives the next save), "
                             f"got {self.keep_checkpoints}")


def group_advantages(rewards: Sequence[float], *, eps: float = 1e-6) -> list[float]:
    """GRPO advantages of one prompt's group (unbiased std; singleton or all-equal -> zeros)."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    r = torch.tensor(rewards, dtype=torch.float64)
    centred = r - r.mean()
    if bool((centred.abs() < 1e-12).all()):
        return [0.0] * len(rewards)
    return (centred / (r.std(unbiased=True) + eps)).tolist()


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean PPO-clip loss and the fraction of tokens where the clip is active."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    denom = mask.sum().clamp(min=1.0)
    loss = (per_token * mask).sum() / denom
    clip_frac = ((clipped > unclipped).float() * mask).sum() / denom
    return loss, clip_frac


class TorchGRPOTrainer:
    """GRPO trainer on one device. Not thread-safe."""

    def __init__(self, config: GRPOConfig) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        if config.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(config.device)
        self.model = load_pretrained(config.model_path).to(self.device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.version = 0
        self.num_updates = 0
        self.on_gpu = self.device.type == "cuda"
        self._push_groups: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, ...], Any]] = {}
        """(transport, replica ids) -> (the replicas' incarnations when it formed, vLLM's engine)."""
        self._ports: dict[tuple[str, tuple[str, ...]], int] = {}
        """A fixed rendezvous port per push group, kept when the group forms anew."""

    # -- TrainerBackend ---------------------------------------------------------------

    def train_micro_step(self, samples: Sequence[SampleLike]) -> dict[str, float]:
        """One GRPO update on `samples`; returns timing_s/* and stats."""
        if not samples:
            raise ValueError("train_micro_step needs at least one sample")
        assert self.on_gpu or self.device.type != "cuda", "train_micro_step while GPU released"
        t0 = time.monotonic()
        rewards = [[float(t.reward) for t in s.trajectories] for s in samples]
        t1 = time.monotonic()
        advantages = [group_advantages(group, eps=self.config.adv_eps) for group in rewards]
        t2 = time.monotonic()
        stats = self._update(samples, advantages)
        t3 = time.monotonic()
        flat = [r for group in rewards for r in group]
        return {
            "timing_s/reward": t1 - t0,
            "timing_s/adv": t2 - t1,
            "timing_s/update_actor": t3 - t2,
            "reward/mean": sum(flat) / len(flat),
            **stats,
        }

    def assemble_batch(self, samples: Sequence[SampleLike]) -> None:
        """Nothing to prepare ahead: the batch is packed in the micro-step."""

    def validate(self, *, global_steps: int, version: int) -> None:
        """No validation set here (the addition task's reward is the training signal)."""

    def _update(self, samples: Sequence[SampleLike], advantages: list[list[float]]) -> dict[str, float]:
        prompts: list[list[int]] = []
        responses: list[list[int]] = []
        old: list[list[float]] = []
        advs: list[float] = []
        for sample, group_adv in zip(samples, advantages, strict=True):
            for traj, adv in zip(sample.trajectories, group_adv, strict=True):
                if len(traj.response_token_ids) != len(traj.response_logprobs):
                    raise ValueError(
                        f"{len(traj.response_token_ids)} tokens but {len(traj.response_logprobs)} logprobs"
                    )
                if not traj.response_token_ids:
                    continue
                prompts.append(list(sample.prompt_token_ids))
                responses.append(list(traj.response_token_ids))
                old.append(list(traj.response_logprobs))
                advs.append(adv)
        if not responses:
            return {"loss": 0.0, "grad_norm": 0.0, "clip_frac": 0.0, "num_tokens": 0.0}
        ids, targets, mask = pack_batch(prompts, responses)
        old_logp = torch.zeros_like(mask)
        for row, (p, lps) in enumerate(zip(prompts, old, strict=True)):
            old_logp[row, len(p) - 1 : len(p) - 1 + len(lps)] = torch.tensor(lps)
        adv = torch.tensor(advs, dtype=torch.float32)[:, None].expand_as(mask)
        ids, targets, mask, old_logp, adv = (x.to(self.device) for x in (ids, targets, mask, old_logp, adv))

        logp = token_logprobs(self.model, ids, targets)
        loss, clip_frac = clipped_surrogate(
            logp,
            old_logp,
            adv,
            mask,
            clip_low=self.config.clip_ratio_low,
            clip_high=self.config.clip_ratio_high,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        lr = self.config.lr * min(1.0, (self.num_updates + 1) / max(1, self.config.lr_warmup_steps))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.num_updates += 1
        with torch.no_grad():
            log_ratio = ((logp - old_logp) * mask).sum() / mask.sum()
        return {
            "loss": loss.item(),
            "grad_norm": float(grad_norm),
            "clip_frac": clip_frac.item(),
            "num_tokens": float(mask.sum()),
            "lr": lr,
            "log_ratio/mean": log_ratio.item(),
        }

    def export_weights(self, version: int) -> str | None:
        """Publish the current params as weights `version`; returns the version directory."""
        state = {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}
        path = weights.publish(self.config.weights_root, version, state, extra_files=self.config.model_path)
        weights.gc(self.config.weights_root, keep=self.config.keep_weight_versions)
        self.version = version
        return str(path)

    def _port(self, key: tuple[str, tuple[str, ...]]) -> int:
        if not self.config.transfer_port:
            return free_port("")  # "": workers on other hosts connect
        return self._ports.setdefault(key, self.config.transfer_port + len(self._ports))

    def push_weights(self, transport: str, client: Any) -> None:
        """Send the current params to the replicas behind `client` through vLLM's transfer engine,
        within `push_timeout_s` (weight_transfer.send_within: a dead or stopped peer aborts it)."""
        key = (transport, tuple(client.replica_ids))
        members = tuple(client.incarnations)
        formed, engine = self._push_groups.pop(key, ((), None))
        if engine is not None and formed != members:
            log.info("a replica of %s restarted since its push group formed: forming it anew", list(key[1]))
            weight_transfer.close_group(engine)
            engine = None
        try:
            if engine is None:
                self._close_overlapping_groups(key)
                world_size = 1 + len(client.replica_ids) * client.replica_world_size  # trainer = rank 0
                port = self._port(key) if transport in weight_transfer.RENDEZVOUS_TRANSPORTS else 0
                engine = weight_transfer.trainer_engine(
                    transport, client=client, module=self.model, world_size=world_size,
                    master_address=self.config.transfer_address, master_port=port)
            engine.client = client  # this push's version
            t0 = time.monotonic()
            weight_transfer.send_within(engine, client, timeout_s=self.config.push_timeout_s)
            log.info("pushed weights to %s over %s in %.3fs", list(key[1]), transport, time.monotonic() - t0)
        except BaseException:
            if engine is not None:  # a failed push leaves the group unusable: the next one forms it anew
                weight_transfer.close_group(engine)
            raise
        self._push_groups[key] = (members, engine)

    def _close_overlapping_groups(self, key: tuple[str, tuple[str, ...]]) -> None:
        """A replica joining a new group leaves its old one (vLLM's engine holds one transfer group):
        close the cached groups it was in, so a later push to them forms them anew instead of
        broadcasting to a replica that no longer listens (e.g. a group of two formed again after one
        of them was pushed alone while the other was gone)."""
        for other in [k for k in self._push_groups if set(k[1]) & set(key[1])]:
            log.info("%s joins a new push group: closing its old group %s", list(key[1]), list(other[1]))
            weight_transfer.close_group(self._push_groups.pop(other)[1])

    def release_gpu(self) -> None:
        """Drop the gradients (the step that needed them is done), move params and optimizer state
        to CPU and return the CUDA cache. `bench/gpu_check.py` measures it on a GPU host."""
        if self.device.type != "cuda":
            log.info("release_gpu: trainer runs on %s, nothing to offload", self.device)
            return
        t0 = time.monotonic()
        self.optimizer.zero_grad(set_to_none=True)
        self._move_to(torch.device("cpu"))
        torch.cuda.synchronize(self.device)  # the non-blocking copies land before their sources are freed
        torch.cuda.empty_cache()
        self.on_gpu = False
        log.info("release_gpu: offloaded in %.2fs", time.monotonic() - t0)

    def acquire_gpu(self) -> None:
        if self.device.type != "cuda":
            log.info("acquire_gpu: trainer runs on %s, nothing to reload", self.device)
            return
        if self.on_gpu:  # already reloaded while the hybrids slept (dynamic_schedule_overlap_sleep)
            return
        t0 = time.monotonic()
        self._move_to(self.device)
        torch.cuda.synchronize(self.device)
        self.on_gpu = True
        log.info("acquire_gpu: reloaded in %.2fs", time.monotonic() - t0)

    def _move_to(self, device: torch.device) -> None:
        self.model.to(device)  # Module.to moves .grad too (none after release_gpu dropped them)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device, non_blocking=True)

    # -- checkpoints ----------------------------------------------------------------------

    def save_checkpoint(self, version: int, global_steps: int = 0) -> str:
        """Write model + optimizer + version atomically as `ckpt_g{global_steps}_v{version}.pt` and
        return its name: the pointer the trainer commits with its progress (every micro-step; the
        tiny model's save costs a few ms, docs/reliability.md). The newest `keep_checkpoints` stay,
        so the committed one survives the save of the next."""
        out = Path(self.config.checkpoint_dir)
        out.mkdir(parents=True, exist_ok=True)
        final = out / f"ckpt_g{global_steps:06d}_v{version:06d}.pt"
        tmp = out / f".{final.name}.tmp-{os.getpid()}"
        payload: dict[str, Any] = {
            "version": version,
            "num_updates": self.num_updates,
            "model": {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
        }
        torch.save(payload, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        self.version = version
        for old in self._checkpoints()[: -self.config.keep_checkpoints]:
            old.unlink(missing_ok=True)
        return final.name

    def _checkpoints(self) -> list[Path]:
        """Checkpoint files, oldest first (by micro-step, then version)."""
        out = Path(self.config.checkpoint_dir)
        if not out.is_dir():
            return []
        found = [(m, p) for p in out.iterdir() if (m := _CKPT_RE.match(p.name))]
        return [p for m, p in sorted(found, key=lambda mp: (int(mp[0].group(1)), int(mp[0].group(2))))]

    def checkpoint_versions(self) -> list[int]:
        return [int(m.group(2)) for p in self._checkpoints() if (m := _CKPT_RE.match(p.name))]

    def resume_latest(self) -> int | None:
        """Restore the newest checkpoint; returns its version, or None if there is none."""
        present = self._checkpoints()
        return self.resume_from(present[-1].name) if present else None

    def resume_from(self, pointer: str) -> int | None:
        """Restore the checkpoint named `pointer` (save_checkpoint's return); its version, or None
        if it is not there."""
        path = Path(self.config.checkpoint_dir) / pointer
        if not _CKPT_RE.match(path.name) or not path.is_file():
            log.error("checkpoint %s not found: the trainer keeps its initial weights", path)
            return None
        payload = torch.load(path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(payload["model"])
        self.model.to(self.device)
        self.optimizer.load_state_dict(payload["optimizer"])
        self.version = int(payload["version"])
        self.num_updates = int(payload["num_updates"])
        log.info("resumed trainer from %s (version %d)", path, self.version)
        return self.version
