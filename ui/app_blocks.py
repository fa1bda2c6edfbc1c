"""The Gradio Blocks: layout and event wiring only. Figures come from pure builders; the engine is used
through its public API (generate with a per-round callback) and its traces."""
from __future__ import annotations

import itertools
import json
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from pathlib import Path

import gradio as gr

from treegraft.config import ConfigError, with_overrides
from treegraft.methods import MethodSpec, parse_schedule
from treegraft.prompt_check import PromptError, check_length
from treegraft.prompts import load_prompts
from treegraft.trace import GenerationResult, dumps

from .charts import OUTPUT_COLORS, counters_html, margin_figure, output_segments, speedup_figure
from .runtime import Runtime
from .trace_io import TraceError, load_trace
from .tree_figure import tree_figure

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
_stop_flags: dict[str, threading.Event] = {}


@dataclass
class View:
    """Per-browser-session state (gr.State): the run being shown and the side-by-side runs."""

    result: GenerationResult | None = None
    runs: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    dtype: str = ""  # the engine's, for the counters' caption


def example_prompts() -> list[str]:
    seen, out = set(), []
    for p in load_prompts("bench"):
        if p.category not in seen and len(p.messages) == 1:
            seen.add(p.category)
            out.append(p.text)
    return out


def tree_view(view: View, round_no: int, step_no: int, show: str):
    res = view.result
    if res is None or not res.rounds:
        return None
    r = res.rounds[min(max(int(round_no), 1), len(res.rounds)) - 1]
    step = int(step_no)
    upto = step if 0 < step <= len(r.steps) else None
    return tree_figure(r, res.token_strings, show=show, upto_step=upto)


def step_caption(view: View, round_no: int, step_no: int) -> str:
    res = view.result
    if res is None or not res.rounds:
        return ""
    r = res.rounds[min(max(int(round_no), 1), len(res.rounds)) - 1]
    lines = [f"**Round {r.index + 1}** of {len(res.rounds)}: A = {r.accepted}, t_D = {1000 * r.draft_s:.1f} ms, "
             f"t_V = {1000 * r.verify_s:.1f} ms"]
    for s in r.steps:
        mark = "**>**" if s.k == int(step_no) else "&nbsp;&nbsp;"
        margin = f", margin {s.margin:+.4f}" if s.margin is not None else ""
        resel = f", reselected {s.reselect_rate:.0%}" if s.reselect_rate is not None else ""
        lines.append(f"{mark} step {s.k}: **{s.action}**, pool {len(s.pool)}, frontier {len(s.frontier)}, "
                     f"+{len(s.added)} new{resel}{margin}")
    return "  \n".join(lines)


def run_record(res: GenerationResult, done: bool) -> dict:
    s = res.summary()
    return {"wall_s": s["wall_s"], "tokens": len(res.new_tokens), "mean_accepted": s["mean_accepted"],
            "rounds": s["rounds"], "done": done, "new_tokens": list(res.new_tokens)}


_rotation = itertools.count()


def compare_order(label: str, compare: bool) -> list[str]:
    """The chosen method first (it is drawn live), then the others in an order that rotates per run."""
    if not compare:
        return [label]
    others = [b for b in BASELINES if b != label]
    shift = next(_rotation) % len(others)
    return [label] + others[shift:] + others[:shift]


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


def live_outputs(view: View, partial: GenerationResult):
    n = len(partial.rounds)
    return (f"Round {n}...", tree_figure(partial.rounds[-1], partial.token_strings),
            gr.Slider(minimum=1, maximum=max(n, 2), value=n, step=1), gr.Slider(value=0),
            counters_html(view.runs, view.order, view.dtype), speedup_figure({}), margin_figure(partial.rounds),
            output_segments(partial.rounds, partial.token_strings), gr.File(), gr.File(), view, "")


