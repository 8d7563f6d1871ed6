"""No string literal names a phase, action, state, reason or hash field outside the modules that define them.

The vocabularies are the enums of `shared/vocab.py` (re-exported by `shared/schema.py`) and of
`shared/names.py`. Parsing every Python file with `ast`, a string constant equal to one of
their values is flagged where it stands for protocol vocabulary:

- an operand of a comparison (`x == "abort"`, `x in ("stop", "length")`);
- a keyword argument named phase, action, kind, state, status or finish_reason
  (`Command(action="abort")`; argparse's `action="store_true"` is no value of ours);
- a field or value argument of a Redis hash command (`hset(key, "status", "done")`,
  `hget(key, "version")`, `hmget(key, ["weights_version"])`, `hset(key, mapping={...})`);
- the action of a CommandClient call (`rpc.call(stream, "abort")`);
- the step of a weight push (`engine.transfer("start", ...)`).

Elsewhere (a dict key of a JSON summary, a docstring, a log message) a word like "version" is
just a word, so the check stays free of false positives.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import pytest

from shared import names, vocab
from tests.pyparse import parse

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("services", "shared", "core", "policies", "sim", "rl", "bench", "tools", "tests")
DEFINING_MODULES = {"shared/vocab.py", "shared/schema.py", "shared/names.py"}


def _values(*enums: type[StrEnum]) -> frozenset[str]:
    return frozenset(member.value for enum in enums for member in enum)


WORDS = _values(vocab.TrainerPhase, vocab.TrainerAction, vocab.CommandAction, vocab.ReplicaState,
                vocab.FinishReason, vocab.AuditKind, vocab.AuditPhase, vocab.PushStep, names.SampleState,
                names.RunStatus, names.AccountingField)
"""Phases, actions, states, reasons, kinds: never a literal in a comparison or a keyword argument."""
HASH_FIELDS = _values(names.RolloutStateField, names.TrainerStateField, names.RunStateField,
                      names.AccountingField)
"""Hash field names: never a literal in a Redis hash command."""
KEYWORDS = frozenset({"phase", "action", "kind", "state", "status", "finish_reason"})
HASH_COMMANDS = frozenset({"hset", "hget", "hmget", "hincrby", "hincrbyfloat", "hsetnx", "hdel", "hexists"})
COMMAND_SENDS = frozenset({"call", "send", "call_peers"})
"""CommandClient's methods: (stream, action, ...)."""
TRANSFERS = frozenset({"transfer", "_send"})
"""An engine's transfer and a SyncClient's _send: (step, ...)."""


def _strings(node: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of `node`, looking into tuple / list / set / dict literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            yield from _strings(element)
    elif isinstance(node, ast.Dict):
        for part in [*node.keys, *node.values]:
            if part is not None:
                yield from _strings(part)


def offending_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every vocabulary literal standing for protocol vocabulary in `source`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Compare):
            found += [(c.lineno, c.value) for part in [node.left, *node.comparators] for c in _strings(part)
                      if c.value in WORDS]
        elif isinstance(node, ast.Call):
            found += [(c.lineno, c.value) for kw in node.keywords if kw.arg in KEYWORDS
                      for c in _strings(kw.value) if c.value in WORDS]
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if method in HASH_COMMANDS:
                arguments = [*node.args[1:],
                             *(kw.value for kw in node.keywords if kw.arg in ("mapping", "keys"))]
                found += [(c.lineno, c.value) for arg in arguments for c in _strings(arg)
                          if c.value in HASH_FIELDS | WORDS]
            elif method in COMMAND_SENDS and len(node.args) >= 2:
                found += [(c.lineno, c.value) for c in _strings(node.args[1]) if c.value in WORDS]
            elif method in TRANSFERS and node.args:
                found += [(c.lineno, c.value) for c in _strings(node.args[0]) if c.value in WORDS]
    return sorted(found)


def python_files() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for package in SCANNED
                  for path in (ROOT / package).rglob("*.py"))


CHECKED = {path: offending_literals((ROOT / path).read_text()) for path in python_files()
           if path not in DEFINING_MODULES}
"""Parsed once, at collection."""


@pytest.mark.parametrize("path", sorted(CHECKED))
def test_no_literal_names_a_phase_action_state_or_hash_field(path: str) -> None:
    offences = CHECKED[path]
    assert not offences, f"{path}: use the enums of shared/vocab.py and shared/names.py, not {offences}"


def test_the_check_flags_comparisons_keywords_and_hash_fields_but_not_other_words() -> None:
    flagged = offending_literals('''
if event.phase == "weights_ready": pass
if reason in ("stop", "length"): pass
Command(action="abort")
redis.hset(key, "status", "done")
redis.hmget(key, ["weights_version"])
pipe.hset(key, mapping={"completed_steps": 1})
await rpc.call(stream, "set_active_replicas", value=2)
await engine.transfer("finish", {}, version=3)
''')
    expected = {"weights_ready", "stop", "length", "abort", "status", "done", "weights_version",
                "completed_steps",
                "set_active_replicas", "finish"}
    assert {word for _, word in flagged} == expected
    assert not offending_literals('''
parser.add_argument("--fresh", action="store_true")
summary = {"version": 3, "status": text}
log.info("abort %s", replica_id)
"""A docstring that says stop."""
''')
