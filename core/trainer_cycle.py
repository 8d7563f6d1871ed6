"""The trainer's cycle, pure (sans-I/O): collect, micro-step, release, sync, report.

Where it sits: the trainer service (`services/trainer`) drives it over Redis with a
real or modelled backend; the simulator (`sim/run.py`) drives it on its virtual clock,
answering the handshakes with the very `core.executor.ExecutorCore` the controller
service runs. `TrainerCycle.run` is a generator of `TrainerOp`s: the driver performs
each one and sends its result back, so both drivers step through the same order:

    [initial sync: ExportWeights(v0), Handshake(WEIGHTS_READY) -> SYNC_DONE]
    per micro-step (reference 1.3):
      Handshake(MICRO_STEP_START) -> GPUS_READY   (the controller may deactivate hybrids)
      AcquireGpu, QueueSize, Collect(required), Send(COLLECTED), Train
      SaveCheckpoint(version, global_steps+1) -> the checkpoint's pointer
      MarkTrained(batch, progress: global_steps+1, version, sync_pending, checkpoint), QueueSize
      every trigger_parameter_sync_step micro-steps:
        ExportWeights(v+1), Handshake(WEIGHTS_READY) -> SYNC_DONE
        (during that handshake the controller may ask the trainer to release its GPUs and
        to sync replicas: commands the driver serves, not part of this cycle)
        SaveProgress(sync_pending cleared)
      Send(MICRO_STEP_DONE with the micro-step's metrics)
    Send(DONE)

Exactly once across a crash: `MarkTrained` commits the batch's samples *and* the progress it
makes (the next global_steps, the new version, whether its sync is still pending) in one step, so
a restarted trainer never trains a committed micro-step again. A restart with `sync_pending` set
(killed between the commit and the end of its sync) first finishes that sync (ExportWeights,
Handshake(WEIGHTS_READY) for the same global_steps: the controller answers a replayed handshake),
then goes on with the next micro-step. The checkpoint written just before the commit is named in
that commit (`checkpoint`, the pointer), and a restart restores the one the pointer names: a crash
after the commit loses no update, and a crash between the save and the commit retrains the step
on the weights it started from (the newer, uncommitted checkpoint is ignored).

Durations come from the injected `clock`. The first sync (version 0, global_steps 0)
happens before training, as in the original: it is the first chance to activate hybrids.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.flow import FlowLimits
from core.metrics import train_compute_time_s
from shared.schema import TrainerAction, TrainerEvent, TrainerPhase, TrainerReply

TrainerPlan = Generator["TrainerOp", Any, None]

REPLY_TO: dict[TrainerPhase, TrainerAction] = {
    TrainerPhase.MICRO_STEP_START: TrainerAction.GPUS_READY,
    TrainerPhase.WEIGHTS_READY: TrainerAction.SYNC_DONE,
}
"""The handshake phases and the controller's answer to each (every other phase gets none)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Handshake:
    """Send `event` to the controller and wait for its reply. -> TrainerReply"""

    event: TrainerEvent


@dataclass(frozen=True, kw_only=True, slots=True)
class Send:
    """Send `event` to the controller; no reply. -> None"""

    event: TrainerEvent


@dataclass(frozen=True, kw_only=True, slots=True)
class AcquireGpu:
    """Take the GPUs back if they were released (hybrids are asleep now). -> None"""


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueSize:
    """Samples in the MessageQueue not yet taken by the trainer. -> int"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Collect:
    """Take `count` samples from the MessageQueue, waiting as long as it takes. -> a batch"""

    count: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Train:
    """One micro-step on `batch`. -> TrainResult"""

    batch: Sequence[Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkTrained:
    """Ack the batch, move its samples to 'trained' (exactly once) and persist `progress`, all in
    one commit. -> None"""

    batch: Sequence[Any]
    progress: SaveProgress


@dataclass(frozen=True, kw_only=True, slots=True)
class SaveCheckpoint:
    """Persist the model (and optimizer) as trained up to micro-step `global_steps` - 1, at
    `version`. -> its pointer, committed with the progress ('' or None: nothing to restore)"""

    version: int
    global_steps: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportWeights:
    """Publish weights `version` where replicas can load them. -> path ('' if none)"""

    version: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SaveProgress:
    """Persist the trainer's progress, read back after a restart. -> None"""

    global_steps: int
    version: int
    initial_sync_done: bool
    sync_pending: bool = False
    """The version's weight sync has not finished: a restart finishes it first."""
    checkpoint: str = ""
    """The pointer of the checkpoint holding the weights of this progress (a restart restores it)."""


