"""Decode and training costs from the accelerator's peaks, and the physics report every fit prints.

Where it sits: ``sim.scenario`` calls ``decode_timing`` and ``trainer_s_per_ktoken`` when a config
has ``simulator.physics``; ``sim.calibrate`` fits ``decode_efficiency``, ``train_mfu`` and
``train_non_scaling_s`` and refuses a fit that ``problems`` finds outside physical bounds;
``physics_report`` is what it (and ``dynsched validate``) prints.

Decode step of one replica (TP GPUs) with ``b`` running requests holding ``C`` context tokens::

    step(b, C) = overhead + max(weights / (BW e), b * 2 active / (FLOPS e)) + C * kv_bytes / (BW e)

per GPU (weights, FLOPs and KV heads split over TP): a roofline for the matmuls (weights read once
per step, or compute-bound at large batch), the KV cache read every step (memory-bound attention:
grows with context), and a batch-independent overhead. ``e`` (decode_efficiency) is fitted; the
overhead is a prior. KV capacity per replica = (gpu_memory_utilization * HBM - weights) / kv_bytes.

With speculative decoding (``decode_tokens_per_step`` a > 1) every per-step cost is shared by ``a``
tokens; the compute per token is not (verifying drafts costs FLOPs). Times are per generated token.

Training: a micro-step costs ``mini_batches * non_scaling_s + tokens * flops_per_token / (gpus * peak * mfu)``
(``non_scaling_s`` per optimizer step: what FSDP does once per mini-batch does not shrink with GPUs).
A published training throughput of the trainer's class (``reference_train``) is carried to this
accelerator by ``transferred_mfu`` and printed next to the fitted ``train_mfu``: a check, not a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.sim_config import PhysicsConfig


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    name: str
    bf16_tflops: float
    """Dense BF16 tensor-core peak (no sparsity)."""
    hbm_tb_s: float
    hbm_gb: float
    source: str


ACCELERATORS = {a.name: a for a in (
    Accelerator(name="H20", bf16_tflops=148.0, hbm_tb_s=4.0, hbm_gb=96.0,
                source="NVIDIA H20 spec as quoted in issue 10: 148 TFLOPS BF16 dense, 4.0 TB/s, 96 GB HBM3"),
    Accelerator(name="H100", bf16_tflops=989.0, hbm_tb_s=3.35, hbm_gb=80.0,
                source="NVIDIA H100 SXM datasheet: 1979 TFLOPS BF16 with sparsity (989 dense), 3.35 TB/s"),
    Accelerator(name="H200", bf16_tflops=989.0, hbm_tb_s=4.8, hbm_gb=141.0,
                source="NVIDIA H200 SXM datasheet: 1979 TFLOPS BF16 with sparsity (989 dense), 4.8 TB/s"),
    Accelerator(name="A100", bf16_tflops=312.0, hbm_tb_s=2.039, hbm_gb=80.0,
                source="NVIDIA A100 80GB SXM datasheet: 312 TFLOPS BF16 dense, 2,039 GB/s"),
)}

MAX_DECODE_EFFICIENCY = 1.0
"""A decode step cannot beat the roofline."""
MAX_TRAIN_MFU = 0.6
"""Above the best published large-scale training MFU (MegaScale, 55.2% on 12,288 GPUs)."""


class PhysicsError(ValueError):
    """A fit or a config that implies a faster machine than the accelerator is."""


GEMM_EFFICIENCY_RANGE = (0.5, 0.9)
"""Share of peak the compute-bound part (the GEMMs) of a published training step is taken to reach, low
and high, when that step is carried to another accelerator (`transferred_mfu`)."""


def accelerator(phys: PhysicsConfig) -> Accelerator:
    return accelerator_named(phys.accelerator, field="simulator.physics.accelerator")


def accelerator_named(name: str, *, field: str) -> Accelerator:
    try:
        return ACCELERATORS[name]
    except KeyError:
        expected = ", ".join(ACCELERATORS)
        raise PhysicsError(f"{field}={name!r} is invalid: expected one of {expected}") from None


def transferred_mfu(mfu: float, *, measured_on: Accelerator, target: Accelerator,
                    gemm_efficiency: float) -> float:
    """The MFU that a training step measured at `mfu` on `measured_on` has on `target`, by a two-part
    roofline: the share `mfu / gemm_efficiency` of the step's time is compute-bound (its GEMMs) and
    scales with the FLOPS peaks; the rest is memory- or communication-bound and scales with the HBM
    bandwidths. An accelerator with less compute per byte (H20 against H100) gets a higher MFU."""
    compute = min(1.0, mfu / gemm_efficiency)
    memory = 1.0 - compute
    flops_ratio = target.bf16_tflops / measured_on.bf16_tflops
    return mfu / (compute + memory * flops_ratio * measured_on.hbm_tb_s / target.hbm_tb_s)


@dataclass(frozen=True, kw_only=True)
class DecodeTiming:
    """Coefficients of ``step(b, C)`` for one replica, in seconds."""

    overhead_s: float
    prefill_tokens_per_s: float
    weights_s: float
    per_request_s: float
    per_context_token_s: float
    kv_capacity_tokens: float

    def step_s(self, running: int, context_tokens: float) -> float:
        return (self.overhead_s + max(self.weights_s, running * self.per_request_s)
                + context_tokens * self.per_context_token_s)


def _kv_bytes_per_token_per_gpu(phys: PhysicsConfig, tp: int) -> float:
    m = phys.model
    heads_per_gpu = max(1.0, m.kv_heads / tp)  # fewer KV heads than ranks: each rank keeps a copy
    return 2.0 * m.kv_layers * heads_per_gpu * m.head_dim * m.kv_bytes_per_element


def decode_timing(phys: PhysicsConfig, tp: int, *, efficiency: float | None = None) -> DecodeTiming:
    acc = accelerator(phys)
    e = phys.decode_efficiency if efficiency is None else efficiency
    bw = acc.hbm_tb_s * 1e12 * e
    flops = acc.bf16_tflops * 1e12 * e
    m = phys.model
    weight_bytes = m.total_params_b * 1e9 * m.bytes_per_param / tp
    kv_bytes = _kv_bytes_per_token_per_gpu(phys, tp)
    free_bytes = phys.gpu_memory_utilization * acc.hbm_gb * 1e9 - weight_bytes
    if free_bytes <= 0:
        raise PhysicsError(f"simulator.physics.gpu_memory_utilization={phys.gpu_memory_utilization} is "
                           f"invalid: the weights ({weight_bytes / 1e9:.1f} GB per GPU at TP{tp}) do not "
                           f"fit in it")
    capacity = free_bytes / kv_bytes if kv_bytes > 0 else float("inf")
    prefill_rate = tp * acc.bf16_tflops * 1e12 * phys.prefill_mfu / (2.0 * m.active_params_b * 1e9)
    a = phys.decode_tokens_per_step  # speculative decoding: one step's reads serve `a` tokens
    return DecodeTiming(overhead_s=phys.decode_overhead_s / a, weights_s=weight_bytes / bw / a,
                        prefill_tokens_per_s=prefill_rate,
                        per_request_s=2.0 * m.active_params_b * 1e9 / tp / flops,
                        per_context_token_s=kv_bytes / bw / a, kv_capacity_tokens=capacity)


def validation_s(phys: PhysicsConfig, tp: int) -> float:
    """One validation as the trainer waits for it: its longest response (``response_tokens``) decoded
    on an otherwise idle replica (the queue is full while the trainer is blocked, so generation is
    paused), from a ``prompt_tokens`` prefill: ``R (overhead + weights) + kv (P R + R^2 / 2)``."""
    val = phys.validation
    if val is None:
        return 0.0
    d = decode_timing(phys, tp)
    r, p = float(val.response_tokens), float(val.prompt_tokens)
    return (p / d.prefill_tokens_per_s + r * (d.overhead_s + max(d.weights_s, d.per_request_s))
            + d.per_context_token_s * (p * r + 0.5 * r * r))


def train_flops_per_token(phys: PhysicsConfig) -> float:
    return phys.train_flops_per_param_token * phys.model.active_params_b * 1e9


def trainer_s_per_ktoken(phys: PhysicsConfig, unit_gpus: int, *, mfu: float | None = None) -> float:
    """Seconds per 1000 trained tokens on one trainer unit at the configured (or given) MFU."""
    acc = accelerator(phys)
    rate = unit_gpus * acc.bf16_tflops * 1e12 * (phys.train_mfu if mfu is None else mfu)
    return 1000.0 * train_flops_per_token(phys) / rate


def problems(phys: PhysicsConfig) -> list[str]:
    """Why these parameters are physically impossible or implausible (empty: fine)."""
    out = []
    if phys.decode_efficiency > MAX_DECODE_EFFICIENCY:
        out.append(f"decode_efficiency={phys.decode_efficiency:.3g} implies a decode step faster than the "
                   f"{phys.accelerator} roofline")
    if phys.train_mfu > MAX_TRAIN_MFU:
        out.append(f"train_mfu={phys.train_mfu:.3g} is above {MAX_TRAIN_MFU:.0%}, more than any published "
                   f"large-scale training run reaches")
    return out


def check(phys: PhysicsConfig) -> None:
    found = problems(phys)
    if found:
        raise PhysicsError("fit refused: " + "; ".join(found))


@dataclass(frozen=True, kw_only=True)
class TrainerRow:
    """What one run's trainer did, for the MFU lines of the report."""

    label: str
    train_gpus: int
    tokens_per_step: float
    update_s: float


