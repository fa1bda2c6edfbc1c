"""Faster CPU paths for the small batches of speculative decoding, on the stock modules.

A verification feeds the target 2-8 tokens. On a CPU, `F.linear(x, W)` with a few
rows runs BLAS's general matrix-matrix kernel, which on the 2-core AVX2 machine
costs much more than the 1-row matrix-vector kernel of plain decoding: a
SmolLM2-135M forward takes ~52 ms for 1 token but ~82 ms for 2. Computing the same
products as `W @ x.T` (the weight as the left operand) costs ~66 ms for 2 tokens,
~68 for 4 and ~88 for 8 (vs ~86 and ~95 stock); from ~12 rows on the stock kernel
wins. The tall output head ([V, hidden], V = 49,152) gains at any row count: 8 rows
take 20 ms through `F.linear` but 8.6 ms as `W @ x.T`, and one row 7.9 ms but 4.2 ms
against a transposed copy of W. Same dot products in another loop order: results
agree to float rounding, as any batched forward does.

`use_cpu_kernels` sets these forwards on the `nn.Linear` modules of a loaded model
(no modeling code is changed; whatever the model does after its head, such as
soft-capping, still runs). Body layers keep the stock path for 1 row, so plain
decoding's body is untouched. Every method that runs the model uses them, the
Hugging Face peers and AR included. Pair setting `small_batch_linear` (on by
default; CPU only).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_ROWS = 8  # measured crossover for body layers: at 12 rows the stock kernel is as fast
TRANSPOSED_COPY_MAX_BYTES = 512 << 20  # the head's transposed copy (for 1 row), if it is this small


def _weight_left(layer: torch.nn.Linear, x: torch.Tensor, rows: int) -> torch.Tensor:
    y = (layer.weight @ x.reshape(rows, -1).T).T  # [rows, out]
    if layer.bias is not None:
        y = y + layer.bias
    return y.reshape(*x.shape[:-1], -1)


def weight_left_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if not 2 <= rows <= MAX_ROWS:
        return F.linear(x, self.weight, self.bias)
    return _weight_left(self, x, rows)


def head_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if rows == 1 and self.weight_t is not None:
        y = x.reshape(1, -1) @ self.weight_t  # [1, V]
        return (y if self.bias is None else y + self.bias).reshape(*x.shape[:-1], -1)
    return _weight_left(self, x, rows)


def use_cpu_kernels(model: torch.nn.Module) -> int:
    """Route the model's Linear layers (and its output head) through the paths above; returns how many."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        m.forward = weight_left_forward.__get__(m)
    if isinstance(head, torch.nn.Linear):
        w = head.weight
        small = w.numel() * w.element_size() <= TRANSPOSED_COPY_MAX_BYTES
        head.weight_t = w.detach().t().contiguous() if small else None  # [hidden, V]
        head.forward = head_forward.__get__(head)
    return len(linears)
