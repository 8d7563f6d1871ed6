"""Tiny Llama model with Hugging Face parameter names, and its deterministic warm-up.

Where it sits: the trainer backend (`services/trainer/torch_backend.py`) trains this module,
and vLLM serves the same weights as `LlamaForCausalLM` from the directory `save_pretrained`
writes (safetensors + config.json + tokenizer). The implementation is ours rather than
`transformers`' so the trainer needs only torch; parameter names, RoPE (neox style) and
RMSNorm match HF/vLLM, so vLLM's `reload_weights` accepts what the trainer exports, and the
trainer's logprobs agree with vLLM's (tests check both).

`python -m rl.model build --out DIR` reproduces the starting checkpoint: random init, then a
short supervised warm-up on `rl.task` problems that stops once greedy exact-match accuracy on
a held-out set reaches `target_accuracy` (default 0.3), leaving headroom for RL. The build is
deterministic, so its result is cached per machine (`$DYNSCHED_CACHE_DIR`, default
`~/.cache/dynsched/models/<key>`; the key hashes both configs, this package's source and the torch
version): a second clone, or a test, copies it in a second instead of repeating the warm-up
(about 30 s on 2 quiet cores, minutes on busy ones).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rl.task import Problem, make_problems
from rl.threads import build_threads
from rl.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, CharTokenizer, save_hf_tokenizer

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
PROGRESS_INTERVAL_S = 5.0


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Llama hyper-parameters, named as in Hugging Face `config.json`."""

    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 3
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} not divisible by heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads {self.num_key_value_heads} must divide the heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_hf(self) -> dict[str, object]:
        """The `config.json` document vLLM and transformers read."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
            "bos_token_id": None,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
        }

    @classmethod
    def from_hf(cls, doc: dict[str, object]) -> ModelConfig:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: doc[k] for k in names if k in doc})  # type: ignore[arg-type]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, h, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        d = self.cfg.head_dim
        q = self.q_proj(x).view(b, t, -1, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, d).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        groups = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TinyLlama(nn.Module):
    """`LlamaForCausalLM` with untied embeddings; `forward(ids) -> logits` over right-padded ids."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        freqs = torch.outer(torch.arange(t, device=input_ids.device).float(), self.inv_freq)  # type: ignore[arg-type]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def init_model(cfg: ModelConfig, *, seed: int) -> TinyLlama:
    """Random init (normal, std 0.02; norms at 1), reproducible by seed."""
    gen = torch.Generator().manual_seed(seed)
    model = TinyLlama(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model


def pack_batch(
    prompts: list[list[int]], responses: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad prompt+response pairs for teacher forcing.

    Returns `(input_ids [B, T], targets [B, T], response_mask [B, T])` where position j predicts
    `targets[:, j]` (the next token) and the mask is 1 exactly where that target is a response
    token; targets elsewhere are PAD_ID.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs) - 1
    ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    targets = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    for row, (p, s) in enumerate(zip(prompts, seqs, strict=True)):
        ids[row, : len(s) - 1] = torch.tensor(s[:-1])
        targets[row, : len(s) - 1] = torch.tensor(s[1:])
        mask[row, len(p) - 1 : len(s) - 1] = 1.0
    return ids, targets, mask


def token_logprobs(model: TinyLlama, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability of each target token under `model` ([B, T])."""
    logits = model(ids).float()
    return torch.gather(F.log_softmax(logits, dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def greedy_accuracy(model: TinyLlama, problems: list[Problem], *, max_new_tokens: int = 5) -> float:
    """Exact-match accuracy of greedy decoding, batched by prompt length (no KV cache needed)."""
    tok = CharTokenizer()
    by_length: dict[int, list[Problem]] = {}
    for p in problems:
        by_length.setdefault(len(p.prompt), []).append(p)
    correct = 0
    for group in by_length.values():
        ids = torch.tensor([tok.encode(p.prompt) for p in group])
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        prompt_len = len(group[0].prompt)
        for p, row in zip(group, ids.tolist(), strict=True):
            correct += tok.decode(row[prompt_len:]) == p.answer
    return correct / max(len(problems), 1)


@dataclass(frozen=True, kw_only=True)
class WarmupConfig:
    """Supervised warm-up; it stops at the first evaluation reaching `target_accuracy`."""

    seed: int = 0
    max_steps: int = 2000
    batch_size: int = 128
    lr: float = 1e-3
    eval_every_steps: int = 25
    num_eval_problems: int = 200
    target_accuracy: float = 0.3


def warm_up(model: TinyLlama, cfg: WarmupConfig) -> dict[str, float]:
    """Teacher-forced cross-entropy on response tokens (answer + eos); returns the final stats."""
    tok = CharTokenizer()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    eval_set = make_problems(seed=cfg.seed + 1_000_003, count=cfg.num_eval_problems)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    acc, step, start = 0.0, 0, time.monotonic()
    logged_s = start
    for step in range(1, cfg.max_steps + 1):
        if time.monotonic() - logged_s >= PROGRESS_INTERVAL_S:  # a sign of life on a slow machine
            logged_s = time.monotonic()
            log.info("warm-up step %d (accuracy %.3f at the last evaluation, target %.2f), %.0f s",
                     step, acc, cfg.target_accuracy, logged_s - start)
        batch = make_problems(seed=rng.randrange(2**31), count=cfg.batch_size)
        ids, targets, mask = pack_batch(
            [tok.encode(p.prompt) for p in batch], [tok.encode(p.answer) + [EOS_ID] for p in batch]
        )
        loss = -(token_logprobs(model, ids, targets) * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % cfg.eval_every_steps == 0:
            model.eval()
            acc = greedy_accuracy(model, eval_set)
            model.train()
            log.info("warm-up step %d loss %.3f accuracy %.3f", step, loss.item(), acc)
            if acc >= cfg.target_accuracy:
                break
    return {"steps": float(step), "accuracy": acc, "seconds": time.monotonic() - start}


def save_pretrained(model: TinyLlama, out_dir: str | Path) -> None:
    """Write safetensors weights, config.json, generation_config.json and the tokenizer."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.cfg.to_hf(), indent=1))
    gen = {"eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": True}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1))
    save_hf_tokenizer(out)


