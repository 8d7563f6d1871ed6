"""PNG charts of simulated runs (matplotlib, Agg backend: no display needed).

Where it sits: ``sim.cli simulate --out DIR`` calls ``write_plots``. Charts:

- ``resource_time.png``: the seed figure, GPUs by time, one row per 8-GPU lane
  (standalone rollout pool on top, trainer/hybrid GPUs below), coloured by
  rollout / train / weight sync / switching / idle; a window of the run.
- ``mq_size.png``: ``dynamic_resource/mq_size`` per sync cycle for every run
  given (the seed's three curves when given 16-16 static, 8-24 static, dynamic).
- ``utilization.png``: ``dynamic_resource/resource_utilization`` per cycle, plus
  the physical busy fraction of each run in the legend.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from shared.vocab import LaneState
from sim.result import SimResult

COLORS = {LaneState.ROLLOUT: "#4c72b0", LaneState.TRAIN: "#e6b422", LaneState.SYNC: "#55a868",
          LaneState.SWITCH: "#c44e52", LaneState.IDLE: "#dddddd"}


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend, imported at the first chart: what draws none (`dynsched
    simulate` without --out, the launcher) does not pay its import (about 0.3 s of a CLI's start)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def resource_time(result: SimResult, path: Path, *, window_s: float | None = None,
                  start_s: float | None = None) -> None:
    """Broken-bar chart of lane states over ``[start, start + window]`` (default: ~4 cycles mid-run)."""
    plt = pyplot()
    assert result.timeline is not None
    if window_s is None:
        per_cycle = result.wall_s / max(1, result.versions)
        window_s = min(result.wall_s, 4 * per_cycle)
    if start_s is None:
        start_s = max(0.0, result.wall_s / 2 - window_s / 2)
    end_s = start_s + window_s
    lanes = result.timeline.lanes
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(lanes) + 1.5))
    g = result.gpus_per_lane
    for row, lane in enumerate(reversed(lanes)):
        by_state: dict[LaneState, list[tuple[float, float]]] = {}
        for t0, t1, state in result.timeline.intervals(lane, result.wall_s):
            if t1 <= start_s or t0 >= end_s:
                continue
            a, b = max(t0, start_s), min(t1, end_s)
            by_state.setdefault(state, []).append((a - start_s, b - a))
        for state, bars in by_state.items():
            ax.broken_barh(bars, (row * g, g * 0.9), color=COLORS[state])
    ax.set_yticks([row * g + g * 0.45 for row in range(len(lanes))])
    labels = [f"{lane} (GPU {g * i}-{g * i + g - 1})" for i, lane in enumerate(lanes)]
    ax.set_yticklabels(list(reversed(labels)))
    ax.set_xlabel(f"seconds since t={start_s:.0f}s of the simulated run")
    ax.set_xlim(0, window_s)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    legend = ax.legend(handles, list(COLORS), loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"{result.scenario}: {result.label} - GPU resource-time, a {window_s:.0f} s window "
                 f"(t={start_s:.0f}-{end_s:.0f} s of {result.wall_s:.0f} s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_extra_artists=[legend], bbox_inches="tight")
    plt.close(fig)


def mq_size(results: list[SimResult], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    for res in results:
        xs = [c["version"] for c in res.cycles]
        ax.plot(xs, [c["dynamic_resource/mq_size"] for c in res.cycles], label=res.label, lw=1)
    ax.set_xlabel("weight version (sync cycle)")
    ax.set_ylabel("dynamic_resource/mq_size")
    ax.legend()
    ax.set_title("MessageQueue size after each cycle's last fit_step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def utilization(results: list[SimResult], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    for res in results:
        xs = [c["version"] for c in res.cycles]
        ys = [c["dynamic_resource/resource_utilization"] for c in res.cycles]
        ax.plot(xs, ys, lw=1, label=f"{res.label} (GPU busy {res.busy_fraction():.0%})")
    ax.set_xlabel("weight version (sync cycle)")
    ax.set_ylabel("dynamic_resource/resource_utilization")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("Cluster utilization (section 4.3 formula)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(results: list[SimResult], out_dir: Path) -> list[Path]:
    """Write every chart; one resource-time chart per run. Returns the written paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for res in results:
        path = out_dir / f"resource_time_{res.train_gpus}-{res.rollout_gpus}_{res.label.split()[-1]}.png"
        resource_time(res, path)
        paths.append(path)
    for name, fn in (("mq_size.png", mq_size), ("utilization.png", utilization)):
        fn(results, out_dir / name)
        paths.append(out_dir / name)
    return paths
