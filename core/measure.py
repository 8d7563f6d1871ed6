"""What the controller measures for its policy: production per replica-second, trainer time per micro-step.

Where it sits: `core.executor.ExecutorCore` owns one `RateMeter` and feeds it what a real
controller sees, on its injected clock (time.monotonic live, the virtual clock in the
simulator): the rollouter's progress readings (`total_generated` at each sync and at each
deactivation, the `ReadProgress` op), when the standalones and the hybrids start and stop
serving (the sync and switch commands it executes), and when the trainer's handshakes
arrive. The executor hands the results to `ControllerCore.record_measurements`, which puts
them in the policy's context. Nothing here reads the future: every number comes from
readings already taken when a decision is made.

The engines' step against their load: every finished attempt's decode seconds, decoded tokens, and the
requests and context tokens its engine held meanwhile (`InflightClock` in the vLLM engine, inline in the
simulated replica) reach the rollouter, which sums them per version (`DecodeFit`) into its reset report;
the meter keeps those sums decayed per version.

When a hybrid window's work arrives: the rollouter marks every sample whose attempt was aborted on a hybrid
(a deactivation hands it to the standalones, partial rollout) and counts, per version, how many were handed
over and how many of those were queued since (its status, read at the sync before the decision; the same
counts in its reset report, `HANDED_OVER` and `HANDED_OVER_ON_TIME`); the meter keeps both decayed per
window that handed any over. Short responses finish within the cycle that lent the GPUs; long ones (a long
chain of thought) mostly in the next.

Windows: the time between two progress readings is one window. A window in which no hybrid
served measures the standalones; a window in which hybrids served measures the hybrids' extra
production over what the standalones' measured rate explains. Both are decayed totals
(samples / replica-seconds, old windows weigh `decay` per newer window), so a drifting
workload (responses growing over the run) moves the rates.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW_DECAY = 0.8
"""Weight of the totals so far when a new window is added (about the last 5 windows count)."""
TRAIN_EWMA_ALPHA = 0.3
"""Weight of the newest trainer micro-step time in its moving average."""


@dataclass
class _Decayed:
    """A decayed ratio: sum of numerators / sum of denominators, old terms weighted down."""

    num: float = 0.0
    den: float = 0.0

    def add(self, num: float, den: float) -> None:
        self.num = WINDOW_DECAY * self.num + num
        self.den = WINDOW_DECAY * self.den + den

    @property
    def value(self) -> float:
        return self.num / self.den if self.den > 0 else 0.0


DECODE_FIT_PREFIX = "dynsched/rollout/decode_fit_"
"""The rollouter's per-version DecodeFit sums in its reset report (and so in the cycle's metrics)."""
HANDED_OVER = "dynsched/rollout/handed_over_samples"
"""The rollouter's reset report: samples a hybrid's abort handed to the standalones in the version."""
HANDED_OVER_ON_TIME = "dynsched/rollout/handed_over_on_time_samples"
"""Of those, the samples queued before the version's sync (the others arrive in a later cycle)."""
MIN_INFLIGHT_SPREAD = 1.0
"""Least standard deviation of the in-flight counts (requests) a decode fit needs: an engine that ran at
one batch size all along shows no slope."""
MIN_INFLIGHT_SPREAD_SHARE = 0.1
"""And at least this share of their mean: the load cost extrapolates the fitted slope from the loads seen
down to no load, so loads within a few percent of each other leave it to the noise. The first attempts of a
live run (the start-up ramp, every engine near its full batch) once fitted 15 times the steady load cost,
where the planner, whose engines start full at once, fitted none, and the two runs' decisions parted."""
MAX_LOAD_COST = 100.0
"""Cap of the fitted load cost (the load's part of a step a hundred times the fixed part: an engine
whose throughput no longer grows with its batch)."""
COLLINEAR = 0.995
"""Above this correlation of the two loads (requests, context tokens) the fit keeps the requests alone."""
FIT_SUMS = ("w", "r", "c", "y", "rr", "cc", "rc", "ry", "cy")


