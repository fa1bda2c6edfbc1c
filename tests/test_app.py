"""The app end to end: gradio_client streaming, and a real browser (Playwright + Debian chromium)."""
import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PROMPT = "Write a Python function that adds two numbers."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url():
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    from ui.app_blocks import build_app

    demo = build_app()
    demo.queue(default_concurrency_limit=1, max_size=16)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def submit_args(**over):
    args = dict(prompt=PROMPT, pair="default", method="fixed", schedule="1,0,1,0,1", no_eg=False, no_nd=False,
                paper_scores=False, max_new=24, temperature=0.0, seed=0, depth=5, width=8, budget=8, adaptive=True, compare=True,
                corpus=True, paper_pools=False, paper_scheduler=False, depth_gate=False)
    args.update(over)
    return list(args.values())


def test_generation_streams_in_order_and_ends_with_text_counters_and_trace(app_url):
    from gradio_client import Client

    client = Client(app_url, analytics_enabled=False, verbose=False)
    job = client.submit(*submit_args(), api_name="/generate")
    outputs = list(job)
    assert len(outputs) >= 3
    statuses = [o[0] for o in outputs]
    live_rounds = [int(s.split()[1].rstrip(".")) for s in statuses if s.startswith("Round ")]
    assert live_rounds == sorted(live_rounds)
    final = outputs[-1]
    assert final[0].startswith("Done.")
    counters = final[4]
    for label in ("fixed", "ar", "all-small", "all-mid"):
        assert f"<b>{label}</b>" in counters and "(running)" not in counters
    assert "x</td>" in counters  # speedups filled in
    assert "warm-up" in counters and "time per new token" in counters and "rotates" in counters
    if "float32 every method" in counters:  # the caption states what is true on the running dtype
        assert counters.count(">identical</td>") == 4, counters
    else:
        assert "may differ from AR" in counters
    text = "".join(seg["token"] for seg in final[7]) if isinstance(final[7], list) else final[7]
    assert text.strip()
    trace = final[8]
    path = trace if isinstance(trace, str) else (trace.get("path") or trace.get("value") or "")
    assert str(path).endswith(".json"), trace
    assert '"round_traces"' in Path(path).read_text()


def test_bad_input_is_a_clear_error(app_url):
    from gradio_client import Client

    client = Client(app_url, analytics_enabled=False, verbose=False)
    with pytest.raises(Exception, match="prompt is empty"):
        client.predict(*submit_args(prompt="   "), api_name="/generate")
    with pytest.raises(Exception, match="schedule"):
        client.predict(*submit_args(schedule="1,7"), api_name="/generate")


def test_real_browser(app_url, tmp_path):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: `make test` installs it (apt-get install chromium)")
        pytest.skip("chromium not installed (make test installs it)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    origin = app_url.rstrip("/")
    foreign = []
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, accept_downloads=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
            viewport={"width": 1500, "height": 1300})
        page = ctx.new_page()
        page.on("request", lambda r: None if r.url.startswith((origin, "data:", "blob:")) else foreign.append(r.url))
        page.goto(app_url)
        page.locator("#prompt textarea").fill(PROMPT)
        page.locator("#max-new input[type=number]").fill("16")
        page.locator("#max-new input[type=number]").press("Enter")
        page.locator("#generate").click()
        # presentation mode switched on while the run streams: its later frames and its final tree keep that style
        page.wait_for_function("document.querySelector('#status') && "
                               "/Round \\d|Done\\./.test(document.querySelector('#status').innerText)", timeout=240_000)
        page.locator("#header").click()
        page.keyboard.press("p")
        page.wait_for_function("document.body.classList.contains('tg-present')")
        page.wait_for_function("document.querySelector('#status') && "
                               "document.querySelector('#status').innerText.includes('Done.')", timeout=240_000)
        tree_key = "((document.querySelector('#tree-plot .js-plotly-plot').layout.meta || {}).tg || {}).key || ''"
        page.wait_for_function(f"({tree_key}).includes(':present:')", timeout=30_000)
        page.keyboard.press("p")
        page.wait_for_function(f"!document.body.classList.contains('tg-present') && ({tree_key}).includes(':normal:')",
                               timeout=30_000)
        points = page.locator("#tree-plot .scatterlayer .trace .points path.point")
        assert points.count() >= 2
        # every drafted node is drawn: the verified tree filled (root + kept nodes), the pruned ones hollow
        title = page.locator("#tree-plot .gtitle").text_content()
        drafted, verified = (int(x) for x in re.search(r"(\d+) drafted, (\d+) verified", title).groups())
        counts = page.evaluate("""() => Object.fromEntries(document.querySelector('#tree-plot .js-plotly-plot').data
            .map(t => [t.name, t.x.filter(x => x !== null).length]))""")
        filled = sum(counts[k] for k in ("root (last committed token)", "small drafter (n-gram)", "mid drafter",
                                         "proposed by both drafters"))
        assert filled == verified + 1 and counts["pruned (not verified)"] + counts["overwritten (w/o ND)"] == \
            drafted - verified, (title, counts)
        legend = " ".join(page.locator("#tree-plot .legendtext").all_text_contents())
        for entry in ("small drafter", "pruned", "accepted path", "bonus token"):
            assert entry in legend
        assert page.locator("#timeline-plot .barlayer path").count() >= 1
        page.screenshot(path=str(ARTIFACTS / "app.png"), full_page=True)
        # step through the round's animation with the keyboard: the right arrow goes to its first frame
        page.wait_for_function("(document.querySelector('#tree-plot .js-plotly-plot')._tgKey || '') !== ''")
        page.locator("#header").click()
        page.keyboard.press("ArrowRight")
        page.wait_for_function("document.querySelector('#tree-plot .gtitle') && /\\(frame 1\\/.*step 1: the pool/"
                               ".test(document.querySelector('#tree-plot .gtitle').textContent)", timeout=30_000)
        with page.expect_download() as dl:
            page.locator("#trace-file a").first.click()
        saved = tmp_path / "trace.json"
        dl.value.save_as(saved)
        assert b'"round_traces"' in saved.read_bytes()
        page.screenshot(path=str(ARTIFACTS / "app-step.png"), full_page=True)
        ctx.close()
    assert not foreign, f"requests left the app's origin: {foreign[:5]}"


