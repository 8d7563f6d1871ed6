"""Torch GRPO backend: advantages, the clipped loss, learning on a toy, checkpoints, export."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402

pytest.importorskip("safetensors")

from bench.torch_toy import ToySample, ToyTrajectory, toy_trainer  # noqa: E402
from rl.model import ModelConfig, load_pretrained  # noqa: E402
from rl.tokenizer import CharTokenizer  # noqa: E402
from services.trainer.service import Trainer  # noqa: E402
from services.trainer.torch_backend import (  # noqa: E402
    TorchGRPOTrainer,
    clipped_surrogate,
    group_advantages,
)
from shared import weights  # noqa: E402
from shared.bus import Bus  # noqa: E402
from shared.names import Names  # noqa: E402
from shared.names import TrainerStateField as F  # noqa: E402
from shared.streams import connect  # noqa: E402
from shared.weight_transfer import SyncClient  # noqa: E402
from tests.stack import sim_config  # noqa: E402

TINY = ModelConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1
)
PROMPTS = ["012+345=", "900+99=", "050+050="]


def _trainer(tmp_path: Path, **overrides: float) -> TorchGRPOTrainer:
    return toy_trainer(tmp_path, TINY, **overrides)


def _target_prob(trainer: TorchGRPOTrainer, prompt: list[int], target: int) -> float:
    with torch.no_grad():
        logits = trainer.model(torch.tensor([prompt]))[0, -1]
    return float(torch.softmax(logits, -1)[target])


def _sample_group(
    trainer: TorchGRPOTrainer, prompt: list[int], target: int, n: int, gen: torch.Generator
) -> ToySample:
    """n one-token responses sampled from the trainer's own policy; reward 1 for `target`."""
    with torch.no_grad():
        logp = torch.log_softmax(trainer.model(torch.tensor([prompt]))[0, -1], -1)
    toks = torch.multinomial(logp.exp(), n, replacement=True, generator=gen).tolist()
    trajs = [
        ToyTrajectory(response_token_ids=[t], response_logprobs=[float(logp[t])], reward=float(t == target))
        for t in toks
    ]
    return ToySample(prompt_token_ids=prompt, trajectories=trajs)


def test_advantages_are_normalised_within_the_group_with_unbiased_std() -> None:
    # rewards 1,0,0,0: mean 0.25, unbiased std 0.5
    assert group_advantages([1.0, 0.0, 0.0, 0.0], eps=0.0) == pytest.approx([1.5, -0.5, -0.5, -0.5])
    adv = group_advantages([0.0, 1.0, 1.0], eps=1e-6)
    assert adv == pytest.approx([-2 / math.sqrt(3), 1 / math.sqrt(3), 1 / math.sqrt(3)], rel=1e-5)
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)


def test_all_equal_rewards_and_singletons_give_zero_advantage() -> None:
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.0, 0.0]) == [0.0, 0.0]
    assert group_advantages([1.0]) == [0.0]


def test_clipped_loss_pushes_positive_advantage_up_and_stops_past_the_clip() -> None:
    mask = torch.ones(1, 1)
    old = torch.zeros(1, 1)
    for adv_value, expected_sign in ((1.0, -1.0), (-1.0, 1.0)):
        logp = torch.zeros(1, 1, requires_grad=True)
        loss, clip_frac = clipped_surrogate(
            logp, old, torch.full((1, 1), adv_value), mask, clip_low=0.2, clip_high=0.2
        )
        loss.backward()
        assert loss.item() == pytest.approx(-adv_value)  # ratio 1: loss = -A
        assert math.copysign(1.0, logp.grad.item()) == expected_sign  # descent raises logp iff A > 0
        assert clip_frac.item() == 0.0
    # ratio e^0.5 > 1.2 with A > 0: clipped, constant in logp, zero gradient
    logp = torch.full((1, 1), 0.5, requires_grad=True)
    loss, clip_frac = clipped_surrogate(logp, old, torch.ones(1, 1), mask, clip_low=0.2, clip_high=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and clip_frac.item() == 1.0
    assert logp.grad.item() == 0.0


def test_masked_tokens_do_not_contribute() -> None:
    logp = torch.tensor([[0.0, 3.0]])
    loss, _ = clipped_surrogate(
        logp, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), clip_low=0.2, clip_high=0.2
    )
    assert loss.item() == pytest.approx(-1.0)


