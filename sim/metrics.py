"""Per-cycle seed metrics (section 4) from the simulated trainer's micro-step records.

Where it sits: ``sim.run`` fills one record per micro-step (timings in seconds,
the rollouter's reset metrics on the sync micro-step) and closes a cycle at
each sync. The formulas are section 4's; see ``_formulas`` for which module
computes them.
"""

from __future__ import annotations

from sim import _formulas as f

RECORD_KEYS = ("wait_for_enough_samples", "deactivate", "gen", "compute", "param_sync", "alloc", "step")


class CycleMetrics:
    """Accumulates micro-step records and reduces them per sync cycle."""

    def __init__(self, *, train_gpus: int, rollout_gpus: int, dynamic: bool) -> None:
        self.train_gpus = train_gpus
        self.rollout_gpus = rollout_gpus
        self.dynamic = dynamic
        self._records: list[dict[str, float]] = []

    @staticmethod
    def new_record() -> dict[str, float]:
        return dict.fromkeys(RECORD_KEYS, 0.0)

    def add_micro_step(self, record: dict[str, float]) -> None:
        self._records.append(record)

    def close_cycle(self, *, version: int, now_s: float, deactivate_ratio: float) -> dict[str, float]:
        records, self._records = self._records, []
        total = {key: sum(r.get(key, 0.0) for r in records) for key in RECORD_KEYS}
        last = records[-1]
        u_train = f.train_utilization(total["compute"], total["alloc"])
        u_rollout = last.get("dynamic_resource/rollout_resource_utilization", 0.0)
        x = f.hybrid_rollout_fraction(total["wait_for_enough_samples"], total["step"]) if self.dynamic else 0.0
        out = {
            "version": float(version),
            "time_s": now_s,
            "dynamic_resource/mq_size": last["mq_size"],
            "dynamic_resource/train_compute_time_s": total["compute"],
            "dynamic_resource/train_allocated_time_s": total["alloc"],
            "dynamic_resource/train_resource_utilization": u_train,
            "dynamic_resource/rollout_resource_utilization": u_rollout,
            "dynamic_resource/resource_utilization": f.cluster_utilization(
                x=x, trainer_gpus=self.train_gpus, standalone_gpus=self.rollout_gpus,
                train_util=u_train, rollout_util=u_rollout),
            "timing_s/wait_for_enough_samples": total["wait_for_enough_samples"],
            "timing_s/step": total["step"],
            "timing_s/gen": total["gen"],
            "timing_s/param_sync": total["param_sync"],
            "timing_s/deactivate": total["deactivate"],
            "fully_async/trainer/idle_ratio": total["gen"] / total["step"] if total["step"] > 0 else 0.0,
            "fully_async/rollouter/idle_ratio": last.get("fully_async/rollouter/idle_ratio", 0.0),
            "fully_async/rollouter/step_generated_samples": last.get(
                "fully_async/rollouter/step_generated_samples", 0.0),
            "dynamic_schedule/activated": last.get("activated", 0.0),
            "dynamic_schedule/deactivate_ratio": deactivate_ratio,
        }
        return out