def test_paper_scheduler_box_switches_treegrafts_step_one(app_url):
    """Unticked, treegraft's step 1 is the yield gate's (its margin in the trace says so); ticked, the learned
    scheduler decides every step (mid_gate "off" in the trace's settings)."""
    from gradio_client import Client

    client = Client(app_url, analytics_enabled=False, verbose=False)
    for ticked, want in ((False, "yield"), (True, "off")):
        final = client.predict(*submit_args(method="treegraft", max_new=12, compare=False, paper_scheduler=ticked),
                               api_name="/generate")
        trace = final[8]
        path = trace if isinstance(trace, str) else (trace.get("path") or trace.get("value") or "")
        run = json.loads(Path(path).read_text())
        assert run["settings"]["drafting"]["mid_gate"] == want
        by = {s["decided_by"] for r in run["round_traces"] for s in r["steps"] if s["margin"] is not None}
        assert by <= ({"yield"} if want == "yield" else {"g_psi"}) and by


def test_paper_pools_box_runs_the_ablation(app_url):
    """The "Paper's pools" box sets SPEC 2.1's pools for the run (its trace says so); unticked, the pair's own."""
    from gradio_client import Client

    client = Client(app_url, analytics_enabled=False, verbose=False)
    for ticked, want in ((True, ("paper", "all")), (False, ("shared", "keepable"))):
        final = client.predict(*submit_args(method="all-mid", max_new=6, compare=False, paper_pools=ticked),
                               api_name="/generate")
        trace = final[8]
        path = trace if isinstance(trace, str) else (trace.get("path") or trace.get("value") or "")
        drafting = json.loads(Path(path).read_text())["settings"]["drafting"]
        assert (drafting["small_pool"], drafting["expand"]) == want


def test_depth_gate_box_lets_rounds_take_fewer_than_d_steps(app_url):
    """Ticked, the run's settings say depth_gate "yield", its first rounds take all D steps and none more; unticked,
    every round takes D (the trace's steps)."""
    from gradio_client import Client

    client = Client(app_url, analytics_enabled=False, verbose=False)
    for ticked, want in ((True, "yield"), (False, "off")):
        final = client.predict(*submit_args(method="all-small", max_new=24, compare=False, depth=4, depth_gate=ticked),
                               api_name="/generate")
        trace = final[8]
        path = trace if isinstance(trace, str) else (trace.get("path") or trace.get("value") or "")
        run = json.loads(Path(path).read_text())
        assert run["settings"]["drafting"]["depth_gate"] == want
        steps = [len(r["steps"]) for r in run["round_traces"]]
        assert steps[0] == 4 and max(steps) == 4 and (ticked or min(steps) == 4)