def test_a_few_grpo_steps_raise_the_reward_on_a_toy(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, lr=3e-2, lr_warmup_steps=1)
    tok = CharTokenizer()
    target = tok.encode("7")[0]
    prompts = [tok.encode(p) for p in PROMPTS]
    before = sum(_target_prob(trainer, p, target) for p in prompts) / len(prompts)
    gen = torch.Generator().manual_seed(0)
    rewards = []
    for _ in range(25):
        samples = [_sample_group(trainer, p, target, n=16, gen=gen) for p in prompts]
        stats = trainer.train_micro_step(samples)
        rewards.append(stats["reward/mean"])
        assert {
            "timing_s/reward",
            "timing_s/adv",
            "timing_s/update_actor",
            "loss",
            "grad_norm",
            "clip_frac",
        } <= stats.keys()
        assert "timing_s/old_log_prob" not in stats
    after = sum(_target_prob(trainer, p, target) for p in prompts) / len(prompts)
    assert before < 0.1 and after > 0.5, (before, after)
    assert sum(rewards[-5:]) > sum(rewards[:5])


def test_on_policy_ratio_is_one_and_stale_tokens_get_clipped(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    tok = CharTokenizer()
    prompt = tok.encode(PROMPTS[0])
    gen = torch.Generator().manual_seed(1)
    fresh = _sample_group(trainer, prompt, tok.encode("7")[0], n=8, gen=gen)
    stats = trainer.train_micro_step([fresh])
    assert stats["log_ratio/mean"] == pytest.approx(0.0, abs=1e-5)
    # behaviour logprobs far below the current ones (a very stale sample): ratio >> 1 + eps
    stale = ToySample(
        prompt_token_ids=prompt,
        trajectories=[ToyTrajectory(response_token_ids=[5], response_logprobs=[-20.0], reward=r)
                      for r in (1.0, 0.0)],
    )
    assert trainer.train_micro_step([stale])["clip_frac"] == pytest.approx(0.5)


def test_export_writes_hf_named_safetensors_loadable_as_the_model(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    path = trainer.export_weights(1)
    assert path is not None and weights.latest(tmp_path / "weights") == (1, Path(path))
    reloaded = load_pretrained(path)  # config.json + tokenizer rode along
    assert (Path(path) / "tokenizer.json").exists()
    names = set(reloaded.state_dict())
    assert "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" in names
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, reloaded.state_dict()[k])


def test_export_garbage_collects_old_versions(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, keep_weight_versions=2)
    for v in range(1, 5):
        trainer.export_weights(v)
    assert weights.versions(tmp_path / "weights") == [3, 4]


def test_checkpoint_roundtrip_restores_model_optimizer_and_version(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, lr=1e-2)
    tok = CharTokenizer()
    gen = torch.Generator().manual_seed(2)
    prompt = tok.encode(PROMPTS[1])
    trainer.train_micro_step([_sample_group(trainer, prompt, 9, n=8, gen=gen)])
    trainer.save_checkpoint(3)
    batch = [_sample_group(trainer, prompt, 9, n=8, gen=gen)]
    expected = trainer.train_micro_step(batch)
    expected_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    resumed = _trainer(tmp_path, lr=1e-2)
    assert resumed.resume_latest() == 3 and resumed.version == 3
    got = resumed.train_micro_step(batch)  # same batch after restore: same update, Adam moments included
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    for k, v in resumed.model.state_dict().items():
        assert torch.allclose(v, expected_state[k], atol=1e-6), k


def test_resume_without_checkpoints_returns_none_and_old_ones_are_pruned(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, keep_checkpoints=2)
    assert trainer.resume_latest() is None
    for v in (1, 2, 3):
        trainer.save_checkpoint(v)
    assert trainer.checkpoint_versions() == [2, 3]


def test_a_restart_restores_the_checkpoint_its_committed_pointer_names_not_a_newer_uncommitted_one(
        tmp_path: Path) -> None:
    # Saved every micro-step, its name committed with the progress: a crash after the save of step 3
    # but before its commit resumes from step 2's checkpoint, so step 3 is retrained from its start.
    trainer = _trainer(tmp_path, lr=1e-2)
    tok = CharTokenizer()
    gen = torch.Generator().manual_seed(3)
    prompt = tok.encode(PROMPTS[1])
    trainer.train_micro_step([_sample_group(trainer, prompt, 9, n=8, gen=gen)])
    committed = trainer.save_checkpoint(0, global_steps=2)
    committed_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train_micro_step([_sample_group(trainer, prompt, 9, n=8, gen=gen)])
    uncommitted = trainer.save_checkpoint(1, global_steps=3)
    assert committed != uncommitted and trainer.checkpoint_versions() == [0, 1]

    resumed = _trainer(tmp_path, lr=1e-2)
    assert resumed.resume_from(committed) == 0 and resumed.num_updates == 1
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, committed_state[k]), k
    assert resumed.resume_from("ckpt_g000009_v000009.pt") is None  # a missing one is reported


