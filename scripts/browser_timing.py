"""The app's counters with a browser on the same host: the app served on loopback, Debian's chromium (headless, at the
normal CPU priority, as a local user's browser runs) presses Generate `--runs` times on one prompt at the app's default
settings with the counters on. Per run: the CPU chromium used (all its processes, from /proc) while the counters were
timed, each counter's ms per token, mean A and speedup over AR, and the T(n) the engine prices its cut with afterwards
(`Engine.host_costs`: the calibration's probes and the rounds' refinement). Run alone on the host (it times
generations); `scripts/app_timing.py` is the same without a browser.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/browser_timing.py [--prompt "..."] [--runs 3] [--max-new-tokens 64]
"""
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

from scripts.app_timing import ROW, parse_args  # noqa: E402  (a counter row of the page's HTML; the options)
from tests.test_app import free_port  # noqa: E402
from tests.test_ui_browser import browser  # noqa: E402  (the browser test's chromium)

STATUS = "() => document.querySelector('#status') ? document.querySelector('#status').innerText : ''"
TICK = os.sysconf("SC_CLK_TCK")
ROW_A = re.compile(ROW.pattern.replace("'", "[\"']") + r"<td>([\d.]+)</td>")  # and mean A; the page's quotes are "


def chromium_cpu_s() -> float:
    """CPU seconds used so far by every chromium process on the host."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if "chrom" in Path(f"/proc/{pid}/comm").read_text():
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:  # gone meanwhile
            continue
    return total / TICK


def main() -> int:
    args = parse_args(__doc__)
    from playwright.sync_api import sync_playwright

    from ui.app_blocks import build_app
    from ui.runtime import Runtime, engine_call

    runtime = Runtime()
    demo = build_app(runtime)
    demo.queue(default_concurrency_limit=1, max_size=16)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as p:
            ctx = browser(p, Path(tempfile.mkdtemp()))
            page = ctx.new_page()
            page.goto(f"http://127.0.0.1:{port}/")
            page.locator("#prompt textarea").fill(args.prompt)
            page.locator("#max-new input[type=number]").fill(str(args.max_new_tokens))
            page.locator("#max-new input[type=number]").press("Enter")
            for run in range(1, args.runs + 1):
                page.wait_for_timeout(500)
                samples, done = [], threading.Event()

                def sample():
                    while not done.is_set():
                        samples.append((time.perf_counter(), chromium_cpu_s()))
                        time.sleep(0.2)

                sampler = threading.Thread(target=sample)
                sampler.start()
                page.locator("#generate").click()
                page.wait_for_function(f"!({STATUS})().includes('Done.')", timeout=60_000)
                drawn = None
                while "Done." not in (status := page.evaluate(STATUS)):
                    if drawn is None and "finished" in status:
                        drawn = time.perf_counter()  # the drawn run is over: the counters' runs start
                    time.sleep(0.05)
                done.set()
                sampler.join()
                timing = [(t, c) for t, c in samples if drawn is not None and t >= drawn]
                cores = ((timing[-1][1] - timing[0][1]) / (timing[-1][0] - timing[0][0]) if len(timing) > 1
                         else float("nan"))
                html = page.inner_html("#counters")
                rows = {m: (float(ms), float(a)) for m, _tokens, _wall, ms, a in ROW_A.findall(html)}
                ar = rows.get("ar", (float("nan"), 0))[0]
                print(f"run {run}: chromium {cores:.2f} cores while the counters were timed; " + "; ".join(
                    f"{m} {ms:.1f} ms/token, A {a:.2f}, {ar / ms:.2f}x AR" for m, (ms, a) in rows.items()))
                costs = engine_call(runtime.engine("default").host_costs)  # torch on one thread
                print(f"  T(n) probes {costs.get('verify_ms')}\n  T(n) rounds {costs.get('verify_ms_rounds')}, "
                      f"B_ver {costs.get('b_ver')}")
            ctx.close()
    finally:
        demo.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
