"""Models for the app: loaded lazily, once, shared by every browser session; which pairs can load here; and the
one thread every engine call of the app runs on.

The app only ever names pairs from models.yaml: no user-supplied path or hub id
reaches `from_pretrained`.

One engine thread. torch's intra-op threads on a CPU are an OpenMP team per thread
that runs a parallel region, and a forward runs ~200 of them (one per product).
Once two threads have run one, libgomp manages more threads than the host has
cores and stops spinning between regions, so each region waits for its worker to
wake. On the 2-core Zen 4 a verification took 47.6 ms on a second thread against
30-33 ms on the first, and the app's live run read ~1.8x its time per token
(`docs/app.md`). So every engine call of the app (loading a pair, the warm-up, the
live run, the timed runs) goes to one long-lived thread, `on_engine_thread`; being
one thread, it also runs one generation at a time, in the order they came.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from treegraft.config import DEFAULT_MODELS_YAML, PairConfig, load_models_file, resolve_path


ENGINE_THREAD_NAME = "treegraft-engine"
_engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=ENGINE_THREAD_NAME)


def on_engine_thread(fn, *args, **kwargs) -> Future:
    """Run `fn(*args, **kwargs)` on the app's one engine thread (queued behind the calls before it)."""
    return _engine_thread.submit(fn, *args, **kwargs)


def close_engine_thread() -> None:
    """End the engine thread once its queued calls are done; the next call starts a new one. A process that goes on
    running torch on another thread afterwards (the test suite, after a module's app) then has one OpenMP team again."""
    global _engine_thread
    old, _engine_thread = _engine_thread, ThreadPoolExecutor(max_workers=1, thread_name_prefix=ENGINE_THREAD_NAME)
    old.shutdown(wait=True)


def engine_call(fn, *args, **kwargs):
    """`fn`'s result, computed on the engine thread (directly when already on it); its exception raised here."""
    if threading.current_thread().name.startswith(ENGINE_THREAD_NAME):
        return fn(*args, **kwargs)
    return on_engine_thread(fn, *args, **kwargs).result()


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
    """One Engine per pair, created on first use, on the engine thread (which serialises generations on it)."""

    def __init__(self, models_yaml=DEFAULT_MODELS_YAML, dtype: str | None = None):
        self.models_yaml = models_yaml
        self.dtype = dtype  # None: each pair's own setting (usually auto)
        self.pairs = load_models_file(models_yaml).pairs
        self._engines: dict[str, object] = {}
        self._load_lock = threading.Lock()

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
                self._engines[name] = engine_call(lambda: Engine(load_pair_models(self.pairs[name], self.dtype)))
            return self._engines[name]
