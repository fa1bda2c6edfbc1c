"""Models for the app: loaded lazily, once, shared by every browser session; which pairs can load here.

The app only ever names pairs from models.yaml: no user-supplied path or hub id
reaches `from_pretrained`.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass

import torch

from treegraft.config import DEFAULT_MODELS_YAML, PairConfig, load_models_file, resolve_path


@dataclass(frozen=True)
class PairStatus:
    name: str
    available: bool
    reason: str  # why not, or a short description


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def pair_status(pair: PairConfig) -> PairStatus:
    if pair.requires_gpu and not torch.cuda.is_available():
        return PairStatus(pair.name, False, "needs a CUDA GPU")
    for role, src in (("target", pair.target), ("mid", pair.mid)):
        if src.hub and offline():
            return PairStatus(pair.name, False, f"{role} weights come from the hub and this host is offline")
        if src.path and not resolve_path(src.path).exists():
            return PairStatus(pair.name, False, f"{role} folder {src.path} is missing")
        if src.gguf_package and importlib.util.find_spec(src.gguf_package) is None:
            return PairStatus(pair.name, False, f"pip package {src.gguf_package} is not installed")
    return PairStatus(pair.name, True, pair.description or "")


class Runtime:
    """One Engine per pair, created on first use; a lock per pair serialises generations on it."""

    def __init__(self, models_yaml=DEFAULT_MODELS_YAML, dtype: str | None = None):
        self.models_yaml = models_yaml
        self.dtype = dtype  # None: each pair's own setting (usually auto)
        self.pairs = load_models_file(models_yaml).pairs
        self._engines: dict[str, object] = {}
        self._load_lock = threading.Lock()
        self.locks: dict[str, threading.Lock] = {name: threading.Lock() for name in self.pairs}

    def statuses(self) -> list[PairStatus]:
        return [pair_status(p) for p in self.pairs.values()]

    def engine(self, name: str, progress=None):
        from treegraft.engine import Engine
        from treegraft.models import load_pair_models

        if name not in self.pairs:
            raise KeyError(f"unknown pair '{name}'")
        with self._load_lock:
            if name not in self._engines:
                status = pair_status(self.pairs[name])
                if not status.available:
                    raise RuntimeError(f"pair '{name}' cannot load here: {status.reason}")
                if progress is not None:
                    progress(0.1, desc=f"loading pair '{name}' (once, shared by all users)")
                self._engines[name] = Engine(load_pair_models(self.pairs[name], self.dtype))
            return self._engines[name]
