"""`python -m treegraft {generate,distill,pairs}`: a thin shell over the engine."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import DEFAULT_MODELS_YAML, ConfigError, load_models_file, load_pair, resolve_path


def _distill(args) -> int:
    from .distill import DistillSettings, distill

    pair = load_pair(args.pair, args.models)
    out = Path(args.out) if args.out else resolve_path(pair.mid.path or "models/distilled-mid")
    s = DistillSettings(layers=args.layers, minutes=args.minutes, max_steps=args.max_steps, seed=args.seed,
                        lr=args.lr, batch=args.batch, seq_len=args.seq_len)
    distill(pair, out, s)
    return 0


def _pairs(args) -> int:
    for name, pair in load_models_file(args.models).pairs.items():
        print(f"{name:32s} target={pair.target.describe():45s} mid={pair.mid.describe()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m treegraft", description=__doc__)
    p.add_argument("--models", default=str(DEFAULT_MODELS_YAML), help="models.yaml to read pairs from")
    sub = p.add_subparsers(dest="command", required=True)

    from .generate_cli import add_generate_parser

    add_generate_parser(sub)

    d = sub.add_parser("distill", help="distil a small mid drafter from a pair's target")
    d.add_argument("--pair", default="default")
    d.add_argument("--out", default=None, help="output folder (default: the pair's mid path)")
    d.add_argument("--layers", type=int, default=4)
    d.add_argument("--minutes", type=float, default=45.0)
    d.add_argument("--max-steps", type=int, default=100_000)
    d.add_argument("--lr", type=float, default=6e-4)
    d.add_argument("--batch", type=int, default=8)
    d.add_argument("--seq-len", type=int, default=128)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=_distill)

    ls = sub.add_parser("pairs", help="list the pairs of models.yaml")
    ls.set_defaults(func=_pairs)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
