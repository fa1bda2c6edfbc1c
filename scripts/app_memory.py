"""Resident memory of `python app.py` with the default pair loaded, after N generations with all four
counters on (issue: memory, measured). Starts the real app on a free loopback port, drives it with
gradio_client, reads VmRSS of the app's process from /proc. Usage:

    .venv/bin/python scripts/app_memory.py --generations 20 --max-new-tokens 64
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Explain recursion to a child.", "Write a Python function that reverses a list.",
           "Summarise the water cycle in three sentences.", "Translate 'good night' into French and German."]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--generations", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1", "NO_PROXY": "*"}
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(url, timeout=5)
                break
            except OSError:
                time.sleep(1)
        from gradio_client import Client

        client = Client(url, analytics_enabled=False, verbose=False)
        samples = [("started", rss_mb(proc.pid))]
        for i in range(args.generations):
            out = client.predict(PROMPTS[i % len(PROMPTS)], "default", "treegraft", "1,0,1,0,1", False, False, False,
                                 args.max_new_tokens, 0.0, 0, 5, 8, 8, True, True, api_name="/generate")
            assert str(out[0]).startswith("Done."), out[0]
            samples.append((f"after {i + 1}", rss_mb(proc.pid)))
            print(f"generation {i + 1}: RSS {samples[-1][1]:.0f} MB", flush=True)
        print(json.dumps({"rss_mb": {k: round(v) for k, v in samples}, "max_new_tokens": args.max_new_tokens,
                          "generations": args.generations, "counters": "ar, all-small, all-mid + treegraft"}))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
