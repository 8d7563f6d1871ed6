"""The addition task and the character tokenizer: determinism, reward, and vLLM-compatible ids."""

from __future__ import annotations

import importlib.util

import pytest

from rl.task import MAX_OPERAND, MIN_OPERAND, make_problems, parse_prompt, problem_at, reward
from rl.tokenizer import EOS_ID, VOCAB_SIZE, CharTokenizer, save_hf_tokenizer


def test_same_seed_gives_same_problems_and_other_seed_differs() -> None:
    assert make_problems(seed=7, count=50) == make_problems(seed=7, count=50)
    assert make_problems(seed=7, count=50) != make_problems(seed=8, count=50)


def test_problem_at_is_random_access_and_deterministic() -> None:
    assert problem_at(seed=3, index=41) == problem_at(seed=3, index=41)
    assert problem_at(seed=3, index=41) != problem_at(seed=3, index=42)


def test_problems_are_fixed_width_sums_of_two_or_three_digit_numbers() -> None:
    for p in make_problems(seed=0, count=500):
        a, b = p.prompt[:-1].split("+")
        assert len(a) == len(b) == 3 and len(p.answer) == 4
        assert MIN_OPERAND <= int(a) <= MAX_OPERAND and MIN_OPERAND <= int(b) <= MAX_OPERAND
        assert int(p.answer) == int(a) + int(b)
        assert parse_prompt(p.prompt) == p


def test_parse_prompt_rebuilds_the_padded_answer() -> None:
    assert parse_prompt("012+345=").answer == "0357"
    assert parse_prompt("999+999=").answer == "1998"


def test_parse_prompt_rejects_malformed_text() -> None:
    with pytest.raises(ValueError, match="a\\+b="):
        parse_prompt("12-3=")
    with pytest.raises(ValueError, match="end with"):
        parse_prompt("12+3")


def test_reward_is_exact_match_ignoring_surrounding_whitespace() -> None:
    assert reward("357", "357") == 1.0
    assert reward(" 357\n", "357") == 1.0
    assert reward("358", "357") == 0.0
    assert reward("3570", "357") == 0.0
    assert reward("", "357") == 0.0


def test_partial_credit_is_below_one_and_off_by_default() -> None:
    assert reward("358", "357", partial_credit=True) == pytest.approx(0.5 * 2 / 3)
    assert reward("35", "357", partial_credit=True) == 0.0
    assert reward("357", "357", partial_credit=True) == 1.0


def test_tokenizer_roundtrips_task_text_and_stops_at_eos() -> None:
    tok = CharTokenizer()
    ids = tok.encode("12+345=357")
    assert len(ids) == 10 and max(ids) < VOCAB_SIZE
    assert tok.decode(ids) == "12+345=357"
    assert tok.decode(tok.encode("357") + [EOS_ID] + tok.encode("9")) == "357"
    assert tok.decode(tok.encode("357") + [EOS_ID] + tok.encode("9"), stop_at_eos=False) == "3579"


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None, reason="tokenizers not installed")
def test_hf_fast_tokenizer_gives_the_same_ids(tmp_path) -> None:
    from tokenizers import Tokenizer

    save_hf_tokenizer(tmp_path)
    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "907+85=992"
    assert hf.encode(text, add_special_tokens=False).ids == CharTokenizer().encode(text)
    assert hf.token_to_id("<eos>") == EOS_ID
    assert hf.decode(CharTokenizer().encode(text)) == text
