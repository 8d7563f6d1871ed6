"""Config checks that need the policy registry: the policy module imports, the policy name is registered.

Where it sits: shared/config.py checks everything it can without importing
policies (shared must not import them); callers that are about to run or
simulate a config (`dynsched run/up/simulate/plan/config-check`) call
`load_checked_config` so a wrong policy name or module is one clear line
before any service starts, not a controller crash later.
"""

from __future__ import annotations

from pathlib import Path

from policies.base import load_policy_module, registered_policies
from shared.config import Config, ConfigError, load_config


def check_policy(config: Config, *, source: str = "") -> None:
    """Import `dynamic_schedule_policy_module` (if any) and check `dynamic_schedule_policy` is registered."""
    prefix = f"config: {source}: " if source else "config: "
    at = config.async_training
    if at.dynamic_schedule_policy_module:
        try:
            load_policy_module(at.dynamic_schedule_policy_module)
        except Exception as exc:  # any failure of a user's module is a config mistake, reported in one line
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise ConfigError(f"{prefix}async_training.dynamic_schedule_policy_module="
                              f"{at.dynamic_schedule_policy_module!r} is invalid: "
                              f"cannot import it ({reason})") from None
    known = registered_policies()
    if at.dynamic_schedule_policy not in known:
        raise ConfigError(f"{prefix}async_training.dynamic_schedule_policy={at.dynamic_schedule_policy!r} "
                          f"is invalid: expected a registered policy ({', '.join(known)}); "
                          f"a user policy also needs async_training.dynamic_schedule_policy_module")


def load_checked_config(path: str | Path) -> Config:
    """`shared.config.load_config` plus the policy checks: everything a run needs, checked at load."""
    config = load_config(path)
    check_policy(config, source=str(path))
    return config