TrainerOp = Handshake | Send | AcquireGpu | QueueSize | Collect | Train | MarkTrained | SaveCheckpoint \
    | ExportWeights | SaveProgress


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    """What a backend's micro-step returned."""

    timings: dict[str, float] = field(default_factory=dict)
    """The original's timing_raw under `timing_s/<phase>` (compute = the TRAIN_COMPUTE_KEYS phases)."""
    stats: dict[str, float] = field(default_factory=dict)
    """Batch statistics (rewards, lengths, versions) by metric name."""


class TrainerCycle:
    """The trainer's progress (global_steps, version) and the order of its steps."""

    def __init__(self, *, limits: FlowLimits, clock: Callable[[], float], global_steps: int = 1,
                 version: int = 0, initial_sync_done: bool = False, sync_pending: bool = False,
                 checkpoint: str = "") -> None:
        self.limits = limits
        self.clock = clock
        self.global_steps = global_steps
        self.version = version
        self.initial_sync_done = initial_sync_done
        self.sync_pending = sync_pending
        self.checkpoint = checkpoint
        self.total_micro_steps = limits.total_train_steps * limits.trigger_parameter_sync_step

    @property
    def done(self) -> bool:
        return self.global_steps > self.total_micro_steps

    def run(self) -> TrainerPlan:
        """From where the progress says to the end of the run."""
        if not self.initial_sync_done:
            yield from self._sync(global_steps=0)
            self.initial_sync_done = True
            yield self._progress()
        if self.sync_pending:  # killed during the sync of the last committed micro-step
            yield from self._sync(global_steps=self.global_steps - 1)
            self.sync_pending = False
            yield self._progress()
        while not self.done:
            yield from self.micro_step()
        yield Send(event=TrainerEvent(phase=TrainerPhase.DONE, global_steps=self.global_steps - 1,
                                      version=self.version))

    def micro_step(self) -> TrainerPlan:
        """One fit step (reference 1.3): handshake, collect, train, ack, maybe sync, report."""
        gs = self.global_steps
        required = self.limits.required_samples
        step_started = self.clock()
        ready: TrainerReply = yield Handshake(event=self._event(TrainerPhase.MICRO_STEP_START))
        yield AcquireGpu()
        alloc_started = self.clock()
        queue_before: int = yield QueueSize()
        batch = yield Collect(count=required)
        gen_s = self.clock() - alloc_started
        wait_samples = max(0, required - queue_before)
        yield Send(event=TrainerEvent(phase=TrainerPhase.COLLECTED, global_steps=gs, version=self.version,
                                      wait_time_s=gen_s, wait_samples=wait_samples))
        result: TrainResult = yield Train(batch=batch)
        syncs = gs % self.limits.trigger_parameter_sync_step == 0
        if syncs:
            self.version += 1
        self.global_steps += 1
        pointer: str | None = yield SaveCheckpoint(version=self.version, global_steps=self.global_steps)
        self.checkpoint = pointer or ""
        self.sync_pending = syncs
        yield MarkTrained(batch=batch, progress=self._progress())
        mq_size: int = yield QueueSize()
        sync_s = 0.0
        if syncs:
            sync_started = self.clock()
            yield from self._sync(global_steps=gs)
            sync_s = self.clock() - sync_started
            self.sync_pending = False
            yield self._progress()
        now = self.clock()
        metrics = {**result.stats, **result.timings,
                   "timing_s/gen": gen_s, "timing_s/step": now - step_started, "timing_s/param_sync": sync_s,
                   "timing_s/wait_for_enough_samples": ready.wait_for_enough_samples_s,
                   "timing_s/deactivate": ready.deactivate_s,
                   "fully_async/total_wait_time": gen_s,
                   "fully_async/wait_samples": float(wait_samples),
                   "dynamic_resource/train_compute_time_s": train_compute_time_s(
                       {k.removeprefix("timing_s/"): v for k, v in result.timings.items()}),
                   "dynamic_resource/train_allocated_time_s": now - alloc_started,
                   "dynamic_resource/mq_size": float(mq_size),
                   "training/global_step": float(gs),
                   "fully_async/count/current_param_version": float(self.version)}
        yield Send(event=TrainerEvent(phase=TrainerPhase.MICRO_STEP_DONE, global_steps=gs,
                                      version=self.version, stats=metrics))

    def _sync(self, *, global_steps: int) -> Generator[TrainerOp, Any, TrainerReply]:
        path: str = yield ExportWeights(version=self.version)
        reply: TrainerReply = yield Handshake(event=TrainerEvent(
            phase=TrainerPhase.WEIGHTS_READY, global_steps=global_steps, version=self.version,
            weights_path=path))
        return reply

    def _event(self, phase: TrainerPhase) -> TrainerEvent:
        return TrainerEvent(phase=phase, global_steps=self.global_steps, version=self.version)

    def _progress(self) -> SaveProgress:
        return SaveProgress(global_steps=self.global_steps, version=self.version,
                            initial_sync_done=self.initial_sync_done, sync_pending=self.sync_pending,
                            checkpoint=self.checkpoint)
