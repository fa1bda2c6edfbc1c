"""The app runs every engine call on one thread (ui/runtime.py: a second thread running torch's OpenMP regions made
each forward wait for its workers), and its live run lets no frame be built while a round runs (ui/generation.py)."""
import threading
import time

from treegraft.config import DraftingConfig, GenerationConfig
from treegraft.methods import MethodSpec
from treegraft.trace import GenerationResult, RoundTrace

from tests.test_app import free_port, submit_args


def test_engine_calls_share_one_thread_from_any_caller():
    from ui.runtime import ENGINE_THREAD_NAME, engine_call

    seen = []
    callers = [threading.Thread(target=lambda: seen.append(engine_call(threading.current_thread)))
               for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    seen.append(engine_call(threading.current_thread))
    assert len(set(seen)) == 1 and seen[0].name.startswith(ENGINE_THREAD_NAME)
    assert engine_call(engine_call, threading.current_thread) is seen[0]  # on the thread already: no deadlock


def test_the_live_run_waits_for_each_frame(engine):
    """After a round the engine waits until the reader lets it go on, so a frame is never built beside a round."""
    from ui.generation import worker

    ids = engine.encode("Name three colours.")
    stop = threading.Event()
    q, go = worker(engine, (ids, MethodSpec("all-small"), DraftingConfig(), GenerationConfig(max_new_tokens=12), 0),
                   stop)
    first = q.get(timeout=300)
    assert isinstance(first, RoundTrace)
    time.sleep(1.0)  # a round here takes ~50 ms: a free-running engine would have queued more by now
    assert q.empty()
    items = [first]
    while not isinstance(items[-1], (GenerationResult, Exception)):
        go.set()
        items.append(q.get(timeout=300))
    assert isinstance(items[-1], GenerationResult), items[-1]
    assert len(items) - 1 == len(items[-1].rounds)


def generate_once(max_new: int) -> tuple:
    """A fresh app (float32) on loopback, one Generate of treegraft with the counters on through gradio_client: its
    final outputs."""
    import os

    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    from gradio_client import Client

    from ui.app_blocks import build_app
    from ui.runtime import Runtime

    demo = build_app(Runtime(dtype="float32"))
    demo.queue(default_concurrency_limit=1, max_size=16)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", analytics_enabled=False, verbose=False)
        return client.predict(*submit_args(method="treegraft", max_new=max_new, compare=True), api_name="/generate")
    finally:
        demo.close()


def test_the_apps_every_engine_call_runs_on_the_engine_thread():
    """Loading, the warm-up, the live run and every timed run of a Generate with the counters on."""
    from treegraft.engine import Engine
    from ui.runtime import ENGINE_THREAD_NAME

    threads: list[str] = []
    real_init, real_generate = Engine.__init__, Engine.generate

    def init(self, *a, **k):
        threads.append(threading.current_thread().name)
        real_init(self, *a, **k)

    def generate(self, *a, **k):
        threads.append(threading.current_thread().name)
        return real_generate(self, *a, **k)

    Engine.__init__, Engine.generate = init, generate
    try:
        final = generate_once(max_new=8)
    finally:
        Engine.__init__, Engine.generate = real_init, real_generate
    assert final[0].startswith("Done.")
    assert "(drawn live)" not in final[4] and "without drawing" in final[4]  # every row timed undrawn
    assert len(threads) == 1 + 1 + 1 + 4, threads  # load, warm-up, live, four timed runs
    assert all(t.startswith(ENGINE_THREAD_NAME) for t in threads), threads


def test_the_drawn_run_teaches_no_costs_and_every_counter_starts_alike():
    """A browser on the same host renders the drawn run's frames while its rounds run (docs/app.md): its timings are
    put back after it, so the cut of later runs is not priced on them, and every timed run starts from one state
    (the drawn run's acceptance kept), as the bench's rows do."""
    from treegraft.engine import Engine

    from tests.test_transfer import accepted_part, timed_part

    calls: list[tuple] = []  # per generate: (method, clock part before, acceptance before, clock part after)
    real_generate = Engine.generate

    def generate(self, ids, method, *a, **k):
        before = (timed_part(self), accepted_part(self))
        out = real_generate(self, ids, method, *a, **k)
        calls.append((method.label, *before, timed_part(self)))
        return out

    Engine.generate = generate
    try:
        final = generate_once(max_new=24)
    finally:
        Engine.generate = real_generate
    assert final[0].startswith("Done.")
    warm, live, *timed = calls
    assert live[0] == "treegraft" and len(timed) == 4
    assert live[3] != live[1]  # the drawn run's rounds did time the target ...
    assert all(t[1] == live[1] for t in timed)  # ... and no timed run starts from those timings
    assert all(t[2] == timed[0][2] for t in timed)  # every timed run starts with one acceptance record
    assert timed[0][2] != live[2]  # the one the drawn run left (every verified round teaches it)


def test_a_closed_engine_thread_is_replaced_by_a_new_one():
    from ui.runtime import ENGINE_THREAD_NAME, close_engine_thread, engine_call

    before = engine_call(threading.current_thread)
    close_engine_thread()
    assert not before.is_alive()
    after = engine_call(threading.current_thread)
    assert after is not before and after.name.startswith(ENGINE_THREAD_NAME)


def test_generate_shows_its_progress_on_the_status_alone():
    """Gradio's progress overlay on every output of a running event (a spinner and timer over each plot) kept a
    browser on the same 2-core host at ~0.5 of a core while the counters were timed; on the status alone, ~0.2
    (docs/app.md). The status still shows the queue position and the loading message."""
    from ui.app_blocks import build_app
    from ui.runtime import Runtime

    demo = build_app(Runtime())
    status = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "status")
    generate = next(d for d in demo.config["dependencies"] if d.get("api_name") == "generate")
    assert generate["show_progress_on"] == [status._id] and len(generate["outputs"]) > 1
