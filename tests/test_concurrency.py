"""Several browser users at once: queued generations, per-user Stop, and (slow) a bounded soak test."""
import os
import resource
import threading
import time
from pathlib import Path

import pytest

from tests.test_app import CHROMIUM, PROMPT, app_url, submit_args  # noqa: F401  (the shared live-app fixture)
from treegraft.config import DraftingConfig, GenerationConfig
from treegraft.methods import MethodSpec


def client(url):
    from gradio_client import Client

    return Client(url, analytics_enabled=False, verbose=False)


def final_text(outputs) -> str:
    return "".join(seg["token"] for seg in outputs[7])


def ar_text(engine, prompt, n):
    res = engine.generate(engine.encode(prompt), MethodSpec("ar"), DraftingConfig(), GenerationConfig(max_new_tokens=n))
    return "".join(engine.tokenizer.decode([t]) for t in res.new_tokens)


@pytest.fixture(scope="module")
def fp32_app_url():
    """The app with its engines pinned to float32, for tests that compare its outputs with AR's."""
    from tests.test_app import free_port
    from ui.app_blocks import build_app
    from ui.runtime import Runtime

    demo = build_app(Runtime(dtype="float32"))
    demo.queue(default_concurrency_limit=1, max_size=16)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def test_two_users_at_once_both_finish_exactly(fp32_app_url, engine):
    """Both sides float32 (the app pinned, `engine` is the fp32 fixture): outputs must be identical."""
    prompts = ["Name a fruit.", "Name a colour."]
    results = {}

    def run(p):
        results[p] = list(client(fp32_app_url).submit(*submit_args(prompt=p, max_new=10, compare=False),
                                                 api_name="/generate"))

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for p in prompts:
        assert results[p][-1][0].startswith("Done."), results[p][-1][0]
        assert final_text(results[p][-1]) == ar_text(engine, p, 10)


def test_stop_cancels_only_the_stopping_users_run(app_url):
    a, b = client(app_url), client(app_url)
    job_a = a.submit(*submit_args(prompt="Write a long story about a dragon.", max_new=400, compare=True),
                     api_name="/generate")
    deadline = time.time() + 300  # bounded wait for an event (a's first streamed round), not a timing assumption
    while not any(str(o[0]).startswith("Round ") for o in job_a.outputs()):
        assert not job_a.done() and time.time() < deadline, "a never streamed a round"
        time.sleep(0.2)
    job_b = b.submit(*submit_args(prompt="Say yes.", max_new=6, compare=False), api_name="/generate")
    a.predict(api_name="/request_stop")
    out_a = list(job_a)
    out_b = list(job_b)
    assert out_a[-1][0].startswith("Stopped.")
    assert out_b[-1][0].startswith("Done.")


def test_second_browser_user_sees_their_queue_position(app_url):
    """Two real browser tabs: while the first generates, the second shows `queue: 1/1` until its turn."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: `make test` installs it (apt-get install chromium)")
        pytest.skip("chromium not installed (make test installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        pages = [browser.new_page(viewport={"width": 1400, "height": 1200}) for _ in range(2)]
        for page, n in zip(pages, ("24", "6")):
            page.goto(app_url)
            page.locator("#prompt textarea").fill(PROMPT)
            page.locator("#max-new input[type=number]").fill(n)
            page.locator("#max-new input[type=number]").press("Enter")
        pages[0].locator("#generate").click()
        pages[0].wait_for_function("document.querySelector('#status').innerText.startsWith('Round ')",
                                   timeout=120_000)
        pages[1].locator("#generate").click()
        pages[1].wait_for_function("/queue: 1\\/\\d+/.test(document.body.innerText)", timeout=60_000)
        for page in pages:
            page.wait_for_function("document.querySelector('#status').innerText.includes('Done.')",
                                   timeout=300_000)
        browser.close()


def rss_mb() -> float:
    """Current resident memory of this process (the app runs in it), in MB."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


@pytest.mark.slow
def test_soak_concurrent_sessions(fp32_app_url, engine):
    """N concurrent clients for a bounded time, loopback only: all finish, outputs exact, memory bounded. The app
    is pinned to float32 as `engine` is: on a CPU with native bf16, `auto` is bf16, whose batched and one-token
    forwards round differently (the bf16 pass measures that match rate)."""
    n_clients, minutes = int(os.environ.get("SOAK_CLIENTS", 3)), float(os.environ.get("SOAK_MINUTES", 3))
    prompts = ["Name a fruit.", "Name a colour.", "Name an animal.", "Name a city."]
    want = {p: ar_text(engine, p, 12) for p in prompts}
    done, errors, rss = [], [], [rss_mb()]
    deadline = time.time() + 60 * minutes

    def user(i):
        c = client(fp32_app_url)
        k = 0
        while time.time() < deadline:
            p = prompts[(i + k) % len(prompts)]
            out = list(c.submit(*submit_args(prompt=p, max_new=12, compare=False), api_name="/generate"))
            got = final_text(out[-1])
            if got == want[p]:
                done.append(p)
            else:
                errors.append((p, got, want[p]))
            rss.append(rss_mb())
            k += 1

    threads = [threading.Thread(target=user, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60 * minutes + 300)
    half = len(rss) // 2
    first, second = max(rss[:half] or rss), max(rss[half:])
    print(f"soak: {n_clients} clients, {minutes} min, {len(done)} generations exact, {len(errors)} wrong, "
          f"RSS start {rss[0]:.0f} MB, max first half {first:.0f} MB, max second half {second:.0f} MB")
    assert not errors and len(done) >= n_clients
    assert second <= first * 1.1 + 100  # memory levels off: no growth without bound
