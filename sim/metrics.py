"""Per-cycle seed metrics (section 4) from the simulated trainer's micro-step records.

Where it sits: ``sim.run`` fills one record per micro-step (timings in seconds,
the rollouter's reset metrics on the sync micro-step) and closes a cycle at
each sync. The formulas are ``core.metrics`` (the services' code), so a
simulated metric means exactly what the live one means.
"""

from __future__ import annotations

from core import metrics as cm

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
        u_train = cm.train_resource_utilization([r["compute"] for r in records],
                                                [r["alloc"] for r in records])
        u_rollout = last.get("dynamic_resource/rollout_resource_utilization", 0.0)
        wait_s = total["wait_for_enough_samples"] if self.dynamic else 0.0
        out = {
            "version": float(version),
            "time_s": now_s,
            "dynamic_resource/mq_size": last["mq_size"],
            "dynamic_resource/train_compute_time_s": total["compute"],
            "dynamic_resource/train_allocated_time_s": total["alloc"],
            "dynamic_resource/train_resource_utilization": u_train,
            "dynamic_resource/rollout_resource_utilization": u_rollout,
            "dynamic_resource/resource_utilization": cm.cluster_resource_utilization(
                u_train, u_rollout, wait_s, total["step"], num_trainer_gpus=self.train_gpus,
                num_standalone_gpus=self.rollout_gpus),
            "timing_s/wait_for_enough_samples": total["wait_for_enough_samples"],
            "timing_s/step": total["step"],
            "timing_s/gen": total["gen"],
            "timing_s/param_sync": total["param_sync"],
            "timing_s/deactivate": total["deactivate"],
            "fully_async/trainer/idle_ratio": cm.trainer_idle_ratio([r["gen"] for r in records],
                                                                   [r["step"] for r in records]),
            "fully_async/rollouter/idle_ratio": last.get("fully_async/rollouter/idle_ratio", 0.0),
            "fully_async/rollouter/step_generated_samples": last.get(
                "fully_async/rollouter/step_generated_samples", 0.0),
            "sim/mq_peak": last.get("sim/mq_peak", 0.0),
            "dynamic_schedule/activated": last.get("activated", 0.0),
            cm.DECODE_LOAD_COST: last.get(cm.DECODE_LOAD_COST, 0.0),
            "dynamic_schedule/deactivate_ratio": deactivate_ratio,
        }
        return out
