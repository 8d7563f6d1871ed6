"""Where prompts come from and how responses are scored.

Where it sits: the rollouter's feed asks `prompt_at(index)` for sample number
`index` (deterministic, so a restarted rollouter re-creates the same prompt
from the sample id alone) and scores finished trajectories with `reward`.

- `SimPrompts`: synthetic token ids, sample k's prompt as long as the planner's (and the sim
  engine's) prompt k (`sim.model.Workload`), so the sim trainer trains the planner's tokens; the
  reward is a Bernoulli draw whose success probability rises with the weight version, a stand-in
  learning curve that lets sim runs show a reward curve.
- `AdditionPrompts`: the real task of `rl.task` with the local character
  tokenizer; exact-match reward on the decoded response.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from typing import Protocol

from shared.config import Config


class PromptSource(Protocol):
    def prompt_at(self, index: int) -> tuple[list[int], str]:
        """(prompt token ids, answer) of sample number `index`."""
        ...

    def reward(self, *, response_token_ids: list[int], answer: str, request_id: str,
               version: int) -> float: ...


class SimPrompts:
    def __init__(self, *, prompt_length: int, seed: int, prompt_lengths: Sequence[int] = ()) -> None:
        self.prompt_length = prompt_length
        self.prompt_lengths = prompt_lengths
        """Sample k's prompt length (the planner's draw); past its end, `prompt_length`."""
        self.seed = seed

    def prompt_at(self, index: int) -> tuple[list[int], str]:
        rng = random.Random(f"{self.seed}:{index}")
        length = self.prompt_lengths[index] if 0 <= index < len(self.prompt_lengths) else self.prompt_length
        return [rng.randrange(3, 1000) for _ in range(length)], ""

    def reward(self, *, response_token_ids: list[int], answer: str, request_id: str, version: int) -> float:
        success_p = min(0.9, 0.2 + 0.05 * version)
        draw = random.Random(zlib.crc32(request_id.encode()) ^ self.seed).random()
        return 1.0 if draw < success_p else 0.0


class AdditionPrompts:
    def __init__(self, *, seed: int) -> None:
        from rl.task import problem_at, reward
        from rl.tokenizer import CharTokenizer

        self._problem_at = problem_at
        self._reward = reward
        self.tokenizer = CharTokenizer()
        self.seed = seed

    def prompt_at(self, index: int) -> tuple[list[int], str]:
        problem = self._problem_at(seed=self.seed, index=index)
        return self.tokenizer.encode(problem.prompt), problem.answer

    def reward(self, *, response_token_ids: list[int], answer: str, request_id: str, version: int) -> float:
        return self._reward(self.tokenizer.decode(response_token_ids), answer)


def build_prompt_source(config: Config) -> PromptSource:
    if config.data.task == "addition":
        return AdditionPrompts(seed=config.run.seed)
    from sim.model import Workload  # the sim backends share the planner's draw (numpy: only when asked for)

    return SimPrompts(prompt_length=config.data.prompt_length, seed=config.run.seed,
                      prompt_lengths=Workload.from_config(config).prompt)
