"""Fit a scenario's free physics parameters on the per-step observables of its `fit: true` rows.

Where it sits: a tool (``python -m sim.calibrate --config FILE [--write] [--metrics RUN/metrics.jsonl]``);
the result is stored in the scenario YAML (lines marked ``# fitted``) and printed with its physics
report. ``dynsched validate`` then compares every row, fitted or not, with the model.

Observables per row (``sim.observe``): step time, ``timing_s/gen``, update time, tokens per step,
mq_size, wall hours after N steps (when the simulation reaches N), each where the row gives it;
residuals are relative errors, ``gen`` relative to a tenth of the step (a small wait must not
dominate). Method: Levenberg-Marquardt on simulated observables, finite-difference Jacobian,
each step clipped (damped) and projected into the parameter's bounds.

Refusals, each naming the reason:

- no fit rows, or a parameter no residual moves (``CalibrationError``: the rows cannot identify it, with
  each row's regime, production- or consumption-bound in the model);
- two parameters that move the residuals the same way (near-singular Jacobian);
- a result outside physical bounds (``sim.physics.PhysicsError``: faster than the roofline, MFU too high).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared.sim_config import PublishedRow
from sim import surrogate
from sim.observe import Observed, from_result, from_row
from sim.physics import PhysicsError, TrainerRow, check, physics_report
from sim.run import simulate
from sim.scenario import Scenario, WorkloadShape, load_scenario


class CalibrationError(ValueError):
    """The rows cannot identify what was asked to be fitted."""


@dataclass(frozen=True, kw_only=True)
class FreeParameter:
    key: str
    """Dotted config key."""
    lo: float
    hi: float
    log: bool
    """Fit in log space (scale parameters); else in units of ``scale``."""
    scale: float = 1.0


FREE_PARAMETERS = {
    "decode_efficiency": FreeParameter(key="simulator.physics.decode_efficiency", lo=0.01, hi=2.0, log=True),
    "train_mfu": FreeParameter(key="simulator.physics.train_mfu", lo=0.01, hi=2.0, log=True),
    "train_non_scaling_s": FreeParameter(key="simulator.physics.train_non_scaling_s", lo=0.0, hi=3600.0,
                                         log=False, scale=20.0),
    "response_median_end": FreeParameter(key="simulator.workload.response_tokens_median_end", lo=50.0,
                                         hi=65536.0, log=True),
    "collect_s": FreeParameter(key="simulator.trainer.collect_s_per_sample", lo=0.0, hi=60.0, log=False,
                               scale=0.1),
}
FIT_OBSERVABLES = ("step_s", "gen_s", "update_s", "tokens_per_step", "mq_size")
MIN_SENSITIVITY = 0.01
"""A parameter that moves no residual by 1% per unit step (x e in log space) is not identified."""


def _forward(name: str, value: float) -> float:
    p = FREE_PARAMETERS[name]
    return math.log(value) if p.log else value / p.scale


def _inverse(name: str, x: float) -> float:
    p = FREE_PARAMETERS[name]
    return min(p.hi, max(p.lo, math.exp(x) if p.log else x * p.scale))


def get_param(scenario: Scenario, name: str) -> float:
    node: object = scenario.config
    for part in FREE_PARAMETERS[name].key.split("."):
        node = getattr(node, part)
    assert isinstance(node, float), (name, node)
    return node


def row_scenario(scenario: Scenario, row: PublishedRow | Observed, steps: int) -> Scenario:
    """The scenario at the row's split, plain fully-async, shortened to ``steps`` steps (trainer steps,
    or weight versions for a row whose ``step_unit`` is 'version')."""
    if isinstance(row, PublishedRow) and row.overrides:
        scenario = scenario.with_changes(_typed(scenario, row.overrides))
    at = scenario.async_training
    prompts = at.ppo_mini_batch_size * at.require_batches * steps
    if getattr(row, "step_unit", "micro_step") == "version":
        prompts *= at.trigger_parameter_sync_step
    policy = getattr(row, "policy", "static")
    return scenario.with_split(row.train_gpus, row.rollout_gpus, policy=policy).with_prompts(prompts)


def _typed(scenario: Scenario, overrides: dict[str, float]) -> dict[str, object]:
    """YAML gives every override as a number; an integer field gets an int."""
    out: dict[str, object] = {}
    for key, value in overrides.items():
        node: object = scenario.config
        for part in key.split("."):
            node = getattr(node, part)
        out[key] = int(value) if isinstance(node, int) and not isinstance(node, bool) else float(value)
    return out


def simulate_row(scenario: Scenario, row: PublishedRow | Observed, steps: int) -> Observed:
    return from_result(simulate(row_scenario(scenario, row, steps)), label=row.label,
                       step_unit=getattr(row, "step_unit", "micro_step"))


def _simulate_job(job: tuple[Scenario, PublishedRow, int]) -> Observed:
    return simulate_row(*job)


def residuals(sim: Observed, pub: Observed) -> list[float]:
    out = []
    for name in FIT_OBSERVABLES:
        want, got = pub.get(name), sim.get(name)
        if want is None or got is None:
            continue
        floor = 0.1 * (pub.step_s or want) if name in ("gen_s", "mq_size") else 0.0
        out.append((got - want) / max(want, floor, 1e-9))
    for steps, hours in sorted(pub.hours.items()):
        if steps in sim.hours:
            out.append(sim.hours[steps] / hours - 1.0)
    return out


def consistency_notes(rows: list[Observed]) -> list[str]:
    """Published columns that cannot all hold in one trainer step (step >= gen + update)."""
    notes = []
    for row in rows:
        if row.step_s and row.gen_s is not None and row.update_s and row.gen_s + row.update_s > row.step_s:
            excess = row.gen_s + row.update_s - row.step_s
            notes.append(f"{row.label}: gen + update = {row.gen_s + row.update_s:.1f} s > step "
                         f"{row.step_s:.1f} s by {excess:.1f} s: these columns are not from one window; "
                         f"the fit splits the difference")
    return notes


def regime(sim: Observed, max_queue_size: int) -> str:
    mq = sim.mq_size or 0.0
    wait = sim.gen_s or 0.0
    kind = ("consumption-bound" if mq >= 0.25 * max_queue_size else
            "production-bound" if mq < 0.02 * max_queue_size else "balanced")
    return f"{kind} (mean mq_size {mq:.0f} of {max_queue_size}, gen {wait:.1f} s/step)"


class Fit:
    """One calibration: parameters in a transformed space, simulated residuals, LM iterations."""

    def __init__(self, scenario: Scenario, rows: list[PublishedRow], names: list[str], *, steps: int,
                 log: bool = True, workers: int = 1, closed_form_after: int = 0) -> None:
        unknown = [n for n in names if n not in FREE_PARAMETERS]
        if unknown:
            raise CalibrationError(f"cannot fit {unknown}: expected names in {list(FREE_PARAMETERS)}")
        if closed_form_after and not set(names) <= surrogate.SURROGATE_PARAMETERS:
            raise CalibrationError(f"a closed-form fit needs trainer-side parameters only "
                                   f"({sorted(surrogate.SURROGATE_PARAMETERS)}), not {names}")
        self.closed_form_after = closed_form_after
        """>0: simulate the rows this many steps to check that each is consumption-bound, then take
        every residual from the closed form (sim.surrogate) at ``steps``."""
        self.fit_rows = [r for r in rows if r.fit]
        if not self.fit_rows:
            raise CalibrationError("no row has fit: true; nothing to calibrate on")
        self.scenario, self.names, self.steps, self.log, self.workers = scenario, names, steps, log, workers
        self.published = [from_row(r) for r in self.fit_rows]
        self.last: list[Observed] = []

    def to_x(self, values: list[float]) -> np.ndarray:
        return np.array([_forward(n, v) for n, v in zip(self.names, values, strict=True)])

    def to_values(self, x: np.ndarray) -> list[float]:
        return [_inverse(n, float(xi)) for n, xi in zip(self.names, x, strict=True)]

    def at(self, x: np.ndarray) -> Scenario:
        changes = {FREE_PARAMETERS[n].key: v for n, v in zip(self.names, self.to_values(x), strict=True)}
        return self.scenario.with_changes(changes)

    def residual(self, x: np.ndarray) -> np.ndarray:
        scenario = self.at(x)
        jobs = [(scenario, row, self.steps) for row in self.fit_rows]
        if self.workers > 1:
            with ProcessPoolExecutor(max_workers=min(self.workers, len(jobs))) as pool:
                self.last = list(pool.map(_simulate_job, jobs))
        else:
            self.last = [_simulate_job(job) for job in jobs]
        out = [r for sim, pub in zip(self.last, self.published, strict=True) for r in residuals(sim, pub)]
        if not out:
            raise CalibrationError(f"the fit rows give no observable a {self.steps}-step simulation reaches")
        return np.array(out)

    def jacobian(self, x: np.ndarray, r: np.ndarray) -> np.ndarray:
        """Finite differences: of the closed-form trainer side (sim.surrogate) when every parameter
        lives there, else of full simulations."""
        h = 0.1
        cheap = set(self.names) <= surrogate.SURROGATE_PARAMETERS
        base = self._surrogate_residual(x) if cheap else r
        cols = []
        for j, name in enumerate(self.names):
            sign = -1.0 if x[j] + h > _forward(name, FREE_PARAMETERS[name].hi) else 1.0
            probe = x.copy()
            probe[j] += sign * h
            moved = self._surrogate_residual(probe) if cheap else self.residual(probe)
            cols.append((moved - base) / (sign * h))
        return np.array(cols).T

    def _surrogate_observed(self, x: np.ndarray) -> list[Observed]:
        scenario = self.at(x)
        return [surrogate.observe(row_scenario(scenario, row, self.steps), label=row.label,
                                  mq_size=sim.mq_size, step_unit=row.step_unit)
                for row, sim in zip(self.fit_rows, self.last, strict=True)]

    def _surrogate_residual(self, x: np.ndarray) -> np.ndarray:
        models = self._surrogate_observed(x)
        return np.array([r for m, pub in zip(models, self.published, strict=True) for r in residuals(m, pub)])

    def _check_consumption_bound(self, x: np.ndarray) -> None:
        """Simulate the rows ``closed_form_after`` steps; the closed form holds only if no row's trainer
        waits for generation (its gen is the batch collection alone, within 2% of the step)."""
        steps, self.steps = self.steps, self.closed_form_after
        try:
            self.residual(x)
        finally:
            self.steps = steps
        scenario, max_queue = self.at(x), self._max_queue()
        waiting = []
        for row, sim in zip(self.fit_rows, self.last, strict=True):
            at_row = row_scenario(scenario, row, 1)
            per_step = at_row.async_training.trigger_parameter_sync_step if row.step_unit == "version" else 1
            wait = (sim.gen_s or 0.0) - at_row.trainer.collect_s * per_step
            if wait > 0.02 * (sim.step_s or 0.0):
                waiting.append(f"{sim.label}: waits {wait:.1f} s/step, {regime(sim, max_queue)}")
        if waiting:
            raise CalibrationError("a closed-form fit needs every fit row consumption-bound (its trainer "
                                   "never waiting for generation); " + "; ".join(waiting))

    def identify(self, jac: np.ndarray) -> None:
        max_queue = self._max_queue()
        regimes = "; ".join(f"{s.label}: {regime(s, max_queue)}" for s in self.last)
        for j, name in enumerate(self.names):
            if float(np.max(np.abs(jac[:, j]))) < MIN_SENSITIVITY:
                raise CalibrationError(f"the fit rows cannot identify {name}: no observable moves with it "
                                       f"(rows {regimes}); fit it on a row in another regime or keep it a "
                                       f"prior")
        norms = np.linalg.norm(jac, axis=0)
        sv = np.linalg.svd(jac / norms, compute_uv=False)
        if len(sv) < len(self.names) or sv[-1] / sv[0] < 1e-3:
            raise CalibrationError(f"the fit rows cannot separate {', '.join(self.names)}: {jac.shape[0]} "
                                   f"observables move them the same way (singular values "
                                   f"{np.round(sv, 4).tolist()})")

    def _max_queue(self) -> int:
        at = self.scenario.async_training
        return int(at.ppo_mini_batch_size * at.require_batches * (1 + at.staleness_threshold)
                   * at.trigger_parameter_sync_step)

    def run(self, *, max_iter: int = 6, tol: float = 1e-4) -> tuple[dict[str, float], float]:
        x = self.to_x([get_param(self.scenario, n) for n in self.names])
        if self.closed_form_after:
            self._check_consumption_bound(x)
            max_iter = 4 * max_iter  # closed-form evaluations cost milliseconds
        residual = self._surrogate_residual if self.closed_form_after else self.residual
        r = residual(x)
        at_x = self.last
        cost, lam = float(r @ r), 1e-2
        for it in range(max_iter):
            self._say(f"iter {it}: {dict(zip(self.names, np.round(self.to_values(x), 5), strict=True))} "
                      f"rms {math.sqrt(cost / len(r)):.4f}")
            jac = self.jacobian(x, r)
            self.last = at_x  # the rows as simulated at x (regime lines, surrogate offsets)
            if it == 0:
                self.identify(jac)
            jtj, g = jac.T @ jac, jac.T @ r
            improved = False
            while not improved and lam <= 1e2:  # at most 5 full evaluations per iteration
                step = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-12), -g)
                step = np.clip(step, -0.7, 0.7)  # damping: at most x2 (log) or 0.7 scales per iteration
                trial = self.to_x(self.to_values(x + step))
                r_new = residual(trial)
                improved = float(r_new @ r_new) < cost
                lam = lam / 3 if improved else lam * 10
            if not improved:
                break
            change = cost - float(r_new @ r_new)
            x, r, cost, at_x = trial, r_new, float(r_new @ r_new), self.last
            if change < tol:
                break
        self.last = self._surrogate_observed(x) if self.closed_form_after else at_x
        values = dict(zip(self.names, self.to_values(x), strict=True))
        self._say(f"fitted: {values} rms {math.sqrt(cost / len(r)):.4f}")
        return values, math.sqrt(cost / len(r))

    def _say(self, text: str) -> None:
        if self.log:
            print(text, file=sys.stderr)


def calibrate(scenario: Scenario, *, names: list[str] | None = None, steps: int = 48, log: bool = True,
              workers: int = 1, closed_form_after: int = 0) -> tuple[Scenario, dict[str, float], Fit]:
    """Fit ``names`` (default: the scenario's ``simulator.physics.fit_parameters``) on its fit rows;
    refuse a result outside physical bounds. Returns the fitted scenario, the values and the fit."""
    phys = scenario.config.simulator.physics
    if phys is None:
        raise CalibrationError("the scenario has no simulator.physics section: nothing physical to fit")
    fit = Fit(scenario, list(scenario.config.simulator.published), names or list(phys.fit_parameters),
              steps=steps, log=log, workers=workers, closed_form_after=closed_form_after)
    values, _ = fit.run()
    fitted = scenario.with_changes({FREE_PARAMETERS[n].key: v for n, v in values.items()})
    assert fitted.config.simulator.physics is not None
    check(fitted.config.simulator.physics)
    return fitted, values, fit


def typical_context_tokens(wl: WorkloadShape) -> float:
    """Prompt + half the run's mean median response: the context a running request holds on average."""
    return wl.prompt_tokens_median + 0.25 * (wl.response_tokens_median_start + wl.response_tokens_median_end)


def report_lines(scenario: Scenario, fit: Fit) -> list[str]:
    """The physics report of a fitted scenario, with the MFU of each fitted row's simulated update."""
    phys = scenario.config.simulator.physics
    assert phys is not None
    context = typical_context_tokens(scenario.workload)
    rows = tuple(TrainerRow(label=s.label, train_gpus=s.train_gpus, tokens_per_step=s.tokens_per_step or 0.0,
                            update_s=s.update_s or 1.0) for s in fit.last)
    lines = physics_report(phys, tp=scenario.cluster.gpus_per_replica,
                           max_running=scenario.replica.max_running_requests, mean_context_tokens=context,
                           rows=rows)
    max_queue = fit._max_queue()
    lines += [f"regime {s.label}: {regime(s, max_queue)}" for s in fit.last]
    return lines


def write_params(path: Path, values: dict[str, float]) -> None:
    """Rewrite the fitted values in place (their lines end in '# fitted'), keeping every comment."""
    text = path.read_text()
    for name, value in values.items():
        leaf = FREE_PARAMETERS[name].key.rsplit(".", 1)[1]
        text, count = re.subn(rf"^(\s*{leaf}:\s*)[0-9.eE+-]+(\s*# fitted)", rf"\g<1>{value:.6g}\g<2>", text,
                              flags=re.M)
        if count != 1:
            raise ValueError(f"{path}: expected exactly one '{leaf}: ... # fitted' line, found {count}")
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.calibrate", description=__doc__.split("\n")[0])
    parser.add_argument("--config", "--scenario", dest="config", required=True, type=Path,
                        help="scenario YAML with simulator.physics and simulator.published rows")
    parser.add_argument("--fit", default="", help="comma-separated parameters (default: the scenario's list)")
    parser.add_argument("--steps", type=int, default=48, help="trainer steps simulated per row")
    parser.add_argument("--workers", type=int, default=1, help="rows simulated in parallel")
    parser.add_argument("--closed-form-after", type=int, default=0, metavar="STEPS",
                        help="check each fit row is consumption-bound in a STEPS-step simulation, then fit "
                             "on the closed-form trainer model (sim.surrogate) at --steps; 0: full "
                             "simulations throughout")
    parser.add_argument("--write", action="store_true", help="store the fitted values in the config file")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.config)
    names = [n for n in args.fit.split(",") if n] or None
    try:
        for note in consistency_notes([from_row(r) for r in scenario.config.simulator.published if r.fit]):
            print(f"note: {note}")
        fitted, values, fit = calibrate(scenario, names=names, steps=args.steps, workers=args.workers,
                                        closed_form_after=args.closed_form_after)
    except (CalibrationError, PhysicsError) as exc:
        print(f"calibration refused: {exc}", file=sys.stderr)
        return 1
    for name, value in values.items():
        print(f"{FREE_PARAMETERS[name].key}: {value:.6g}")
    print("\n".join(report_lines(fitted, fit)))
    if args.write:
        write_params(args.config, values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
