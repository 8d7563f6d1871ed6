"""Queued samples whose MessageQueue entry vanished go back to generating, so the run cannot wait for them
for ever.

Where it sits: the trainer driver (`services/trainer/service.py`) calls `requeue_vanished` while it has
waited a while for samples. A `queued` sample reaches the trainer only through an entry of the MessageQueue
that its consumer group can still deliver: one not delivered yet, or one pending with its content. That
entry can vanish while the sample stays `queued`: an operator trims or deletes the stream (`XTRIM`, `XDEL`,
`DEL`) or destroys the group, Redis evicts the key, or the stream consumer dead-letters an entry delivered
too often. The rollouter then counts the sample against the staleness limit and the trainer waits for it:
before this, such a run hung for good with `lost` 0.

One script, atomic against the rollouter's enqueue and the trainer's `MARK_TRAINED`, finds each `queued`
sample that no deliverable entry and none of the trainer's own samples in hand (`held`, the batch it is
collecting) account for, moves it back to `generating` (the accounting moves with it; `vanished` counts
it) and writes a `Regenerate` entry (`shared.schema`) for the rollouter, which generates it again from its
prompt. Nothing is trained twice: a sample in the trainer's hands is `held`, and a late copy of a vanished
entry is screened like any copy. The trainer is the group's only consumer, so while it is collecting it
knows every entry the group has handed out and not yet committed.

Cost: the trainer calls it only after reads that returned nothing, so no entry is left undelivered, and the
pending entries are the ones in its hands, whose sample ids it passes: the script reads no entry's content
then, and one state per sample. Only when the queued count exceeds what those account for does it read the
whole state hash, after which the count is what they account for (so a count that drifted, a write lost in
a crash, costs one such read, not one per check).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis.asyncio as aredis

from shared.names import TRAINER_GROUP, AccountingField, Names, SampleState
from shared.redis_client import as_str
from shared.schema import Regenerate

log = logging.getLogger(__name__)
CHECK_AFTER_S = 1.0
"""Wall seconds of reads that returned nothing after which the trainer checks, and again after each
such interval."""

REQUEUE_VANISHED = """
-- KEYS: sample_states, accounting, mq, regenerate stream
-- ARGV: group, queued, generating, accounting 'queued', 'generating', 'vanished' fields, Regenerate's
--       type tag, then (entry id, sample id) of each sample the trainer holds
local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
  return nil
end
local live, held = {}, {}
for i = 8, #ARGV, 2 do
  held[ARGV[i]] = true
  live[ARGV[i + 1]] = true
end
local function deliverable(entries)
  for _, entry in ipairs(entries) do
    local sample_id = field(entry[2], 'sample_id')
    if sample_id then live[sample_id] = true end
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  local last, pending, lag = '0-0', 0, false  -- without the group, a new one delivers every entry
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', KEYS[3])) do
    if field(info, 'name') == ARGV[1] then
      last, pending = field(info, 'last-delivered-id'), tonumber(field(info, 'pending'))
      lag = field(info, 'lag')
    end
  end
  local unread = redis.call('XRANGE', KEYS[3], '(' .. last, '+')
  deliverable(unread)
  if lag and tonumber(lag) ~= #unread then
    -- Redis 7 counts the group's lag as entries added less entries read, so entries deleted before the
    -- group read them stay in it for good: set the read counter to what the stream holds.
    local added = tonumber(field(redis.call('XINFO', 'STREAM', KEYS[3]), 'entries-added'))
    redis.call('XGROUP', 'SETID', KEYS[3], ARGV[1], last, 'ENTRIESREAD', added - #unread)
  end
  if pending > 0 then
    for _, p in ipairs(redis.call('XPENDING', KEYS[3], ARGV[1], '-', '+', pending)) do
      if not held[p[1]] then deliverable(redis.call('XRANGE', KEYS[3], p[1], p[1])) end
    end
  end
end
local accounted = 0
for sample_id in pairs(live) do
  if redis.call('HGET', KEYS[1], sample_id) == ARGV[2] then accounted = accounted + 1 end
end
if accounted >= tonumber(redis.call('HGET', KEYS[2], ARGV[4]) or '0') then
  return {}
end
local vanished = {}
local states = redis.call('HGETALL', KEYS[1])
for i = 1, #states, 2 do
  if states[i + 1] == ARGV[2] and not live[states[i]] then
    redis.call('HSET', KEYS[1], states[i], ARGV[3])
    redis.call('XADD', KEYS[4], '*', 'type', ARGV[7], 'sample_id', states[i])
    table.insert(vanished, states[i])
  end
end
-- what is left queued is what the entries account for: a count that had drifted above it is set right,
-- so a drift alone does not make every later check read the whole hash again
redis.call('HSET', KEYS[2], ARGV[4], accounted)
if #vanished > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[5], #vanished)
  redis.call('HINCRBY', KEYS[2], ARGV[6], #vanished)
end
return vanished
"""


async def requeue_vanished(redis: aredis.Redis, names: Names, *,
                           held: Iterable[tuple[bytes, str]]) -> list[str]:
    """Move every `queued` sample that no deliverable MessageQueue entry and nothing `held` ((entry id,
    sample id) pairs in the trainer's hands) accounts for back to `generating` and ask the rollouter to
    generate it again, atomically; their ids."""
    keys = [names.sample_states, names.accounting, names.mq, names.rollouter_regenerate]
    args: list[bytes | str] = [TRAINER_GROUP, SampleState.QUEUED, SampleState.GENERATING,
                               AccountingField.QUEUED, AccountingField.GENERATING, AccountingField.VANISHED,
                               Regenerate.type]
    for entry_id, sample_id in held:
        args += [entry_id, sample_id]
    raw = await redis.eval(REQUEUE_VANISHED, len(keys), *keys, *args)  # type: ignore[misc]
    vanished = sorted(as_str(sample_id) for sample_id in raw)
    if vanished:
        log.warning("%d queued sample(s) had no entry left in %s (trimmed or deleted outside the run?); "
                    "the rollouter generates them again: %s", len(vanished), names.mq, vanished)
    return vanished
