"""`python -m treegraft generate`: one prompt, one method, JSON or text out."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .config import ConfigError, load_pair, with_overrides
from .methods import METHODS, MethodSpec, parse_schedule


def add_generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate with one method and print the result")
    g.add_argument("--pair", default="default")
    g.add_argument("--method", default="treegraft", choices=METHODS)
    g.add_argument("--schedule", default=None, help="the fixed method's schedule, e.g. 1,0,1,0,1")
    g.add_argument("--no-eg", action="store_true", help="ablation: mid steps use only N_k (SPEC 2.1)")
    g.add_argument("--no-nd", action="store_true", help="ablation: mid steps overwrite subtrees (SPEC 2.2)")
    g.add_argument("--max-new-tokens", type=int, default=None)
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None, help="sampling top-k (0: off)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--depth", type=int, default=None, help="D, draft steps per round")
    g.add_argument("--width", type=int, default=None, help="W, frontier width")
    g.add_argument("--draft-top-k", type=int, default=None, help="K, children per frontier node")
    g.add_argument("--budget", type=int, default=None, help="B_ver, nodes verified per round")
    g.add_argument("--adaptive-budget", choices=["on", "off"], default=None,
                   help="verify only the nodes that pay for their time (default: the pair's setting)")
    g.add_argument("--scores", choices=["calibrated", "paper"], default=None,
                   help="a node's p: learned acceptance from both drafters' scores, or the last drafter's own "
                        "(the paper's rule; default: the pair's setting)")
    g.add_argument("--mid-gate", choices=["yield", "off"], default=None,
                   help="treegraft's step 1: a mid call while this request's calls measured a gain (yield), or the "
                        "learned scheduler at every step (off, the paper; default: the pair's setting)")
    g.add_argument("--mid-lead", type=int, default=None,
                   help="with --mid-gate yield: a call round's first N steps are the mid's (default: the pair's setting)")
    g.add_argument("--depth-gate", choices=["yield", "off"], default=None,
                   help="how many of the D steps a round takes: the depth whose steps paid for their time in this "
                        "request (yield), or always D (off, the paper; default: the pair's setting)")
    g.add_argument("--mid-levels", type=int, default=None,
                   help="a mid step scores only nodes with fewer unevaluated ancestors than this")
    g.add_argument("--corpus", choices=["on", "off"], default=None,
                   help="the n-gram drafter also reads the pair's corpus of the target's earlier answers "
                        "(default: on where the pair has one)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", default=None)
    src.add_argument("--prompt-file", default=None)
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--trace", default=None, help="also write the full per-round trace (JSON) to this file")
    g.set_defaults(func=run_generate)


def on_off(value: str | None) -> bool | None:
    return None if value is None else value == "on"


def settings_from_args(pair, args):
    drafting = with_overrides(pair.drafting, depth=args.depth, width=args.width, top_k=args.draft_top_k,
                              budget=args.budget, adaptive_budget=on_off(args.adaptive_budget),
                              scores=args.scores, mid_levels=args.mid_levels, corpus=on_off(args.corpus),
                              mid_gate=args.mid_gate, mid_lead=args.mid_lead, depth_gate=args.depth_gate,
                              schedule=parse_schedule(args.schedule) if args.schedule else None)
    gen = with_overrides(pair.generation, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_p=args.top_p, top_k=args.top_k)
    return drafting, gen


def read_prompt(args) -> str:
    if args.prompt_file:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise ConfigError(f"prompt file not found: {path}")
        try:
            return path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"prompt file {path} is not valid UTF-8 ({err})") from None
    return args.prompt


def run_generate(args) -> int:
    from .engine import Engine
    from .models import load_pair_models
    from .trace import dumps

    pair = load_pair(args.pair, args.models)
    drafting, gen = settings_from_args(pair, args)
    method = MethodSpec(args.method, eg=not args.no_eg, nd=not args.no_nd)
    prompt = read_prompt(args)
    engine = Engine(load_pair_models(pair, args.dtype))
    result = engine.generate(engine.encode(prompt, raw=args.raw), method, drafting, gen, seed=args.seed)
    if args.trace:
        Path(args.trace).write_text(dumps(result))
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        print(result.text)
        print(f"[{summary['method']}] {len(result.new_tokens)} tokens in {summary['wall_s']:.2f}s "
              f"({summary['tokens_per_s']:.1f} tok/s), {summary['rounds']} rounds, "
              f"mean A {summary['mean_accepted']:.2f}, mid calls {summary['mid_calls']}", file=sys.stderr)
    return 0
