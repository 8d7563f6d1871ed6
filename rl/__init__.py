"""The real-training payload: a verifiable-reward task, a character tokenizer and a tiny model.

`rl.task` makes prompts and scores responses, `rl.tokenizer` maps text to ids (and writes the
same vocabulary as a Hugging Face fast tokenizer so vLLM can serve it), `rl.model` is a
minimal Llama implementation with Hugging Face parameter names plus the deterministic
supervised warm-up that produces the starting checkpoint (`python -m rl.model build --out DIR`).
Only `rl.model` needs torch; task and tokenizer are pure Python.
"""
