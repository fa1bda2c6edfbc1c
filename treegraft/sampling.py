"""Turning target logits into the distribution a user asked for (temperature, top-k, top-p)."""
from __future__ import annotations

import torch

from .config import GenerationConfig


def processed_probs(logits: torch.Tensor, gen: GenerationConfig) -> torch.Tensor:
    """[n, vocab] logits -> [n, vocab] probabilities; temperature must be > 0."""
    x = logits.float() / gen.temperature
    if gen.top_k and gen.top_k < x.shape[-1]:
        kth = x.topk(gen.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if gen.top_p < 1.0:
        sorted_x, idx = x.sort(dim=-1, descending=True)
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop = cum - sorted_x.softmax(-1) >= gen.top_p  # keep the smallest prefix reaching top_p
        x = x.scatter(-1, idx, sorted_x.masked_fill(drop, float("-inf")))
    return x.softmax(-1)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a [vocab] distribution."""
    return int(torch.multinomial(probs, 1, generator=generator))