def final_outputs(view: View, status: str, with_files: bool = False):
    res = view.result
    n = len(res.rounds) if res else 0
    files = (gr.File(value=trace_file(res)), gr.File(value=figure_file(view, n))) if with_files and res else \
        (gr.File(), gr.File())
    notes = ("  \n" + "  \n".join(f"Note: {x}" for x in res.notes)) if res and res.notes else ""
    return (status + notes, tree_view(view, n, 0, "kept"),
            gr.Slider(minimum=1, maximum=max(n, 2), value=max(n, 1), step=1), gr.Slider(value=0),
            counters_html(view.runs, view.order, view.dtype),
            speedup_figure({k: v for k, v in view.runs.items() if v.get("done")}),
            margin_figure(res.rounds if res else []),
            output_segments(res.rounds, res.token_strings, limit=len(res.new_tokens)) if res else [],
            *files, view, step_caption(view, n, 0))


def trace_file(res: GenerationResult) -> str:
    path = Path(tempfile.mkdtemp(prefix="treegraft-")) / "treegraft-trace.json"
    path.write_text(dumps(res))
    return str(path)


def figure_file(view: View, round_no: int) -> str:
    path = Path(tempfile.mkdtemp(prefix="treegraft-")) / f"treegraft-round-{round_no}.html"
    tree_view(view, round_no, 0, "all").write_html(str(path), include_plotlyjs=True)
    return str(path)


def replay(view: View, round_no, step_no, show):
    return tree_view(view, round_no, step_no, show), step_caption(view, round_no, step_no)


def upload(file, view: View):
    if file is None:
        return (gr.update(),) * 6 + (view,)
    try:
        res = load_trace(Path(file if isinstance(file, str) else file.name))
    except TraceError as err:
        raise gr.Error(str(err)) from None
    view = View(result=res, runs={res.method: run_record(res, True)}, order=[res.method], dtype=res.dtype)
    n = len(res.rounds)
    return (f"Loaded a saved trace: {res.method} on '{res.pair}', {n} rounds (replay, no models needed).",
            tree_view(view, n, 0, "kept"), gr.Slider(minimum=1, maximum=max(n, 2), value=max(n, 1), step=1),
            margin_figure(res.rounds), output_segments(res.rounds, res.token_strings, limit=len(res.new_tokens)),
            step_caption(view, n, 0), view)


def request_stop(request: gr.Request):
    flag = _stop_flags.get(request.session_hash)
    if flag is None:
        return "Nothing to stop."
    flag.set()
    return "Stopping after the current round..."


def live_record(rounds: list, started: float) -> dict:
    return {"wall_s": time.perf_counter() - started, "tokens": sum(r.accepted + 1 for r in rounds), "done": False,
            "mean_accepted": sum(r.accepted for r in rounds) / len(rounds), "rounds": len(rounds)}


def stream_main(engine, lock, ids, spec, drafting, gen, seed, view, stop):
    """Run the engine in a worker thread (holding the pair's lock) and stream throttled frames."""
    q: queue.Queue = queue.Queue()

    def work():
        try:
            with lock:
                q.put(engine.generate(ids, spec, drafting, gen, seed, on_round=q.put, should_stop=stop.is_set))
        except Exception as err:  # reported in the UI; the engine's next start() resets its state
            q.put(err)

    threading.Thread(target=work, daemon=True).start()
    rounds, last_frame, strings, t0 = [], 0.0, {}, time.perf_counter()
    while True:
        item = q.get()
        if isinstance(item, Exception):
            raise gr.Error(f"Generation failed: {item}")
        if isinstance(item, GenerationResult):
            view.result = item
            view.runs[spec.label] = run_record(item, done=True)
            yield final_outputs(view, f"**{spec.label}** finished: {len(item.new_tokens)} tokens.")
            return
        rounds.append(item)
        if time.perf_counter() - last_frame >= FRAME_INTERVAL_S:
            last_frame = time.perf_counter()
            strings.update(engine.token_strings([item]))
            view.runs[spec.label] = live_record(rounds, t0)
            partial = GenerationResult(pair="", method=spec.label, prompt_tokens=len(ids), new_tokens=[],
                                       text="", wall_s=0.0, prefill_s=0.0, dtype="", device="", settings={},
                                       rounds=list(rounds), token_strings=dict(strings))
            yield live_outputs(view, partial)


