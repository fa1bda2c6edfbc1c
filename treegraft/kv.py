"""KV-cache and attention-mask helpers shared by the target and the mid drafter (stock HF models)."""
from __future__ import annotations

import time

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers with room to grow: an append writes the new
    slots in place. (The stock layer concatenates, copying the whole cache in every layer of every forward: 4.5 ms
    of a one-token forward of the default target at 256 cached tokens on a 2-core CPU, more with longer chats.)
    Whatever replaces the views from outside (a reorder, a stock crop's view) is read back into a new buffer."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # [batch, kv_heads, capacity, head_dim] x 2
        self.mine: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)  # the views update() last set

    def _holds(self) -> bool:
        """The views are still the start of the buffers (compaction and crops keep them so)."""
        if self.buffers is None:
            return False
        if self.keys is self.mine[0] and self.values is self.mine[1]:  # the views this layer set (the hot path)
            return True
        return all(t.numel() == 0 or (t.data_ptr() == b.data_ptr() and t.stride() == b.stride())
                   for t, b in zip((self.keys, self.values), self.buffers))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values, n = self.room(key_states, value_states)
        need = n + key_states.shape[-2]
        keys[..., n:need, :] = key_states
        values[..., n:need, :] = value_states
        return self.extend(need)

    def room(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(keys buffer, values buffer [batch, kv_heads, capacity, head_dim], n): the buffers, grown where needed
        so that slots [n, n + m) are free to write, n the slots held (the new states [batch, kv_heads, m, head_dim]:
        only their shapes, dtype and device are read)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.keys.shape[-2] if self.keys.numel() else 0
        need = n + key_states.shape[-2]
        if not self._holds() or need > self.buffers[0].shape[-2] or self.buffers[0].shape[:2] != key_states.shape[:2]:
            capacity = need + max(need // 2, 128)  # amortised: a copy of the cache every ~need / 2 new slots
            grown = []
            for old, new in ((self.keys, key_states), (self.values, value_states)):
                buf = new.new_empty(*new.shape[:2], capacity, new.shape[-1])  # [batch, kv_heads, capacity, dim]
                if n:
                    buf[..., :n, :] = old
                grown.append(buf)
            self.buffers = tuple(grown)
        return *self.buffers, n

    def extend(self, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Hold the buffers' first `need` slots (written by `update` or by a fused forward) and return them."""
        keys, values = self.buffers
        self.keys, self.values = keys[..., :need, :], values[..., :need, :]
        self.mine = (self.keys, self.values)
        return self.keys, self.values


class GrowingCache(DynamicCache):
    """A `DynamicCache` of `GrowingLayer`s (one per decoder layer, made on its first update)."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    def layer(self, idx: int) -> GrowingLayer:
        """Layer `idx`, made (empty) if no update has reached it yet."""
        while len(self.layers) <= idx:
            self.layers.append(self.layer_class_to_replicate())
        return self.layers[idx]


def keep_slots(cache: DynamicCache, prefix: int, slots: list[int] = ()) -> None:
    """Keep every layer's first `prefix` slots, then the given slots (each >= prefix), in that order.

    Only the kept slots past the prefix move (a few rows, in place); the prefix is not copied: each layer keeps a
    view of its first prefix + len(slots) slots, after which a growing layer's next append writes in place. (An
    index-select of every kept slot copied the whole cache twice a round: ~3 ms of 30 layers at 256 tokens.)
    """
    n = prefix + len(slots)
    src = None if list(slots) == list(range(prefix, n)) else torch.tensor(list(slots), dtype=torch.long)
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
            if src is not None:
                src = src.to(layer.keys.device)
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
