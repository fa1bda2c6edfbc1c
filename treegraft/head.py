"""The target's output head, computed by us from the stock decoder's hidden states.

On a CPU, `F.linear(h, W)` with a tall vocabulary head ([V, hidden], V ~ 50k) and a
handful of rows is a poor fit for the BLAS kernels: measured on the 2-core AVX2
machine for SmolLM2 (V = 49,152, hidden = 576), 8 rows take 20 ms through
`F.linear` but 8.6 ms as `W @ h.T`, and one row 7.9 ms but 4.2 ms against a
transposed copy of W. Same arithmetic (a dot product per logit), different
loop order, so logits agree to float rounding, like any batched forward.

Used only where the model's logits are exactly `lm_head(h)` (no soft-capping or
scaling: the model types below) and on CPU; anything else runs the stock forward.
"""
from __future__ import annotations

import torch

PLAIN_HEAD_TYPES = {"llama", "mistral", "qwen2", "qwen3", "smollm3"}
TRANSPOSED_COPY_MAX_BYTES = 512 << 20  # a transposed copy of the head for single rows, if it is this small


class OutputHead:
    def __init__(self, model):
        lm_head = model.get_output_embeddings()
        self.weight = lm_head.weight  # [V, hidden]
        self.fast = (self.weight.device.type == "cpu" and getattr(lm_head, "bias", None) is None
                     and model.config.model_type in PLAIN_HEAD_TYPES)
        small = self.weight.numel() * self.weight.element_size() <= TRANSPOSED_COPY_MAX_BYTES
        self.weight_t = self.weight.detach().t().contiguous() if self.fast and small else None  # [hidden, V]

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [n, V] logits."""
        if hidden.shape[0] == 1 and self.weight_t is not None:
            return hidden @ self.weight_t
        return (self.weight @ hidden.T).T