def test_keeping_fewer_than_two_checkpoints_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_checkpoints"):
        _trainer(tmp_path, keep_checkpoints=1)


def test_release_and_acquire_are_no_ops_on_cpu(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    trainer.release_gpu()
    trainer.acquire_gpu()
    assert next(trainer.model.parameters()).device.type == "cpu"


class _GlooReceiver(SyncClient):
    """The worker end of a gloo push without vLLM: joins the trainer's group, keeps what arrives."""

    def __init__(self, incarnation: str) -> None:
        super().__init__()
        self.replica_ids = ["standalone_0"]
        self.replica_world_size = 1
        self.incarnations = (incarnation,)
        self.joins = 0
        self.received: dict[str, torch.Tensor] = {}
        self.group: object = None

    def init_weight_transfer_engine(self, info: dict) -> None:
        from shared.gloo_transfer import GlooCommunicator

        self.group = GlooCommunicator(master_address=info["master_address"], master_port=info["master_port"],
                                      rank=info["rank_offset"], world_size=info["world_size"])
        self.joins += 1

    def start_weight_update(self) -> None:
        self.received = {}

    def update_weights(self, info: dict) -> None:
        for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"], strict=True):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            self.group.broadcast(tensor, src=0)  # type: ignore[attr-defined]
            self.received[name] = tensor

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        pass


def test_a_gloo_push_sends_every_param_and_reforms_the_group_only_when_a_replica_restarted(
        tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    trainer = _trainer(tmp_path)
    receiver = _GlooReceiver(incarnation="first")
    trainer.push_weights("gloo", receiver)
    params = dict(trainer.model.named_parameters())
    assert receiver.received.keys() == params.keys()
    assert all(torch.equal(receiver.received[k], p.detach()) for k, p in params.items())
    with torch.no_grad():
        trainer.model.lm_head.weight.add_(1.0)
    trainer.push_weights("gloo", receiver)  # same worker processes: the group is reused
    assert receiver.joins == 1
    assert torch.equal(receiver.received["lm_head.weight"], trainer.model.lm_head.weight.detach())
    receiver.incarnations = ("restarted",)
    trainer.push_weights("gloo", receiver)
    assert receiver.joins == 2


async def test_a_restarted_trainer_service_restores_the_checkpoint_named_in_its_committed_progress(
        tmp_path: Path, redis_server) -> None:
    # The commit names step 2's checkpoint; step 3's was saved but never committed (killed between).
    killed = _trainer(tmp_path, lr=1e-2)
    gen = torch.Generator().manual_seed(4)
    prompt = CharTokenizer().encode(PROMPTS[2])
    killed.train_micro_step([_sample_group(killed, prompt, 9, n=8, gen=gen)])
    committed = killed.save_checkpoint(0, global_steps=2)
    committed_state = {k: v.clone() for k, v in killed.model.state_dict().items()}
    killed.train_micro_step([_sample_group(killed, prompt, 9, n=8, gen=gen)])
    killed.save_checkpoint(0, global_steps=3)

    config = sim_config()
    bus = Bus(connect(redis_server.url), Names(config.run.namespace))
    await bus.redis.hset(bus.names.trainer_state, mapping={F.GLOBAL_STEPS: 2, F.VERSION: 0,
                                                           F.INITIAL_SYNC_DONE: 1, F.CHECKPOINT: committed})
    backend = _trainer(tmp_path, lr=1e-2)
    stop = asyncio.Event()
    task = asyncio.create_task(Trainer(bus=bus, config=config, backend=backend).run(stop))
    try:
        while backend.num_updates == 0:  # restored before it asks the controller for step 2
            assert not task.done()
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
        await bus.redis.aclose()
    assert backend.num_updates == 1
    for k, v in backend.model.state_dict().items():
        assert torch.equal(v, committed_state[k]), k