class InflightClock:
    """Integrals over time of an engine's load, held between changes: the requests in flight and the
    context tokens they hold. A request's mean load over an interval is (integral at its end - at its
    start) / its length. (The simulated replica keeps the same integrals inline, its context growing
    linearly between events: sim/model.py.)"""

    def __init__(self) -> None:
        self.count = 0
        self.tokens = 0.0
        self._requests_integral = 0.0
        self._tokens_integral = 0.0
        self._since_s = 0.0

    def change(self, now_s: float, *, requests: int = 0, tokens: float = 0.0) -> None:
        """Requests and context tokens enter (> 0) or leave (< 0) the engine at `now_s`."""
        self._requests_integral, self._tokens_integral = self.integrals(now_s)
        self._since_s = max(self._since_s, now_s)
        self.count = max(0, self.count + requests)
        self.tokens = max(0.0, self.tokens + tokens)

    def integrals(self, now_s: float) -> tuple[float, float]:
        """(requests x seconds, context tokens x seconds) up to `now_s`."""
        dt = max(0.0, now_s - self._since_s)
        return self._requests_integral + self.count * dt, self._tokens_integral + self.tokens * dt


@dataclass
class DecodeFit:
    """Seconds per decoded token against the engine's load while the attempt decoded (its requests in
    flight, r, and the context tokens they held, c; time averages), a token-weighted least-squares plane
    y = a + b_r r + b_c c (the requests alone where the two move together). `load_cost` = (b_r r + b_c c)
    / a at the mean load the tokens saw: the part of a step that grows with the engine's load (batch
    compute, KV reads) over the part that does not, which is what spreading the same load over more
    engines shrinks. The rollouter adds its finished attempts over a version and reports the sums; the
    controller keeps them decayed per version."""

    w: float = 0.0
    r: float = 0.0
    c: float = 0.0
    y: float = 0.0
    rr: float = 0.0
    cc: float = 0.0
    rc: float = 0.0
    ry: float = 0.0
    cy: float = 0.0

    def add(self, *, tokens: int, seconds: float, inflight: float, context: float = 0.0) -> None:
        """One finished attempt; one with no tokens, no time or no in-flight reading is left out."""
        if tokens <= 0 or seconds <= 0 or inflight <= 0:
            return
        y, r, c = seconds / tokens, inflight, max(0.0, context)
        self.w += tokens
        self.r += tokens * r
        self.c += tokens * c
        self.y += tokens * y
        self.rr += tokens * r * r
        self.cc += tokens * c * c
        self.rc += tokens * r * c
        self.ry += tokens * r * y
        self.cy += tokens * c * y

    def add_decayed(self, other: DecodeFit) -> None:
        """Old sums weigh WINDOW_DECAY per newer batch (a version's), like the rates."""
        for name in FIT_SUMS:
            setattr(self, name, WINDOW_DECAY * getattr(self, name) + getattr(other, name))

    def to_metrics(self) -> dict[str, float]:
        return {f"{DECODE_FIT_PREFIX}{name}": getattr(self, name) for name in FIT_SUMS}

    @classmethod
    def from_metrics(cls, metrics: dict[str, float]) -> DecodeFit:
        return cls(**{name: float(metrics.get(f"{DECODE_FIT_PREFIX}{name}", 0.0)) for name in FIT_SUMS})

    @property
    def mean_inflight(self) -> float:
        return self.r / self.w if self.w > 0 else 0.0

    @property
    def load_cost(self) -> float:
        """(b_r r + b_c c) / a at the mean load; 0 with too little spread of loads (under a request, or under
        MIN_INFLIGHT_SPREAD_SHARE of their mean) or no positive slope."""
        if self.w <= 0:
            return 0.0
        w = self.w
        mean_r, mean_c, mean_y = self.r / w, self.c / w, self.y / w
        var_r, var_c = self.rr / w - mean_r ** 2, self.cc / w - mean_c ** 2
        cov_rc = self.rc / w - mean_r * mean_c
        cov_ry, cov_cy = self.ry / w - mean_r * mean_y, self.cy / w - mean_c * mean_y
        if var_r < max(MIN_INFLIGHT_SPREAD, MIN_INFLIGHT_SPREAD_SHARE * mean_r) ** 2:
            return 0.0
        det = var_r * var_c - cov_rc ** 2
        if var_c <= 0 or det <= (1 - COLLINEAR ** 2) * var_r * var_c:
            slope_r, slope_c = cov_ry / var_r, 0.0
        else:
            slope_r = (cov_ry * var_c - cov_cy * cov_rc) / det
            slope_c = (cov_cy * var_r - cov_ry * cov_rc) / det
        load_s = slope_r * mean_r + slope_c * mean_c
        fixed_s = mean_y - load_s
        if load_s <= 0:
            return 0.0
        return MAX_LOAD_COST if fixed_s <= load_s / MAX_LOAD_COST else load_s / fixed_s