def prepare(runtime: Runtime, statuses, prompt, pair, method, schedule, no_eg, no_nd, max_new, temperature,
            depth, width, budget, adaptive, progress):
    """(engine, prompt ids, method, drafting, generation settings) of a request, or a clear gr.Error."""
    sched = validate_inputs(prompt, schedule)
    status = next(s for s in statuses if s.name == pair)
    if not status.available:
        raise gr.Error(f"Pair '{pair}' cannot run on this host: {status.reason}.")
    cfg = runtime.pairs[pair]
    try:
        drafting = with_overrides(cfg.drafting, depth=int(depth), width=int(width), budget=int(budget),
                                  schedule=sched, adaptive_budget=bool(adaptive))
        gen = with_overrides(cfg.generation, max_new_tokens=int(max_new), temperature=float(temperature))
        spec = MethodSpec(method, eg=not no_eg, nd=not no_nd)
        engine = runtime.engine(pair, progress)
    except (ConfigError, RuntimeError) as err:
        raise gr.Error(str(err)) from None
    except Exception as err:  # a model that fails to load: say so, keep the app alive
        raise gr.Error(f"Could not load pair '{pair}': {err}") from None
    try:
        ids = engine.encode(prompt)
        check_length(len(ids), gen.max_new_tokens, engine.context)
    except PromptError as err:
        raise gr.Error(f"Bad prompt: {err}") from None
    return engine, ids, spec, drafting, gen


def make_generate(runtime: Runtime, statuses):
    @on_gpu
    def generate(prompt, pair, method, schedule, no_eg, no_nd, max_new, temperature, seed, depth, width, budget,
                 adaptive, compare, view: View, request: gr.Request, progress=gr.Progress()):
        engine, ids, spec, drafting, gen = prepare(runtime, statuses, prompt, pair, method, schedule, no_eg, no_nd,
                                                   max_new, temperature, depth, width, budget, adaptive, progress)
        stop = _stop_flags.setdefault(request.session_hash, threading.Event())
        stop.clear()
        view = View(order=compare_order(spec.label, compare), dtype=engine.dtype_name)
        lock = runtime.locks[pair]
        with lock:
            warm_up(engine, ids, spec, drafting, gen, int(seed))
        yield from stream_main(engine, lock, ids, spec, drafting, gen, int(seed), view, stop)
        for label in view.order[1:]:
            if stop.is_set():
                break
            with lock:
                res = engine.generate(ids, MethodSpec(label), drafting, gen, int(seed), should_stop=stop.is_set)
            view.runs[label] = run_record(res, done=not stop.is_set())
            yield final_outputs(view, f"Compared with **{label}**.")
        yield final_outputs(view, "Done." if not stop.is_set() else "Stopped.", with_files=True)
        _stop_flags.pop(request.session_hash, None)

    return generate


def build_app(runtime: Runtime | None = None) -> gr.Blocks:
    runtime = runtime or Runtime()
    statuses = runtime.statuses()
    with gr.Blocks(title="TreeGraft: multi-drafter tree speculative decoding") as demo:
        c = layout(runtime, statuses)
        outputs = [c.status, c.tree_plot, c.round_slider, c.step_slider, c.counters, c.speed_plot, c.margin_plot,
                   c.output, c.trace_dl, c.fig_dl, c.view_state, c.caption]
        inputs = [c.prompt, c.pair, c.method, c.schedule, c.no_eg, c.no_nd, c.max_new, c.temperature, c.seed,
                  c.depth, c.width, c.budget, c.adaptive, c.compare, c.view_state]
        c.go_btn.click(make_generate(runtime, statuses), inputs, outputs, concurrency_limit=1,
                       concurrency_id="engine")
        c.stop_btn.click(request_stop, None, c.status, queue=False)
        for ctl in (c.round_slider, c.step_slider, c.show):
            ctl.change(replay, [c.view_state, c.round_slider, c.step_slider, c.show], [c.tree_plot, c.caption])
        c.trace_up.upload(upload, [c.trace_up, c.view_state],
                          [c.status, c.tree_plot, c.round_slider, c.margin_plot, c.output, c.caption, c.view_state])
    return demo