def physics_report(phys: PhysicsConfig, *, tp: int, max_running: int, mean_context_tokens: float,
                   rows: tuple[TrainerRow, ...] = ()) -> list[str]:
    """Lines: implied decode step and tokens/s per GPU vs the roofline and the cited measurement,
    KV capacity, training MFU (scaling part and whole micro-step, per row)."""
    acc = accelerator(phys)
    dt = decode_timing(phys, tp)
    roof = decode_timing(phys, tp, efficiency=1.0)
    step1 = dt.step_s(1, mean_context_tokens)
    frac1 = roof.weights_s / (step1 - dt.per_context_token_s * mean_context_tokens)
    full = dt.step_s(max_running, max_running * mean_context_tokens)
    full_roof = roof.step_s(max_running, max_running * mean_context_tokens) - roof.overhead_s
    lines = [
        f"accelerator {acc.name}: {acc.bf16_tflops:g} TFLOPS BF16 dense, {acc.hbm_tb_s:g} TB/s, "
        f"{acc.hbm_gb:g} GB ({acc.source})",
        f"decode: efficiency {phys.decode_efficiency:.3f} of peak, overhead "
        f"{phys.decode_overhead_s * 1e3:.2f} ms/step, "
        f"{phys.decode_tokens_per_step:g} tokens/step; "
        f"prefill {dt.prefill_tokens_per_s:.0f} tokens/s per replica (MFU {phys.prefill_mfu:g})",
        f"  batch 1, {mean_context_tokens:.0f}-token context: step {step1 * 1e3:.2f} ms "
        f"({1.0 / step1:.0f} tokens/s); weight read at {frac1:.0%} of the HBM roofline",
        f"  batch {max_running} (engine cap): step {full * 1e3:.2f} ms, "
        f"{max_running / full / tp:.0f} tokens/s "
        f"per GPU = {full_roof / full:.0%} of the roofline's {max_running / full_roof / tp:.0f}",
        f"  KV cache per replica (TP{tp}, gmu {phys.gpu_memory_utilization}): "
        f"{dt.kv_capacity_tokens / 1e6:.2f} M tokens = "
        f"{dt.kv_capacity_tokens / max(1.0, max_running * mean_context_tokens):.1f}x a full batch",
    ]
    if phys.reference_decode_step_s is not None:
        ref_frac = (f" at {phys.reference_decode_bw_fraction:.0%} of its roofline"
                    if phys.reference_decode_bw_fraction else "")
        lines.append(f"  published (engine class): batch-1 step {phys.reference_decode_step_s * 1e3:.1f} ms"
                     f"{ref_frac}: {phys.reference_decode}")
    lines.append(f"training: scaling-part MFU {phys.train_mfu:.3f} "
                 f"({phys.train_flops_per_param_token:g} FLOPs per active parameter per token), "
                 f"non-scaling {phys.train_non_scaling_s:.2f} s per mini-batch (optimizer step)")
    lines.extend(_train_reference_lines(phys, acc))
    for row in rows:
        flops = train_flops_per_token(phys) * row.tokens_per_step
        mfu = flops / (row.train_gpus * acc.bf16_tflops * 1e12 * row.update_s)
        lines.append(f"  {row.label}: {row.tokens_per_step / 1e6:.2f} M tokens/step in "
                     f"{row.update_s:.1f} s on "
                     f"{row.train_gpus} GPUs = {mfu:.1%} MFU over the whole update")
    lines.extend(f"REFUSED: {p}" for p in problems(phys))
    return lines


