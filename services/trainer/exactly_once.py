"""The trainer's exactly-once step on Redis: a sample is trained only on a `queued -> trained`
compare-and-set keyed by its id.

Where it sits: the trainer driver (`services/trainer/service.py`) screens each sample it pops
from the MessageQueue with `screen` (a byte-identical copy of a sample already trained, a second
copy within the batch, or an id the rollouter never queued is dead-lettered with the reason,
never trained; the driver pops another in its place), and after the micro-step commits the batch
with `MARK_TRAINED`: one Lua script acks the entries, moves each sample `queued -> trained` only
if it is still `queued`, moves the accounting counters by the number it moved, and writes the
trainer's progress (global_steps, version, sync pending, the checkpoint pointer), all at once.
An entry that fails the compare-and-set there (it can only if another trainer raced this one) is
acked and dead-lettered by the script too, so nothing is counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis.asyncio as aredis

from shared.names import TRAINER_GROUP, AccountingField, Names, SampleState
from shared.redis_client import as_str

MARK_TRAINED = """
-- KEYS: sample_states, accounting, mq, dead letters, trainer_state
-- ARGV: group, queued, trained, accounting 'queued' field, 'trained' field, dead letters' MAXLEN,
--       n progress pairs, (progress field, value) x n, then (entry id, sample id)...
local moved = 0
local rejected = {}
local n = tonumber(ARGV[7])
for i = 8, 7 + 2 * n, 2 do
  redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 1])
end
for i = 8 + 2 * n, #ARGV, 2 do
  local entry_id, sample_id = ARGV[i], ARGV[i + 1]
  local state = redis.call('HGET', KEYS[1], sample_id)
  redis.call('XACK', KEYS[3], ARGV[1], entry_id)
  if state == ARGV[2] then
    redis.call('HSET', KEYS[1], sample_id, ARGV[3])
    moved = moved + 1
  else
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*',
               'dlq_reason', 'not queued when marked trained: ' .. tostring(state),
               'dlq_stream', KEYS[3], 'dlq_group', ARGV[1], 'dlq_id', entry_id, 'sample_id', sample_id)
    table.insert(rejected, entry_id)
  end
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[4], -moved)
  redis.call('HINCRBY', KEYS[2], ARGV[5], moved)
end
return rejected
"""


async def mark_trained(redis: aredis.Redis, names: Names, batch: Sequence[tuple[bytes, str]], *,
                       progress: Mapping[str, int | str], dead_letter_maxlen: int) -> list[bytes]:
    """Ack `batch` ((entry id, sample id) pairs), move its queued samples to trained and write
    `progress` into trainer_state, atomically; the entry ids that were not queued (dead-lettered
    by the script)."""
    args: list[bytes | str | int] = [TRAINER_GROUP, SampleState.QUEUED, SampleState.TRAINED,
                                     AccountingField.QUEUED, AccountingField.TRAINED, dead_letter_maxlen,
                                     len(progress)]
    for field, value in progress.items():
        args += [field, value]
    for entry_id, sample_id in batch:
        args += [entry_id, sample_id]
    keys = [names.sample_states, names.accounting, names.mq, names.dead_letters, names.trainer_state]
    rejected = await redis.eval(MARK_TRAINED, len(keys), *keys, *args)  # type: ignore[misc]
    return [bytes(r) for r in rejected]


async def screen(redis: aredis.Redis, names: Names, sample_ids: Sequence[str],
                 taken: set[str]) -> list[str | None]:
    """Why each of `sample_ids` must not be trained (None: it is queued and not yet in this batch);
    the ones that pass join `taken`. One round trip for the whole read."""
    if not sample_ids:
        return []
    states = await redis.hmget(names.sample_states, list(sample_ids))  # type: ignore[misc]
    reasons: list[str | None] = []
    for sample_id, raw in zip(sample_ids, states, strict=True):
        if sample_id in taken:
            reasons.append(f"duplicate: sample {sample_id} is already in this batch")
        elif raw is None:
            reasons.append(f"unknown sample id {sample_id}: never queued by the rollouter")
        elif (state := as_str(raw)) != SampleState.QUEUED:
            reasons.append(f"duplicate: sample {sample_id} is {state}, not {SampleState.QUEUED}")
        else:
            reasons.append(None)
            taken.add(sample_id)
    return reasons
