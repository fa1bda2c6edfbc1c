"""KV-cache and attention-mask helpers shared by the target and the mid drafter (stock HF models)."""
from __future__ import annotations

import time

import numpy as np
import torch
from transformers import DynamicCache


def keep_slots(cache: DynamicCache, prefix: int, slots: list[int] = ()) -> None:
    """Keep every layer's first `prefix` slots, then the given slots (each >= prefix), in that order.

    Only the kept slots past the prefix are moved (a few rows, in place); the prefix is not copied: each layer
    keeps a view of its first prefix + len(slots) slots, which the next forward's append copies anyway. (An
    index-select of every kept slot copied the whole cache twice a round: ~3 ms of 30 layers at 256 tokens.)
    """
    n = prefix + len(slots)
    moved = list(slots) != list(range(prefix, n))
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
            if moved:
                src = torch.tensor(list(slots), dtype=torch.long, device=layer.keys.device)
                for part in (layer.keys, layer.values):  # [batch, kv_heads, slots, head_dim]
                    part[..., prefix:n, :] = part.index_select(-2, src)  # gathered first: sources may overlap
            layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]


def additive_mask(visible: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[n, L + n] bool visibility -> [1, 1, n, L + n] float mask (0 visible, dtype-min hidden)."""
    vis = torch.from_numpy(visible).to(device)
    mask = torch.zeros(vis.shape, dtype=dtype, device=device)
    mask.masked_fill_(~vis, torch.finfo(dtype).min)
    return mask[None, None]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device):
    """perf_counter that waits for the device first, so GPU timings are real."""
    sync(device)
    return time.perf_counter()


class Stopwatch:
    """Lap times at a component's edges: `lap()` returns the seconds since the previous lap (or start)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start = self.last = timed(device)

    def lap(self) -> float:
        now = timed(self.device)
        dt, self.last = now - self.last, now
        return dt

    def total(self) -> float:
        return timed(self.device) - self.start
