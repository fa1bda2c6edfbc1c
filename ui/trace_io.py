"""Loading a saved trace for replay: size-limited, JSON only (no pickle), checked against the schema."""
from __future__ import annotations

import json
from pathlib import Path

from treegraft.trace import TRACE_VERSION, TREE_FIELDS, GenerationResult, result_from_json

MAX_TRACE_BYTES = 32 * 1024 * 1024


class TraceError(ValueError):
    """The file is not a TreeGraft trace this version can replay; the message says why."""


def load_trace(path: Path) -> GenerationResult:
    size = path.stat().st_size
    if size > MAX_TRACE_BYTES:
        raise TraceError(f"trace file is {size / 1e6:.1f} MB; the limit is {MAX_TRACE_BYTES / 1e6:.0f} MB")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TraceError(f"not a JSON trace: {err}") from None
    return parse_trace(data)


def parse_trace(data) -> GenerationResult:
    if not isinstance(data, dict) or data.get("version") != TRACE_VERSION:
        raise TraceError(f"not a TreeGraft trace of version {TRACE_VERSION} (made by `generate --trace` or the app)")
    rounds = data.get("round_traces")
    if not isinstance(rounds, list) or not rounds:
        raise TraceError("the trace has no rounds")
    for i, r in enumerate(rounds):
        check_round(r, i)
    try:
        return result_from_json(data)
    except (KeyError, TypeError, ValueError) as err:
        raise TraceError(f"the trace does not match the schema: {type(err).__name__}: {err}") from None


def check_round(r, i: int) -> None:
    where = f"round {i}"
    if not isinstance(r, dict) or not isinstance(r.get("tree"), dict):
        raise TraceError(f"{where}: missing tree")
    tree = r["tree"]
    lengths = {f: len(tree.get(f, [])) if isinstance(tree.get(f), list) else -1 for f in TREE_FIELDS}
    n = lengths["token"]
    if n < 1 or any(v != n for v in lengths.values()):
        raise TraceError(f"{where}: tree fields must be lists of one length, got {lengths}")
    parents = tree["parent"]
    if parents[0] != -1 or any(not isinstance(p, int) or not 0 <= p < v for v, p in enumerate(parents) if v):
        raise TraceError(f"{where}: every node's parent must be an earlier node")
    path = r.get("accepted_path")
    if not isinstance(path, list) or not path or any(not isinstance(v, int) or not 0 <= v < n for v in path):
        raise TraceError(f"{where}: accepted_path must list node ids of the tree")
    if not isinstance(r.get("steps"), list):
        raise TraceError(f"{where}: missing steps")
