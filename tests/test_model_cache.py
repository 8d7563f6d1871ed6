"""`python -m rl.model build` is deterministic, so a second build of the same configs and source on the
same machine is a copy from the cache, byte for byte the first one."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rl.model import ModelConfig, WarmupConfig, build, cache_dir  # noqa: E402

TINY = ModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2)
SHORT = WarmupConfig(max_steps=2, eval_every_steps=1, num_eval_problems=4, batch_size=4, target_accuracy=1.0)


def test_a_second_build_of_the_same_model_is_the_cached_copy(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNSCHED_CACHE_DIR", str(tmp_path / "cache"))
    first = build(tmp_path / "first", model_cfg=TINY, warmup=SHORT)
    assert (cache_dir(TINY, SHORT) / "model.safetensors").is_file()
    second = build(tmp_path / "second", model_cfg=TINY, warmup=SHORT)
    assert (second["steps"], second["accuracy"]) == (first["steps"], first["accuracy"])
    for name in ("model.safetensors", "config.json", "warmup.json"):
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes()


def test_another_warm_up_config_is_another_cache_entry(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNSCHED_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_dir(TINY, SHORT) != cache_dir(TINY, WarmupConfig(max_steps=3, eval_every_steps=1))
    build(tmp_path / "uncached", model_cfg=TINY, warmup=SHORT, use_cache=False)
    assert not cache_dir(TINY, SHORT).exists()