def layout(runtime: Runtime, statuses) -> SimpleNamespace:
    """The components, placed; returned by name."""
    pair_choices = [(s.name if s.available else f"{s.name} (unavailable: {s.reason})", s.name) for s in statuses]
    default_pair = next((s.name for s in statuses if s.available), statuses[0].name)
    c = SimpleNamespace(view_state=gr.State(View()))
    gr.Markdown("# TreeGraft: two drafters, one shared draft tree\n"
                "An n-gram drafter (blue) and a neural mid drafter (red) grow one tree; the target verifies it "
                "in one forward pass and keeps exactly its own output. Every number below is measured live on "
                "this host.")
    with gr.Row():
        with gr.Column(scale=1, min_width=320):
            controls(c, runtime, pair_choices, default_pair)
        with gr.Column(scale=2):
            views(c)
    return c


def controls(c: SimpleNamespace, runtime: Runtime, pair_choices, default_pair) -> None:
    c.prompt = gr.Textbox(label="Prompt", lines=5, elem_id="prompt")
    gr.Examples(example_prompts(), inputs=c.prompt, label="Examples (one per category)")
    c.pair = gr.Dropdown(pair_choices, value=default_pair, label="Model pair (models.yaml)", elem_id="pair")
    c.method = gr.Radio(METHOD_CHOICES, value="treegraft", label="Method", elem_id="method")
    c.schedule = gr.Textbox(value="1,0,1,0,1", label="Fixed schedule (1 = mid step)", elem_id="schedule")
    with gr.Row():
        c.no_eg = gr.Checkbox(label="w/o EG (ablation)", elem_id="no-eg")
        c.no_nd = gr.Checkbox(label="w/o ND (ablation)", elem_id="no-nd")
    c.max_new = gr.Slider(1, 512, value=64, step=1, label="Max new tokens", elem_id="max-new")
    c.temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
    c.seed = gr.Number(value=0, precision=0, label="Seed")
    with gr.Accordion("Tree settings", open=False):
        c.depth = gr.Slider(1, 8, value=5, step=1, label="D: draft steps per round")
        c.width = gr.Slider(1, 16, value=8, step=1, label="W: frontier width")
        c.budget = gr.Slider(1, 127, value=runtime.pairs[default_pair].drafting.budget, step=1,
                             label="B_ver: nodes verified per round")
        c.adaptive = gr.Checkbox(value=runtime.pairs[default_pair].drafting.adaptive_budget,
                                 label="Adaptive B_ver: verify only the nodes that pay for their time "
                                       "(0 = a plain decoding step; dropped nodes show as pruned)")
    c.compare = gr.Checkbox(value=True, label="Also run AR, All-Small and All-Mid for the counters")
    with gr.Row():
        c.go_btn = gr.Button("Generate", variant="primary", elem_id="generate")
        c.stop_btn = gr.Button("Stop", elem_id="stop")
    c.status = gr.Markdown(elem_id="status")


def views(c: SimpleNamespace) -> None:
    c.tree_plot = gr.Plot(label="Shared draft tree (latest round)", elem_id="tree-plot")
    with gr.Row():
        c.round_slider = gr.Slider(1, 2, value=1, step=1, label="Round (arrow keys scrub)",
                                   elem_id="round-slider")
        c.step_slider = gr.Slider(0, 8, value=0, step=1, label="Draft step (0 = final verified tree)",
                                  elem_id="step-slider")
        c.show = gr.Radio(["kept", "all"], value="kept", label="Nodes", elem_id="show")
    c.caption = gr.Markdown(elem_id="step-caption")
    c.counters = gr.HTML(elem_id="counters")
    with gr.Row():
        c.speed_plot = gr.Plot(label="Speedups", elem_id="speedup-plot")
        c.margin_plot = gr.Plot(label="Scheduler margin", elem_id="margin-plot")
    c.output = gr.HighlightedText(label="Output (accepted draft tokens by drafter; bonus tokens from the "
                                        "target)", color_map=OUTPUT_COLORS, combine_adjacent=False,
                                  show_legend=True, show_inline_category=False,
                                  elem_id="output")
    with gr.Row():
        c.trace_dl = gr.File(label="Download the run's trace (JSON)", elem_id="trace-file")
        c.fig_dl = gr.File(label="Download the tree (HTML)", elem_id="figure-file")
        c.trace_up = gr.File(label="Replay a saved trace (no models needed)", file_types=[".json"],
                             elem_id="trace-upload")
