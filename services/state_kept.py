"""Has Redis kept this run's state? The launcher asks at every poll, so a run whose state is gone stops with
the reason instead of going on as a new run, or waiting for ever.

Where it sits: `services/launcher.py` calls `lost_state_reason` with the `run_state` hash it just read and
raises `RedisStateLost` with the reason. Two checks:

- `run_state.started_at` still holds the start this launcher wrote: Redis restarted without its
  append-only file, was flushed, or evicted that key.
- The per-sample ledger (`samples`) holds one state for every sample the accounting says was fed: the
  rollouter writes both in one transaction, so they differ only when one of them was deleted or evicted
  (measured: `DEL dynsched:samples` mid-run left the run waiting for good, the trainer dead-lettering
  every sample as never queued; `DEL dynsched:accounting` let it end `done` with a negative `lost`).
"""

from __future__ import annotations

from typing import Any

import redis

from shared.names import AccountingField, Names, RunStateField

ADVICE = ("use appendonly yes and maxmemory-policy noeviction, and never delete a run's keys by hand; the "
          "samples before it cannot be accounted for, so the run stops here")


def ledger_sizes(client: redis.Redis, names: Names) -> tuple[int, int]:
    """(samples with a state, samples fed by the accounting), read at one moment."""
    with client.pipeline(transaction=True) as pipe:
        pipe.hlen(names.sample_states)
        pipe.hget(names.accounting, AccountingField.FED)
        states, fed = pipe.execute()
    return int(states), int(fed or 0)


def lost_state_reason(client: redis.Redis, names: Names, *, run_id: str, run_state: dict[str, Any],
                      micro_steps: int) -> str | None:
    """Why this run's state in Redis can no longer be trusted, or None while it is whole."""
    if not run_id:
        return None
    found = run_state.get(RunStateField.STARTED_AT)
    if found != run_id:
        return (f"Redis lost this run's state (run_state.started_at is {found or 'gone'}, this run wrote "
                f"{run_id}) after about {micro_steps} micro-step(s): it restarted without its append-only "
                f"file, was flushed, or evicted keys ({ADVICE})")
    states, fed = ledger_sizes(client, names)
    if states != fed:
        return (f"Redis lost part of this run's sample ledger ({names.sample_states} holds {states} sample "
                f"state(s), {names.accounting} counts {fed} fed) after about {micro_steps} micro-step(s): "
                f"a key was deleted or evicted ({ADVICE})")
    return None
