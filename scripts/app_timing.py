"""The app's counters against the engine's own timings: the app served on loopback (no browser), Generate pressed
through gradio_client on one prompt at the app's default settings with the counters on, `--runs` times; each run's
counters (ms per new token of every method, timed without drawing) and its drawn live run (mean round and t_V, from
the run's trace); then the same four methods run directly on the app's engine thread, as many times. Run alone on
the host (it times generations).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/app_timing.py [--prompt "..."] [--runs 3] [--max-new-tokens 64]
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

from tests.test_app import free_port, submit_args  # noqa: E402  (the app tests' loopback port and request)

METHODS = ["treegraft", "ar", "all-small", "all-mid"]
ROW = re.compile(r"<b>([\w-]+)</b>(?: <i>\(drawn live\)</i>)?</td><td id='speedup-[\w-]+'>[^<]*</td><td>(\d+)</td>"
                 r"<td>([\d.]+)s</td><td>([\d.]+)</td>")


def rounds_ms(rounds) -> str:
    wall = [1000 * r["wall_s"] for r in rounds]
    verify = [1000 * r["verify_s"] for r in rounds]
    return f"{len(rounds)} rounds, mean round {sum(wall) / len(wall):.1f} ms, mean t_V {sum(verify) / len(verify):.1f} ms"


def parse_args(doc: str) -> argparse.Namespace:
    """The app timing scripts' options: the prompt, how many Generates, new tokens."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", default="What are some good ways to stay focused while studying at home?")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    return ap.parse_args()


def main() -> int:
    args = parse_args(__doc__)
    from gradio_client import Client

    from treegraft.config import DEFAULT_MODELS_YAML, load_pair
    from treegraft.methods import MethodSpec
    from ui.app_blocks import build_app
    from ui.runtime import Runtime
    try:
        from ui.runtime import engine_call
    except ImportError:  # an app from before the engine thread (2026-12-07): its engine ran on the caller's thread
        def engine_call(fn, *a, **k):
            return fn(*a, **k)

    drafting = load_pair("default", DEFAULT_MODELS_YAML).drafting
    settings = dict(method="treegraft", max_new=args.max_new_tokens, depth=drafting.depth, width=drafting.width,
                    budget=drafting.budget, adaptive=drafting.adaptive_budget,
                    depth_gate=drafting.depth_gate == "yield", prompt=args.prompt)
    runtime = Runtime()
    demo = build_app(runtime)
    demo.queue(default_concurrency_limit=1, max_size=16)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", analytics_enabled=False, verbose=False)
        for i in range(args.runs):
            final = client.predict(*submit_args(**settings), api_name="/generate")
            ms = {label: float(m) for label, _, _, m in ROW.findall(final[4])}
            trace = final[8] if isinstance(final[8], str) else (final[8].get("path") or final[8].get("value"))
            live = json.loads(Path(trace).read_text())["round_traces"]
            print(f"app run {i}: " + ", ".join(f"{k} {ms[k]:.1f} ms/token ({ms['ar'] / ms[k]:.2f}x)" for k in METHODS)
                  + f"; drawn live: {rounds_ms(live)}", flush=True)
    finally:
        demo.close()
    engine, cfg = runtime.engine("default"), runtime.pairs["default"]
    gen = cfg.generation.model_copy(update={"max_new_tokens": args.max_new_tokens, "temperature": 0.0})
    ids = engine.encode(args.prompt)
    for i in range(args.runs):
        res = {m: engine_call(engine.generate, ids, MethodSpec(m), cfg.drafting, gen, 0) for m in METHODS}
        ms = {m: 1000 * r.wall_s / len(r.new_tokens) for m, r in res.items()}
        tg = [{"wall_s": r.wall_s, "verify_s": r.verify_s} for r in res["treegraft"].rounds]
        print(f"direct {i}: " + ", ".join(f"{m} {ms[m]:.1f} ms/token ({ms['ar'] / ms[m]:.2f}x)" for m in METHODS)
              + f"; treegraft {rounds_ms(tg)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
