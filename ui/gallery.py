"""The offline gallery: recorded traces shipped with the app (ui/gallery/), loaded without any model.

`gallery.json` lists the entries (written by scripts/record_gallery.py); each trace file is an ordinary
trace (treegraft/trace.py, TRACE_VERSION) written compactly: floats rounded, no per-step scheduler
features, no separators' spaces. It loads through the same schema check as an uploaded trace.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from treegraft.trace import GenerationResult

from .trace_io import load_trace

GALLERY_DIR = Path(__file__).resolve().parent / "gallery"
MANIFEST = "gallery.json"
MAX_ENTRY_BYTES = 300 * 1024
FLOAT_DIGITS = 4  # significant digits kept in a gallery trace


@dataclass(frozen=True)
class Entry:
    name: str  # what the gallery lists, e.g. "chat: treegraft"
    file: str
    category: str
    method: str
    prompt: str  # the last user turn


def entries(folder: Path = GALLERY_DIR) -> list[Entry]:
    path = folder / MANIFEST
    if not path.is_file():
        return []
    return [Entry(**e) for e in json.loads(path.read_text())]


def load_entry(name: str, folder: Path = GALLERY_DIR) -> GenerationResult:
    entry = next((e for e in entries(folder) if e.name == name), None)
    if entry is None:
        raise KeyError(f"no gallery trace named '{name}'")
    return load_trace(folder / entry.file)


def _round_floats(x):
    if isinstance(x, float):
        return float(f"{x:.{FLOAT_DIGITS}g}")
    if isinstance(x, list):
        return [_round_floats(v) for v in x]
    if isinstance(x, dict):
        return {k: _round_floats(v) for k, v in x.items()}
    return x


def compact_json(result: GenerationResult) -> str:
    """The trace as compact JSON: floats to FLOAT_DIGITS significant digits, scheduler features dropped."""
    data = result.to_json()
    for r in data["round_traces"]:
        for s in r["steps"]:
            s.pop("features", None)
    return json.dumps(_round_floats(data), separators=(",", ":"), ensure_ascii=False)
