"""Character-level tokenizer shared by our code and vLLM.

One token per character of the task alphabet (digits, '+', '='), plus pad/eos/unk and unused
slots up to `VOCAB_SIZE`. `CharTokenizer` is the pure-Python form the rollouter and trainer
use; `save_hf_tokenizer` writes the same vocabulary as a Hugging Face *fast* tokenizer
(`tokenizer.json` + `tokenizer_config.json`) into a model directory so vLLM loads it with
`AutoTokenizer` and stops on `<eos>`. Both forms give identical ids (tests check it when
`tokenizers` is installed).
"""

from __future__ import annotations

import json
from pathlib import Path

PAD = "<pad>"
EOS = "<eos>"
UNK = "<unk>"
ALPHABET = "0123456789+="
VOCAB_SIZE = 32
"""Padded to a multiple of 16: kernels and the lm_head prefer round sizes."""

SPECIALS = (PAD, EOS, UNK)
TOKENS: tuple[str, ...] = (
    *SPECIALS,
    *ALPHABET,
    *(f"<unused_{i}>" for i in range(VOCAB_SIZE - len(SPECIALS) - len(ALPHABET))),
)
PAD_ID = TOKENS.index(PAD)
EOS_ID = TOKENS.index(EOS)
UNK_ID = TOKENS.index(UNK)


class CharTokenizer:
    """Maps task text to token ids and back; unknown characters become `<unk>`."""

    pad_token_id = PAD_ID
    eos_token_id = EOS_ID
    vocab_size = VOCAB_SIZE

    def __init__(self) -> None:
        self._ids = {tok: i for i, tok in enumerate(TOKENS)}

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of `text` (no special tokens added)."""
        return [self._ids.get(ch, UNK_ID) for ch in text]

    def decode(self, ids: list[int], *, stop_at_eos: bool = True) -> str:
        """Text of `ids`; special tokens are dropped, and by default decoding stops at eos."""
        out: list[str] = []
        for i in ids:
            if i == EOS_ID and stop_at_eos:
                break
            if 0 <= i < len(TOKENS) and TOKENS[i] in ALPHABET:
                out.append(TOKENS[i])
        return "".join(out)


def hf_tokenizer_json() -> dict[str, object]:
    """The `tokenizer.json` document: WordLevel over single characters, fused on decode."""
    added = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, tok in enumerate(TOKENS)
        if tok.startswith("<")
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": "."},
            "behavior": "Isolated",
            "invert": False,
        },
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": {tok: i for i, tok in enumerate(TOKENS)}, "unk_token": UNK},
    }


def save_hf_tokenizer(model_dir: str | Path) -> None:
    """Write the fast-tokenizer files into `model_dir` (created if missing)."""
    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(hf_tokenizer_json(), indent=1))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": PAD,
        "eos_token": EOS,
        "unk_token": UNK,
        "model_max_length": 64,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    special = {"pad_token": PAD, "eos_token": EOS, "unk_token": UNK}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
