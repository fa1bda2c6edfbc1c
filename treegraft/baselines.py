"""Peers a user would pick instead, run through Hugging Face's own `generate` on the same models:
`hf-pld` (prompt lookup decoding) and `hf-assisted` (assisted generation with the mid as assistant).
They report wall time and tokens only (HF does not expose per-round acceptance)."""
from __future__ import annotations

import torch

from .config import ConfigError, GenerationConfig
from .kv import timed

PLD_TOKENS = 10


@torch.no_grad()
def hf_generate(pair, prompt_ids: list[int], name: str, gen: GenerationConfig, seed: int = 0) -> tuple[list[int], float]:
    """(new tokens, wall seconds) of Hugging Face generate with the peer's setting."""
    model = pair.target
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([prompt_ids], device=device)
    kwargs = dict(max_new_tokens=gen.max_new_tokens, do_sample=not gen.greedy,
                  attention_mask=torch.ones_like(ids), pad_token_id=pair.tokenizer.pad_token_id
                  if pair.tokenizer.pad_token_id is not None else pair.tokenizer.eos_token_id)
    if not gen.greedy:
        kwargs.update(temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k or None)
        torch.manual_seed(seed)
    if name == "hf-pld":
        kwargs["prompt_lookup_num_tokens"] = PLD_TOKENS
    elif name == "hf-assisted":
        if pair.config.mid.kind != "lm":
            raise ConfigError(f"hf-assisted needs a causal-LM mid as Hugging Face's assistant model; pair "
                              f"'{pair.config.name}' has a draft head ({pair.config.mid.describe()}). Use a pair "
                              f"with an LM mid, e.g. --pair smollm2-lm")
        kwargs["assistant_model"] = pair.mid
    else:
        raise ValueError(f"not a Hugging Face peer: {name}")
    t0 = timed(device)
    out = model.generate(ids, **kwargs)
    wall = timed(device) - t0
    return out[0, len(prompt_ids):].tolist(), wall