class RateMeter:
    """Replica-seconds of serving, split by kind, between progress readings; trainer micro-step time."""

    def __init__(self, *, num_standalone: int, num_hybrid: int, hybrids_serving: int = 0) -> None:
        """`hybrids_serving`: hybrids already serving when the meter is built (a controller restarted in
        HYBRID_ACTIVE); its first cycle then counts as one with hybrids."""
        self.num_standalone = num_standalone
        self.num_hybrid = num_hybrid
        self.standalones_serving = num_standalone
        self.hybrids_serving = hybrids_serving
        self._segment_start_s: float | None = None
        self._last_generated: int | None = None
        self._window_start_s: float | None = None
        self._last_idle_s: float | None = None
        self._standalone_rs = 0.0
        self._hybrid_rs = 0.0
        self._standalone = _Decayed()
        self._hybrid_extra = _Decayed()
        self._cycle = _Decayed()
        self._static = _Decayed()
        self._fill = _Decayed()
        self.last_hybrid_window_samples_per_s = 0.0
        """The latest hybrid window's own fill rate (0 until one closed)."""
        self._cycle_rs = 0.0
        self._cycle_hybrids_served = hybrids_serving > 0
        """Hybrids served in the sync cycle in progress: serving at its start or added in it (even for a
        window that closed at once)."""
        self._last_cycle_static = False
        """No hybrid served in the last sync cycle, and one served in an earlier cycle."""
        self._hybrids_served = False
        self._cycle_generated: int | None = None
        self.trainer_s_per_micro_step = 0.0
        self._decode = DecodeFit()
        self._handover = _Decayed()
        """Handed-over samples queued before their version's sync / handed over, per window, decayed."""

    # ---- inputs ----

    def record_decode_fit(self, rollouter_report: dict[str, float]) -> None:
        """The rollouter's reset report of a version: its finished attempts' decode fit sums."""
        self._decode.add_decayed(DecodeFit.from_metrics(rollouter_report))

    def record_handover(self, *, handed_over: int, on_time: int) -> None:
        """At a sync, before its decision: the samples the last hybrid window handed to the standalones,
        and of those the ones queued since (a cycle that handed none over leaves the share as it was)."""
        if handed_over > 0:
            self._handover.add(min(handed_over, max(0, on_time)), handed_over)

    def set_serving(self, now_s: float, *, standalones: int | None = None,
                    hybrids: int | None = None) -> None:
        """The number of standalones and/or hybrids serving changes at `now_s`. A change that happens
        with a progress reading must be given the reading's `now_s`: any hybrid time between them makes
        the next reading's segment a hybrid window."""
        self._close_segment(now_s)
        if standalones is not None:
            self.standalones_serving = standalones
        if hybrids is not None:
            self.hybrids_serving = hybrids
            self._cycle_hybrids_served = self._cycle_hybrids_served or hybrids > 0

    def read_progress(self, now_s: float, total_generated: int, *, cycle_end: bool = False,
                      idle_s: float = -1.0, cut_samples: int = 0) -> None:
        """A progress reading: closes the window since the previous one (the first only starts one);
        `cycle_end` (the reading at a sync) also closes the sync cycle's window. `idle_s`, the
        rollouter's idle seconds so far (-1: unknown), takes the window's idle share out of its
        replica-seconds: capacity held back by the staleness limit produced nothing, and counting it
        would make the replicas look slower than they are. `cut_samples` (of `total_generated`, those an
        abort queued by ending their last response, partial rollout off) count in the sync cycle, not in
        a window: they arrive in a burst at the abort (a sync's cuts inside the hybrid window it opens), which
        over a window of milliseconds would read as an enormous fill rate."""
        self._close_segment(now_s)
        busy = self._busy_share(now_s, idle_s)
        self._standalone_rs *= busy
        hybrid_serving_s = self._hybrid_rs
        self._hybrid_rs *= busy
        self._cycle_rs += self._standalone_rs + self._hybrid_rs
        if cycle_end:
            if self._cycle_generated is not None and self._cycle_rs > 0:
                produced = max(0, total_generated - self._cycle_generated)
                self._cycle.add(produced, self._cycle_rs)
                static = not self._cycle_hybrids_served
                if static and self._last_cycle_static and self.trainer_s_per_micro_step > 0:
                    self._static.add(produced * self.trainer_s_per_micro_step, self._cycle_rs)
                # before any hybrid served the pooled rate is this measurement: count from the first switch
                self._last_cycle_static = static and self._hybrids_served
                self._hybrids_served = self._hybrids_served or not static
            self._cycle_generated, self._cycle_rs = total_generated, 0.0
            self._cycle_hybrids_served = self.hybrids_serving > 0
        window_generated = total_generated - cut_samples
        if self._last_generated is not None:
            produced = max(0, window_generated - self._last_generated)
            if self._hybrid_rs > 0:
                explained = self.standalone_samples_per_replica_s * self._standalone_rs
                self._hybrid_extra.add(produced - explained, self._hybrid_rs)
                window_s = hybrid_serving_s / max(1, self.num_hybrid)
                self._fill.add(produced, window_s)
                self.last_hybrid_window_samples_per_s = produced / window_s
            elif self._standalone_rs > 0:
                self._standalone.add(produced, self._standalone_rs)
        self._last_generated = window_generated
        self._standalone_rs = self._hybrid_rs = 0.0

    def _busy_share(self, now_s: float, idle_s: float) -> float:
        """The share of the window since the last reading in which the rollouter was not idle."""
        start_s, last_idle_s = self._window_start_s, self._last_idle_s
        self._window_start_s, self._last_idle_s = now_s, (idle_s if idle_s >= 0 else None)
        if start_s is None or last_idle_s is None or idle_s < 0 or now_s <= start_s:
            return 1.0
        return min(1.0, max(0.0, 1.0 - (idle_s - last_idle_s) / (now_s - start_s)))

    def record_micro_step(self, train_s: float) -> None:
        """One micro-step took the trainer `train_s` from its collection to its next handshake."""
        if train_s < 0:
            return
        if self.trainer_s_per_micro_step <= 0:
            self.trainer_s_per_micro_step = train_s
        else:
            self.trainer_s_per_micro_step += TRAIN_EWMA_ALPHA * (train_s - self.trainer_s_per_micro_step)

    # ---- outputs ----

    @property
    def standalone_samples_per_replica_s(self) -> float:
        return self._standalone.value

    @property
    def hybrid_window_samples_per_s(self) -> float:
        """Samples enqueued per second of hybrid serving in the hybrid windows, everything included:
        how fast the queue fills while the trainer waits with its GPUs lent (0 until measured)."""
        return self._fill.value

    @property
    def samples_per_replica_s(self) -> float:
        """Samples per serving replica-second over whole sync cycles, both kinds pooled: work a hybrid
        left unfinished at its deactivation completes on a standalone within the cycle, so this counts
        it, where the per-window rates do not."""
        return self._cycle.value

    @property
    def static_samples_per_replica_s(self) -> float:
        """The same over the sync cycles no hybrid was added in that follow another such cycle (no hybrid
        work handed to the standalones), counted from the first switch on, each scaled by the trainer's
        micro-step time then over now (0 until one closed): what the standalones produce alone. Where
        lending the GPUs only spreads the same requests over more engines, the pooled rate falls in the
        cycles that switch and would make staying look worse than it is; before any switch every cycle
        is such a cycle, and the pooled rate is this measurement. The scaling keeps a rate measured
        before a streak of switches current where the samples lengthen: that slows the trainer and the
        engines alike."""
        train_s = self.trainer_s_per_micro_step
        return self._static.value / train_s if train_s > 0 else 0.0

    @property
    def hybrid_samples_per_replica_s(self) -> float:
        """Extra production per hybrid replica-second (never negative; 0 until a hybrid window closed)."""
        return max(0.0, self._hybrid_extra.value)

    @property
    def decode_load_cost(self) -> float:
        """The engines' step part that grows with their load over the fixed part (0 until measured)."""
        return self._decode.load_cost

    @property
    def handover_on_time_share(self) -> float:
        """The share of a hybrid window's handed-over samples queued within that window's own cycle (1.0
        until a window handed any over: all of them, as the policy's model assumed before it was measured)."""
        return self._handover.value if self._handover.den > 0 else 1.0

    def _close_segment(self, now_s: float) -> None:
        if self._segment_start_s is not None:
            dt = max(0.0, now_s - self._segment_start_s)
            self._standalone_rs += dt * self.standalones_serving
            self._hybrid_rs += dt * self.hybrids_serving
        self._segment_start_s = now_s
