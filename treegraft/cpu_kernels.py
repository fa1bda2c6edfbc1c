"""CPU paths for the small batches of speculative decoding, on the stock modules, chosen by measurement.

A verification feeds the target a few to a few dozen tokens. On a CPU, `F.linear(x, W)`
with a few rows may run BLAS's general matrix-matrix kernel, which can cost much more
than the 1-row matrix-vector kernel of plain decoding; computing the same products as
`W @ x.T` (the weight as the left operand), or against a transposed copy of W for one
row of the tall output head, is faster on some hosts, row counts and dtypes and slower
on others (measured: on a 2-core AVX2 machine in fp32, 2-8 body rows gain ~20%; on an
AVX512-BF16 machine in bf16, 8 rows are slower). So nothing is assumed: at load,
`use_cpu_kernels` times each path against the stock one, for one representative body
layer and for the head, at every row bucket (1, 2, 4, ... 64) in the model's dtype, and
routes each bucket to the faster path (`KernelTable`). Rows above the last bucket, and
any bucket where the alternative is not clearly faster, stay stock.

Same dot products in another loop order: results agree to float rounding, as any
batched forward does. No modeling code is changed; whatever the model does after its
head, such as soft-capping, still runs. Every method that runs the model uses them,
the Hugging Face peers and AR included. Pair setting `small_batch_linear` (on by
default; CPU only).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # row counts measured at load; a batch uses the smallest bucket >= its rows
MIN_GAIN = 0.9  # the alternative path must take at most 90% of the stock time to be chosen
TRANSPOSED_COPY_MAX_BYTES = 512 << 20  # the head's transposed copy (for 1 row), if it is this small


@dataclass
class KernelTable:
    """Per row bucket: use the alternative path (True) or the stock F.linear (False); ms measured for both."""

    body: dict[int, bool] = field(default_factory=dict)
    head: dict[int, bool] = field(default_factory=dict)
    ms: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)  # part -> rows -> (stock, alt)

    @staticmethod
    def bucket(rows: int) -> int | None:
        return next((b for b in BUCKETS if rows <= b), None)

    def use(self, part: str, rows: int) -> bool:
        b = self.bucket(rows)
        return b is not None and getattr(self, part).get(b, False)


def _weight_left(layer: torch.nn.Linear, x: torch.Tensor, rows: int) -> torch.Tensor:
    y = (layer.weight @ x.reshape(rows, -1).T).T  # [rows, out]
    if layer.bias is not None:
        y = y + layer.bias
    return y.reshape(*x.shape[:-1], -1)


def _transposed(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = x.reshape(1, -1) @ layer.weight_t  # [1, V]
    return (y if layer.bias is None else y + layer.bias).reshape(*x.shape[:-1], -1)


def body_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if not self.kernels.use("body", rows):
        return F.linear(x, self.weight, self.bias)
    return _weight_left(self, x, rows)


def head_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if not self.kernels.use("head", rows):
        return F.linear(x, self.weight, self.bias)
    if rows == 1 and self.weight_t is not None:
        return _transposed(self, x)
    return _weight_left(self, x, rows)


def _best_ms(fn, reps: int) -> float:
    fn()  # warm
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1000 * best


@torch.no_grad()
def measure(layer: torch.nn.Linear, part: str, reps: int = 3, clock=_best_ms) -> dict[int, tuple[float, float]]:
    """{rows: (stock ms, alternative ms)} at every bucket, in the layer's dtype."""
    out = {}
    for rows in BUCKETS:
        x = torch.randn(1, rows, layer.in_features, dtype=layer.weight.dtype)
        alt = (lambda: _transposed(layer, x)) if part == "head" and rows == 1 and layer.weight_t is not None \
            else (lambda: _weight_left(layer, x, rows))
        out[rows] = (clock(lambda: F.linear(x, layer.weight, layer.bias), reps), clock(alt, reps))
    return out


def choose(ms: dict[int, tuple[float, float]]) -> dict[int, bool]:
    return {rows: alt <= MIN_GAIN * stock for rows, (stock, alt) in ms.items()}


def use_cpu_kernels(model: torch.nn.Module, table: KernelTable | None = None) -> KernelTable:
    """Route the model's Linear layers and its output head through the faster path per row bucket, measured
    here (or as `table` says). Returns the table (also at `model.kernel_table`)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = head if isinstance(head, torch.nn.Linear) else None
    body = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    if head is not None:
        w = head.weight
        small = w.numel() * w.element_size() <= TRANSPOSED_COPY_MAX_BYTES
        head.weight_t = w.detach().t().contiguous() if small else None  # [hidden, V]
    if table is None:
        table = KernelTable()
        if body:
            table.ms["body"] = measure(max(body, key=lambda m: m.weight.numel()), "body")
            table.body = choose(table.ms["body"])
        if head is not None:
            table.ms["head"] = measure(head, "head")
            table.head = choose(table.ms["head"])
    for m in body:
        m.kernels = table
        m.forward = body_forward.__get__(m)
    if head is not None:
        head.kernels = table
        head.forward = head_forward.__get__(head)
        if not table.head.get(1, False):
            head.weight_t = None  # the copy is not used: do not keep it
    model.kernel_table = table
    return table