def _train_reference_lines(phys: PhysicsConfig, acc: Accelerator) -> list[str]:
    """The cited training measurement, carried to this accelerator, against the fitted scaling part."""
    ref = phys.reference_train
    if ref is None:
        return []
    measured_on = accelerator_named(ref.accelerator, field="simulator.physics.reference_train.accelerator")
    ref_flops_per_token = ref.flops_per_param_token * ref.active_params_b * 1e9
    ref_mfu = ref.tokens_per_s_per_gpu * ref_flops_per_token / (measured_on.bf16_tflops * 1e12)
    low, high = (transferred_mfu(ref_mfu, measured_on=measured_on, target=acc, gemm_efficiency=e)
                 for e in GEMM_EFFICIENCY_RANGE)
    fitted = phys.train_mfu * ref.flops_per_param_token / phys.train_flops_per_param_token
    if fitted < low:
        verdict = "below it: a slower trainer than that measurement carried over"
    elif fitted > high:
        verdict = "above it: a faster trainer than that measurement carried over"
    else:
        verdict = "within it"
    e_low, e_high = GEMM_EFFICIENCY_RANGE
    basis = (f"{ref.flops_per_param_token:g} FLOPs per active parameter per token, "
             f"{ref.active_params_b:g} B active")
    published = (f"  published (trainer class): {ref.tokens_per_s_per_gpu:,.0f} tokens/s per GPU on "
                 f"{measured_on.name} = {ref_mfu:.1%} MFU ({basis}): {ref.source}")
    carried = (f"  carried to {acc.name} (its GEMMs at {e_low:.0%}-{e_high:.0%} of peak, the rest "
               f"memory-bound): MFU {low:.1%}-{high:.1%}; this fit's scaling part in that basis: "
               f"{fitted:.1%} ({verdict})")
    return [published, carried]