def load_pretrained(model_dir: str | Path) -> TinyLlama:
    """Rebuild the model from a directory `save_pretrained` (or an exported version) wrote."""
    from safetensors.torch import load_file

    src = Path(model_dir)
    cfg = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    model = TinyLlama(cfg)
    model.load_state_dict(load_file(str(src / WEIGHTS_FILE)))
    return model


def cache_dir(model_cfg: ModelConfig, wcfg: WarmupConfig) -> Path:
    """Where the build of exactly these configs, this source and this torch lives on this machine."""
    digest = hashlib.sha256(json.dumps([asdict(model_cfg), asdict(wcfg), torch.__version__]).encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    root = Path(os.environ.get("DYNSCHED_CACHE_DIR") or Path.home() / ".cache" / "dynsched")
    return root / "models" / digest.hexdigest()[:16]


def build(
    out_dir: str | Path, *, model_cfg: ModelConfig | None = None, warmup: WarmupConfig | None = None,
    use_cache: bool = True,
) -> dict[str, float]:
    """Init + warm-up + save (or a copy of the cached build); the stats are also in `out_dir/warmup.json`."""
    wcfg = warmup or WarmupConfig()
    model_cfg = model_cfg or ModelConfig()
    cached = cache_dir(model_cfg, wcfg)
    if use_cache and (cached / "warmup.json").is_file():
        shutil.copytree(cached, out_dir, dirs_exist_ok=True)
        log.info("model copied from the cache %s (same configs, source and torch)", cached)
        return dict(json.loads((cached / "warmup.json").read_text()))
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(build_threads())
    model = init_model(model_cfg, seed=wcfg.seed)
    stats = warm_up(model, wcfg)
    save_pretrained(model, out_dir)
    (Path(out_dir) / "warmup.json").write_text(json.dumps({**stats, **asdict(wcfg)}, indent=1))
    if use_cache:
        _store(Path(out_dir), cached)
    return stats


def _store(built: Path, cached: Path) -> None:
    """Copy a finished build into the cache; written aside then renamed, so a reader never sees half."""
    staging: Path | None = None
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".building-"))
        shutil.copytree(built, staging, dirs_exist_ok=True)
        staging.rename(cached)
    except OSError as exc:  # another build stored it first, or no writable home: the cache is optional
        log.info("model not cached at %s: %s", cached, exc)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rl.model")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="init + supervised warm-up, saved as a HF-style model dir")
    b.add_argument("--out", required=True)
    b.add_argument("--seed", type=int, default=WarmupConfig.seed)
    b.add_argument("--target-accuracy", type=float, default=WarmupConfig.target_accuracy)
    b.add_argument("--max-steps", type=int, default=WarmupConfig.max_steps)
    b.add_argument("--no-cache", action="store_true", help="warm up again even if this build is cached")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    wcfg = WarmupConfig(seed=args.seed, target_accuracy=args.target_accuracy, max_steps=args.max_steps)
    stats = build(args.out, warmup=wcfg, use_cache=not args.no_cache)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
