"""A generation request from the app: check it, load the pair once, run the chosen method live (streamed
round by round from a worker thread), then the compared methods; every update goes through `RunPanel`."""
from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, fields

import gradio as gr

from treegraft.config import ConfigError, with_overrides
from treegraft.methods import MethodSpec, parse_schedule
from treegraft.prompt_check import PromptError, check_length
from treegraft.trace import GenerationResult

from .runtime import Runtime, engine_call, on_engine_thread
from .view import View, run_record

try:  # Hugging Face ZeroGPU Spaces: hold a GPU while a generation runs; a no-op elsewhere
    import spaces

    on_gpu = spaces.GPU(duration=180)
except ImportError:  # pragma: no cover - the package is only present on Spaces
    def on_gpu(fn):
        return fn

METHOD_CHOICES = ["treegraft", "all-small", "all-mid", "fixed", "oracle"]
BASELINES = ["ar", "all-small", "all-mid"]
FRAME_INTERVAL_S = 0.35  # the fastest the browser is asked to redraw the tree while streaming
MAX_PROMPT_CHARS = 20_000
ROUND_WAIT_S = 5.0  # the longest the engine waits for a frame to go out; after that it stops waiting (a stalled reader)
_stop_flags: dict[str, threading.Event] = {}
_presenting: dict[str, bool] = {}  # session -> presentation mode as last toggled, read by that session's running stream
_rotation = itertools.count()


@dataclass(frozen=True)
class RunRequest:
    """The Generate button's inputs, in the order of the /generate API (and of `Controls.inputs`)."""

    prompt: str
    pair: str
    method: str
    schedule: str
    no_eg: bool
    no_nd: bool
    paper_scores: bool  # the paper's rule for a node's p instead of calibrated scores (tree.py)
    max_new: int
    temperature: float
    seed: int
    depth: int
    width: int
    budget: int
    adaptive: bool
    compare: bool
    corpus: bool = True  # the n-gram drafter also reads the pair's corpus (drafters/corpus.py)
    paper_pools: bool = False  # SPEC 2.1's pools: small_pool "paper" and expand "all" (the pair's own otherwise)
    paper_scheduler: bool = False  # treegraft: the learned scheduler at every step (mid_gate "off"), not the yield gate
    depth_gate: bool = False  # a round takes the steps that pay in this request (depth_gate "yield"), not always D

    @classmethod
    def of(cls, values) -> "RunRequest":
        return cls(*values[: len(fields(cls))])


PAPER_POOLS = {"small_pool": "paper", "expand": "all"}  # the "Paper's pools" box (tree.small_sites, prune.expandable)


def compare_order(label: str, compare: bool) -> list[str]:
    """The counters' rows: the chosen method, then the compared ones (the chosen method alone without a comparison)."""
    return [label] + [b for b in BASELINES if b != label] if compare else [label]


def timing_order(order: list[str]) -> list[str]:
    """The runs that fill the counters: every row's method, the chosen one too, each in a run of its own without
    drawing, in an order that rotates from run to run ([] without a comparison). The live run is not one of them:
    its frames are built and sent on the same CPU while the engine runs (on a 2-core host the chosen method read about
    twice its undrawn time per token: docs/app.md), and all four methods must be timed alike to be compared."""
    if len(order) < 2:
        return []
    shift = next(_rotation) % len(order)
    return order[shift:] + order[:shift]


def warm_up(engine, ids, spec, drafting, gen, seed) -> None:
    """One short untimed generation, so that no timed run pays for first-call costs (kernels, the budget probe)."""
    engine.generate(ids, spec, drafting, gen.model_copy(update={"max_new_tokens": min(4, gen.max_new_tokens)}), seed)


