"""Calibrate a scenario's two free parameters on two measured static runs.

Where it sits: a one-off tool (``python -m sim.calibrate --config FILE
[--write]``); its result is stored in the config YAML and checked by
tests/test_sim_calibration.py. Only the *static* runs are used, so the
dynamic prediction is an out-of-sample check, not a fit.

Free parameters and the run that pins each (the other is almost insensitive):

- ``rollout.sim.decode_s_per_step`` <- the production-bound split (16 train + 16 rollout);
- ``simulator.trainer.seconds_per_ktoken`` <- the consumption-bound split (8 train + 24 rollout).

Method: Newton's method in log space with a finite-difference Jacobian
(simulated times are close to power laws in both parameters), stopping when
both runs are within ``tol`` relative error.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from sim.run import simulate
from sim.scenario import Scenario, load_scenario


@dataclass(frozen=True, kw_only=True)
class Target:
    train_gpus: int
    rollout_gpus: int
    hours: float


SEED_TARGETS = (Target(train_gpus=16, rollout_gpus=16, hours=6.546),
                Target(train_gpus=8, rollout_gpus=24, hours=6.379))


def with_params(scenario: Scenario, decode_step_s: float, seconds_per_ktoken: float) -> Scenario:
    return scenario.with_changes({"rollout.sim.decode_s_per_step": decode_step_s,
                                  "simulator.trainer.seconds_per_ktoken": seconds_per_ktoken})


def static_hours(scenario: Scenario, targets: tuple[Target, ...] = SEED_TARGETS) -> list[float]:
    return [simulate(scenario.with_split(t.train_gpus, t.rollout_gpus, policy="static")).wall_s / 3600.0
            for t in targets]


def calibrate(scenario: Scenario, targets: tuple[Target, ...] = SEED_TARGETS, *, tol: float = 0.002,
              max_iter: int = 8, log: bool = True) -> tuple[float, float, list[float]]:
    """Return (decode_step_s, seconds_per_ktoken, simulated hours per target)."""
    x = [math.log(scenario.replica.decode_step_s), math.log(scenario.trainer.seconds_per_ktoken)]
    goal = [math.log(t.hours) for t in targets]

    def residual(point: list[float]) -> tuple[list[float], list[float]]:
        hours = static_hours(with_params(scenario, math.exp(point[0]), math.exp(point[1])), targets)
        return [math.log(h) - g for h, g in zip(hours, goal, strict=True)], hours

    res, hours = residual(x)
    for it in range(max_iter):
        if log:
            print(f"iter {it}: decode_step_s={math.exp(x[0]):.6g} seconds_per_ktoken={math.exp(x[1]):.6g} "
                  f"hours={[round(h, 4) for h in hours]}", file=sys.stderr)
        if max(abs(r) for r in res) < tol:
            break
        step = 0.05
        jac = []
        for j in range(2):
            probe = list(x)
            probe[j] += step
            jac.append([(rp - r) / step for rp, r in zip(residual(probe)[0], res, strict=True)])
        # jac[j][i] = d res_i / d x_j ; solve J dx = -res (2x2).
        a, b, c, d = jac[0][0], jac[1][0], jac[0][1], jac[1][1]
        det = a * d - b * c
        if abs(det) < 1e-9:
            raise RuntimeError("calibration Jacobian is singular: the two runs do not pin the two parameters")
        dx0 = (-res[0] * d + res[1] * b) / det
        dx1 = (-res[1] * a + res[0] * c) / det
        x = [x[0] + dx0, x[1] + dx1]
        res, hours = residual(x)
    return math.exp(x[0]), math.exp(x[1]), hours


def write_params(path: Path, decode_step_s: float, seconds_per_ktoken: float) -> None:
    """Rewrite the two calibrated values in place, keeping every comment."""
    text = path.read_text()
    for key, value in (("decode_s_per_step", decode_step_s), ("seconds_per_ktoken", seconds_per_ktoken)):
        text, count = re.subn(rf"^(\s*{key}:\s*)[0-9.eE+-]+", rf"\g<1>{value:.6g}", text, flags=re.M)
        if count != 1:
            raise ValueError(f"{path}: expected exactly one '{key}:' line, found {count}")
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.calibrate", description=__doc__.split("\n")[0])
    parser.add_argument("--config", "--scenario", dest="config", required=True, type=Path,
                        help="run config YAML with a simulator section (scenarios/)")
    parser.add_argument("--write", action="store_true", help="store the result in the config file")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.config)
    decode_step_s, seconds_per_ktoken, hours = calibrate(scenario)
    for target, h in zip(SEED_TARGETS, hours, strict=True):
        print(f"{target.train_gpus}-{target.rollout_gpus} static: simulated {h:.3f} h, "
              f"measured {target.hours} h ({(h / target.hours - 1) * 100:+.2f}%)")
    print(f"rollout.sim.decode_s_per_step: {decode_step_s:.6g}\n"
          f"simulator.trainer.seconds_per_ktoken: {seconds_per_ktoken:.6g}")
    if args.write:
        write_params(args.config, decode_step_s, seconds_per_ktoken)
    return 0


if __name__ == "__main__":
    sys.exit(main())
