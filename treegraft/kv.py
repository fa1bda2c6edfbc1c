"""KV-cache and attention-mask helpers shared by the target and the mid drafter (stock HF models)."""
from __future__ import annotations

import time

import numpy as np
import torch
from transformers import DynamicCache


def keep_slots(cache: DynamicCache, keep: torch.Tensor) -> None:
    """Keep only the given sequence slots of every layer, in that order (index-select on the seq axis)."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
            layer.keys = layer.keys.index_select(-2, keep)  # [batch, kv_heads, kept, head_dim]
            layer.values = layer.values.index_select(-2, keep)


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
