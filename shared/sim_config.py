"""Simulator-only config sections for the physics model and published rows (`simulator.physics`,
`simulator.published`).

Where it sits: `shared.config.SimulatorConfig` holds these; `sim.physics` turns them into the
replica's decode coefficients and the trainer's cost per token, `sim.calibrate` fits the fields
marked "fitted" on the rows marked `fit: true`, and `dynsched validate` prints every row against
the model. Nothing else reads them: `dynsched run` ignores the whole `simulator` section.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)


Fraction = Annotated[float, Field(gt=0, le=1)]
Efficiency = Annotated[float, Field(gt=0, le=2)]
"""Physically <= 1 (sim.physics refuses more); the field allows 2 so a fit can show how far over it is."""


class ModelShapeConfig(_Section):
    """The policy model as the hardware sees it (from its config.json)."""

    total_params_b: Annotated[float, Field(gt=0)]
    """All parameters, billions (what decode reads per step at large batch, what sync moves)."""
    active_params_b: Annotated[float, Field(gt=0)]
    """Parameters used per token, billions (dense: = total; MoE: shared + routed experts per token)."""
    kv_layers: Annotated[int, Field(ge=0)]
    """Layers that keep a KV cache (hybrid linear-attention models: only the full-attention ones)."""
    kv_heads: Annotated[int, Field(ge=1)]
    head_dim: Annotated[int, Field(ge=1)]
    bytes_per_param: Annotated[float, Field(gt=0)] = 2.0
    kv_bytes_per_element: Annotated[float, Field(gt=0)] = 2.0


class ValidationConfig(_Section):
    """The trainer's validation every ``every_versions`` versions (verl: ``trainer.test_freq``), which
    blocks the trainer outside ``timing_s/step`` until the longest validation response is decoded."""

    every_versions: Annotated[int, Field(ge=1)]
    before_train: bool = True
    """verl's ``trainer.val_before_train``: one validation before the first version."""
    response_tokens: Annotated[int, Field(ge=1)]
    """Prior: length of the longest validation response (a max-length one: decoding waits for it)."""
    prompt_tokens: Annotated[int, Field(ge=0)] = 0


class TrainReferenceConfig(_Section):
    """A published training throughput of the trainer's class (framework, model family), on whatever
    accelerator it was measured; `sim.physics` carries it to this accelerator for the report."""

    accelerator: str
    """Where it was measured: a name in sim.physics.ACCELERATORS."""
    tokens_per_s_per_gpu: Annotated[float, Field(gt=0)]
    """The published training throughput, tokens per second per GPU."""
    active_params_b: Annotated[float, Field(gt=0)]
    """Active parameters of the measured model, billions (its FLOPs per token, as for this model)."""
    flops_per_param_token: Annotated[float, Field(gt=0)] = 6.0
    """FLOPs per active parameter per token the measured run did (6: forward + backward, no recompute)."""
    source: str
    """Citation: framework, model, GPUs, layout, where it is published."""


class PhysicsConfig(_Section):
    """Decode and training costs from the accelerator's peaks; efficiencies are fitted (sim.calibrate)."""

    accelerator: str
    """A name in sim.physics.ACCELERATORS (H20, H100, H200, A100)."""
    model: ModelShapeConfig
    decode_efficiency: Efficiency = 0.5
    """Fitted: fraction of peak HBM bandwidth and BF16 FLOPs a decode step achieves."""
    decode_overhead_s: Annotated[float, Field(gt=0)] = 0.003
    """Prior: per decode step, independent of batch (kernel launch, TP all-reduce latency, scheduler)."""
    decode_tokens_per_step: Annotated[float, Field(ge=1, le=8)] = 1.0
    """Prior: mean tokens accepted per decode step (speculative decoding such as MTP; 1 without)."""
    prefill_mfu: Fraction = 0.5
    """Prior: MFU of prefill (compute-bound), which replaces rollout.sim.prefill_s_per_token."""
    gpu_memory_utilization: Fraction = 0.8
    """Share of HBM the engine takes; KV capacity = that - weights (per GPU, x TP per replica)."""
    train_mfu: Efficiency = 0.3
    """Fitted: model FLOPs utilization of the scaling part of a micro-step."""
    train_flops_per_param_token: Annotated[float, Field(gt=0)] = 8.0
    """6 (forward + backward) + 2 with activation recomputation."""
    train_non_scaling_s: Annotated[float, Field(ge=0)] = 0.0
    """Fitted: seconds per mini-batch (one optimizer step) that do not shrink with more trainer GPUs
    (gradient reduction and parameter gathers not hidden, the optimizer step, offload, stragglers); a
    micro-step of ``require_batches`` mini-batches pays it that many times."""
    fit_parameters: list[str] = Field(default_factory=lambda: ["train_mfu", "train_non_scaling_s"])
    """What `sim.calibrate` fits on the `fit: true` rows (names in sim.calibrate.FREE_PARAMETERS)."""
    reference_decode_step_s: Annotated[float, Field(gt=0)] | None = None
    """A published batch-1 decode step of this engine class, to compare the implied one with."""
    reference_decode_bw_fraction: Fraction | None = None
    """That measurement's share of its GPU's HBM roofline."""
    reference_decode: str = ""
    """Citation of that measurement (engine, model, GPU, source)."""
    reference_train: TrainReferenceConfig | None = None
    """A published training throughput of this trainer class, to compare the fitted train_mfu with."""
    validation: ValidationConfig | None = None
    """Periodic validation blocking the trainer (its duration from the decode timing); None: none."""


class PublishedRow(_Section):
    """One published (or measured) run: per-step seconds and wall hours after some steps."""

    label: str
    train_gpus: Annotated[int, Field(ge=1)]
    rollout_gpus: Annotated[int, Field(ge=0)]
    fit: bool = False
    """Calibrate on this row; every other row is a prediction (`dynsched validate`)."""
    step_s: Annotated[float, Field(gt=0)] | None = None
    gen_s: Annotated[float, Field(ge=0)] | None = None
    """timing_s/gen: the trainer's wait for samples per step."""
    update_s: Annotated[float, Field(gt=0)] | None = None
    """timing_s/update_actor per step."""
    tokens_per_step: Annotated[float, Field(gt=0)] | None = None
    mq_size: Annotated[float, Field(ge=0)] | None = None
    hours: dict[int, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    """Wall hours after N steps, e.g. {100: 7.967}."""
    step_unit: Literal["micro_step", "version"] = "micro_step"
    """What one step of this row is: a trainer micro-step, or a weight version (``trigger`` micro-steps:
    verl logs its aggregated metrics once per version, ``step=current_param_version``, summing the
    ``timing_s/*`` of the version's micro-steps)."""
    policy: str = "static"
    """'static' (plain fully-async) or a registered policy with hybrids."""
    overrides: dict[str, float] = Field(default_factory=dict)
    """Dotted config keys this run changed, e.g. {async_training.staleness_threshold: 0.1}."""
    source: str = ""