def validate_inputs(prompt: str, schedule: str):
    if not prompt or not prompt.strip():
        raise gr.Error("The prompt is empty: type something or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise gr.Error(f"The prompt has {len(prompt)} characters; the limit here is {MAX_PROMPT_CHARS}.")
    try:
        return parse_schedule(schedule) if schedule and schedule.strip() else None
    except ConfigError as err:
        raise gr.Error(str(err)) from None


def prepare(runtime: Runtime, statuses, r: RunRequest, progress):
    """(engine, prompt ids, method, drafting, generation settings) of a request, or a clear gr.Error."""
    sched = validate_inputs(r.prompt, r.schedule)
    status = next(s for s in statuses if s.name == r.pair)
    if not status.available:
        raise gr.Error(f"Pair '{r.pair}' cannot run on this host: {status.reason}.")
    cfg = runtime.pairs[r.pair]
    try:
        drafting = with_overrides(cfg.drafting, depth=int(r.depth), width=int(r.width), budget=int(r.budget),
                                  schedule=sched, adaptive_budget=bool(r.adaptive),
                                  scores="paper" if r.paper_scores else "calibrated", corpus=bool(r.corpus),
                                  mid_gate="off" if r.paper_scheduler else "yield",
                                  depth_gate="yield" if r.depth_gate else "off",
                                  **(PAPER_POOLS if r.paper_pools else {}))
        gen = with_overrides(cfg.generation, max_new_tokens=int(r.max_new), temperature=float(r.temperature))
        spec = MethodSpec(r.method, eg=not r.no_eg, nd=not r.no_nd)
        engine = runtime.engine(r.pair, progress)
    except (ConfigError, RuntimeError) as err:
        raise gr.Error(str(err)) from None
    except Exception as err:  # a model that fails to load: say so, keep the app alive
        raise gr.Error(f"Could not load pair '{r.pair}': {err}") from None
    try:
        ids = engine.encode(r.prompt)
        check_length(len(ids), gen.max_new_tokens, engine.context)
    except PromptError as err:
        raise gr.Error(f"Bad prompt: {err}") from None
    return engine, ids, spec, drafting, gen


def request_stop(request: gr.Request):
    flag = _stop_flags.get(request.session_hash)
    if flag is None:
        return "Nothing to stop."
    flag.set()
    return "Stopping after the current round..."


def set_presenting(request: gr.Request | None, on: bool) -> None:
    """Presentation mode toggled: a generation streaming in this session draws its next frames in that style."""
    if request is not None and request.session_hash:
        _presenting[request.session_hash] = bool(on)


def presenting(session: str | None, default: bool) -> bool:
    return _presenting.get(session, default) if session else default


def live_record(rounds: list, started: float) -> dict:
    return {"wall_s": time.perf_counter() - started, "tokens": sum(r.accepted + 1 for r in rounds), "done": False,
            "drawn": True,
            "mean_accepted": sum(r.accepted for r in rounds) / len(rounds), "rounds": len(rounds)}


def worker(engine, args, stop) -> tuple[queue.Queue, threading.Event]:
    """Run the engine on the engine thread (ui/runtime.py); rounds, then the result (or the error), arrive on a queue.
    After each round the engine waits for the event (the reader sets it once it has drawn what it wanted of that
    round and the page has taken the frame), so no frame is built or sent while a round runs: the rounds' own times
    (t_D, t_V, the gate's inputs) are the engine's alone, as in an undrawn run."""
    q: queue.Queue = queue.Queue()
    go = threading.Event()
    paced = [True]  # until a frame takes longer than ROUND_WAIT_S to go out

    def on_round(trace) -> None:
        go.clear()
        q.put(trace)
        if paced[0]:
            paced[0] = go.wait(ROUND_WAIT_S)

    def work():
        try:
            q.put(engine.generate(*args, on_round=on_round, should_stop=stop.is_set))
        except Exception as err:  # reported in the UI; the engine's next start() resets its state
            q.put(err)

    on_engine_thread(work)
    return q, go


def stream_main(panel, engine, ids, spec, drafting, gen, seed, view: View, stop, session: str | None = None):
    """Stream throttled live frames of the chosen method, then its finished state (in the presentation style the
    session's checkbox has now, so toggling it mid-run is not undone by the next frame). The engine waits while a
    frame is built and sent (`worker`); a page that goes away stops the run."""
    q, go = worker(engine, (ids, spec, drafting, gen, seed), stop)
    rounds, last_frame, strings, t0 = [], 0.0, {}, time.perf_counter()
    try:
        while True:
            item = q.get()
            if isinstance(item, Exception):
                raise gr.Error(f"Generation failed: {item}")
            if isinstance(item, GenerationResult):
                view.result, view.round_no, view.present = item, 0, presenting(session, view.present)
                view.runs[spec.label] = run_record(item, done=True, drawn=True)
                yield panel.final(view, f"**{spec.label}** finished: {len(item.new_tokens)} tokens.")
                return
            rounds.append(item)
            if time.perf_counter() - last_frame >= FRAME_INTERVAL_S:
                last_frame = time.perf_counter()
                strings.update(engine.token_strings([item]))
                view.runs[spec.label] = live_record(rounds, t0)
                view.present = presenting(session, view.present)
                view.result = GenerationResult(pair="", method=spec.label, prompt_tokens=len(ids), new_tokens=[],
                                               text="", wall_s=0.0, prefill_s=0.0, dtype="", device="", settings={},
                                               rounds=list(rounds), token_strings=dict(strings))
                yield panel.live(view)  # resumed once the frame has gone out
            go.set()
    except GeneratorExit:  # the page went away mid-run: end it, so the engine thread does not run on for nobody
        stop.set()
        raise
    finally:
        go.set()


def make_generate(runtime: Runtime, statuses, panel):
    """The Generate handler: inputs are RunRequest's fields, then the session's View."""

    @on_gpu
    def generate(request: gr.Request, progress=gr.Progress(), *values):
        r, old = RunRequest.of(values), values[-1]
        engine, ids, spec, drafting, gen = prepare(runtime, statuses, r, progress)
        stop = _stop_flags.setdefault(request.session_hash, threading.Event())
        stop.clear()
        view = View(order=compare_order(spec.label, r.compare), dtype=engine.dtype_name, show=old.show,
                    present=presenting(request.session_hash, old.present))
        seed = int(r.seed)
        engine_call(warm_up, engine, ids, spec, drafting, gen, seed)
        before = engine_call(engine.state)
        try:
            yield from stream_main(panel, engine, ids, spec, drafting, gen, seed, view, stop, request.session_hash)
        finally:  # the drawn run's clock is not the engine's alone (a browser may draw beside it): it teaches no costs
            engine_call(engine.restore_timings, before)
        start = engine_call(engine.state)
        drawn = view.present  # the style the finished trace's figures were drawn in

        def update(status: str, with_files: bool = False) -> dict:
            """The counters; the figures again too where presentation mode was toggled since they were drawn (a
            toggle that reached the server after the finished frame was computed would otherwise be undone)."""
            nonlocal drawn
            view.present = presenting(request.session_hash, view.present)
            out = panel.counters_update(view, status, with_files)
            if view.present != drawn:
                out, drawn = {**panel.restyle(view), **out}, view.present
            return out

        for label in timing_order(view.order):  # the counters: each method timed without drawing
            if stop.is_set():
                break
            method = spec if label == spec.label else MethodSpec(label)
            engine_call(engine.restore, start)  # every counter from the same state, as the bench's rows
            res = engine_call(engine.generate, ids, method, drafting, gen, seed, should_stop=stop.is_set)
            view.runs[label] = run_record(res, done=not stop.is_set())
            yield update(f"Timed **{label}** without drawing.")
        yield update("Done." if not stop.is_set() else "Stopped.", with_files=True)
        _stop_flags.pop(request.session_hash, None)

    return generate
