"""Verifiable-reward task: multi-digit addition, in the spirit of DAPO-Math.

A prompt is ``"a+b="`` with 2- or 3-digit operands written zero-padded to 3 digits, and the
reference answer is the sum zero-padded to 4 digits (``"012+345="`` -> ``"0357"``). Fixed
widths keep digit positions aligned, which is what lets a tiny model learn the task in a
minute of CPU warm-up.
The rollouter feeds prompts from `make_problems` (deterministic by seed, so a prompt id maps
to one problem across restarts) and scores finished responses with `reward` (exact match,
1.0 or 0.0). Partial credit exists for experiments but is off by default: the spec's reward
curve is an exact-match accuracy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MIN_OPERAND = 10
MAX_OPERAND = 999
OPERAND_DIGITS = 3
ANSWER_DIGITS = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One addition problem."""

    prompt: str
    """The text the model continues, e.g. ``"012+345="``."""
    answer: str
    """The exact expected response text, e.g. ``"0357"``."""


def make_problem(rng: random.Random) -> Problem:
    """Draw one problem; operand widths (2 or 3 digits) are drawn first so both are common."""
    a = _operand(rng)
    b = _operand(rng)
    return _problem(a, b)


def _problem(a: int, b: int) -> Problem:
    return Problem(
        prompt=f"{a:0{OPERAND_DIGITS}d}+{b:0{OPERAND_DIGITS}d}=", answer=f"{a + b:0{ANSWER_DIGITS}d}"
    )


def _operand(rng: random.Random) -> int:
    if rng.random() < 0.5:
        return rng.randint(MIN_OPERAND, 99)
    return rng.randint(100, MAX_OPERAND)


def make_problems(*, seed: int, count: int) -> list[Problem]:
    """`count` problems drawn from a generator seeded with `seed` (same seed, same list)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(count)]


def problem_at(*, seed: int, index: int) -> Problem:
    """The `index`-th problem of the stream for `seed`, computable without the ones before it.

    Lets a restarted rollouter re-create prompt number `index` from its id alone.
    """
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    return make_problem(random.Random(f"{seed}:{index}"))


def parse_prompt(prompt: str) -> Problem:
    """Rebuild a Problem from its prompt text (``"a+b="``); ValueError if malformed."""
    if not prompt.endswith("="):
        raise ValueError(f"prompt must end with '=', got {prompt!r}")
    left, sep, right = prompt[:-1].partition("+")
    if not sep or not left.isdigit() or not right.isdigit():
        raise ValueError(f"prompt must look like 'a+b=', got {prompt!r}")
    return _problem(int(left), int(right))


def reward(response_text: str, answer: str, *, partial_credit: bool = False) -> float:
    """1.0 when the response (surrounding whitespace ignored) equals the answer, else 0.0.

    With `partial_credit`, a wrong response of the right length earns 0.5 x the fraction of
    digits in the right place (capped below 1.0, so only an exact answer scores 1.0).
    """
    text = response_text.strip()
    if text == answer:
        return 1.0
    if not partial_credit or len(text) != len(answer):
        return 0.0
    matches = sum(1 for got, want in zip(text, answer, strict=True) if got == want)
    return 0.5 * matches / len(answer)
