"""The Gradio Blocks: layout and event wiring only. Components live in groups (ui/panels.py); every handler
returns updates keyed by component; figures come from pure builders over the engine's traces; the engine is
used through its public API (generate with a per-round callback). No model is loaded until a Generate."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr

from treegraft.prompts import load_prompts

from . import view as v
from .client import PRESENT_JS, page_js
from .compare import compare_html
from .gallery import load_entry
from .generation import (compare_order, make_generate, request_stop,  # noqa: F401  (compare_order: tests)
                         set_presenting)
from .panels import THIS_RUN, ComparePanel, Controls, GalleryPanel, RunPanel
from .runtime import Runtime
from .trace_io import TraceError, load_trace

KEYS = ("Keys: <b>space</b> plays or pauses the tree's animation, <b>&larr; &rarr;</b> step through it, "
        "<b>p</b> toggles presentation mode (<b>Esc</b> leaves it). Click a node to highlight its path; click a "
        "timeline bar to open its round.")


@dataclass
class App:
    controls: Controls
    run: RunPanel
    gallery: GalleryPanel
    compare: ComparePanel
    present: gr.Checkbox
    click: gr.Textbox  # hidden: the page's script writes "<plot id>:<round>:<nonce>" when a timeline bar is clicked
    tabs: gr.Tabs
    compare_tab: gr.Tab


def example_prompts() -> list[str]:
    seen, out = set(), []
    for p in load_prompts("bench"):
        if p.category not in seen and len(p.messages) == 1:
            seen.add(p.category)
            out.append(p.text)
    return out


def build_app(runtime: Runtime | None = None) -> gr.Blocks:
    runtime = runtime or Runtime()
    statuses = runtime.statuses()
    with gr.Blocks(title="TreeGraft: multi-drafter tree speculative decoding") as demo:
        app = place(runtime, statuses)
        wire(app, runtime, statuses)
        demo.load(None, js=page_js())
    return demo


def place(runtime: Runtime, statuses) -> App:
    pair_choices = [(s.name if s.available else f"{s.name} (unavailable: {s.reason})", s.name) for s in statuses]
    default_pair = next((s.name for s in statuses if s.available), statuses[0].name)
    state = gr.State(v.View())
    gr.Markdown("# TreeGraft: two drafters, one shared draft tree\n"
                "An n-gram drafter (blue) and a neural mid drafter (red) grow one tree; the target verifies it "
                "in one forward pass and keeps exactly its own output. Every number below is measured live on "
                "this host, or was recorded by the default pair (gallery).", elem_id="header")
    with gr.Row():
        with gr.Column(scale=1, min_width=320, elem_id="controls"):
            gallery = GalleryPanel.place()
            controls = Controls.place(example_prompts(), pair_choices, default_pair,
                                      runtime.pairs[default_pair].drafting)
            status = gr.Markdown(elem_id="status")
        with gr.Column(scale=2, elem_id="views"):
            with gr.Row():
                present = gr.Checkbox(label="Presentation mode (p)", elem_id="present", scale=0, min_width=200)
                gr.HTML(f"<span class='tg-keys'>{KEYS}</span>")
            with gr.Tabs() as tabs:
                with gr.Tab("Run", id="run", elem_id="run-tab"):
                    run = RunPanel.place(state, status)
                with gr.Tab("Compare", id="compare", elem_id="compare-tab") as compare_tab:
                    compare = ComparePanel.place()
    click = gr.Textbox(elem_id="plot-click", elem_classes=["tg-hidden"], show_label=False, container=False)
    return App(controls, run, gallery, compare, present, click, tabs, compare_tab)


def wire(app: App, runtime: Runtime, statuses) -> None:
    c, run, cmp = app.controls, app.run, app.compare
    c.go_btn.click(make_generate(runtime, statuses, run), c.inputs() + [run.state], run.api_outputs(),
                   concurrency_limit=1, concurrency_id="engine", api_name="generate", show_progress_on=[run.status])
    c.stop_btn.click(request_stop, None, run.status, queue=False)
    round_outputs = [run.tree_plot, run.caption, run.round_slider, run.timeline_plot, run.state]
    # each view handler reads the presentation checkbox itself, so a toggle racing it cannot be undone by its state
    run.round_slider.input(open_round(run), [run.state, run.round_slider, app.present], round_outputs,
                           api_name="open_round")
    run.show.input(set_show(run), [run.state, run.show, app.present], round_outputs, api_visibility="private")
    loaded = run.api_outputs()
    app.gallery.pick.input(load_gallery(run), [app.gallery.pick, run.state], loaded, api_name="load_gallery")
    app.gallery.upload.upload(load_upload(run), [app.gallery.upload, run.state], loaded, api_name="load_trace")
    app.present.change(None, app.present, None, js=PRESENT_JS)
    restyled = [run.tree_plot, run.timeline_plot, run.speed_plot, run.margin_plot, run.cost_plot, run.state]
    app.present.change(restyle(run), [app.present, run.state], restyled, api_visibility="private")
    cmp_inputs = [cmp.a, cmp.b, run.state, app.present]
    cmp_outputs = [cmp.tree_a, cmp.tree_b, cmp.timeline_a, cmp.timeline_b, cmp.table]
    app.compare_tab.select(show_compare(cmp), cmp_inputs, cmp_outputs, api_name="compare")
    for trigger in (cmp.a.input, cmp.b.input):
        trigger(show_compare(cmp), cmp_inputs, cmp_outputs, api_visibility="private")
    app.click.change(on_plot_click(run, cmp), [app.click] + cmp_inputs, round_outputs + cmp_outputs[:4],
                    api_name="plot_click")


def open_round(run: RunPanel):
    def handler(view: v.View, round_no, present: bool):
        return run.round_view(v.with_round(replace(view, present=bool(present)), round_no))

    return handler


def set_show(run: RunPanel):
    def handler(view: v.View, show: str, present: bool):
        return run.round_view(replace(view, show=show, present=bool(present)))

    return handler


def restyle(run: RunPanel):
    def handler(present: bool, view: v.View, request: gr.Request):
        set_presenting(request, present)  # a generation streaming now follows the toggle
        return run.restyle(replace(view, present=bool(present)))

    return handler


def load_gallery(run: RunPanel):
    def handler(name: str, view: v.View):
        if not name:
            return {}
        res = load_entry(name)
        return run.final(v.replay_view(res, view), f"Loaded the gallery trace **{name}**: {res.method}, "
                                                     f"{len(res.rounds)} rounds (recorded; no models loaded).")

    return handler


def load_upload(run: RunPanel):
    def handler(file, view: v.View):
        if file is None:
            return {}
        try:
            res = load_trace(Path(file if isinstance(file, str) else file.name))
        except TraceError as err:
            raise gr.Error(str(err)) from None
        return run.final(v.replay_view(res, view), f"Loaded a saved trace: {res.method} on '{res.pair}', "
                                                     f"{len(res.rounds)} rounds (replay, no models needed).")

    return handler


def resolve(name: str, view: v.View):
    """A compare side's trace: this session's run, or a gallery entry (None if there is none)."""
    if name == THIS_RUN:
        return view.result if view.result and view.result.new_tokens else None
    try:
        return load_entry(name)
    except (KeyError, TraceError, OSError):
        return None


def show_compare(cmp: ComparePanel):
    def handler(a: str, b: str, view: v.View, present: bool):
        ra, rb = resolve(a, view), resolve(b, view)
        return {**cmp.side("a", ra, 0, bool(present)), **cmp.side("b", rb, 0, bool(present)),
                cmp.table: compare_html(ra, rb, (a or "-", b or "-"))}

    return handler


def on_plot_click(run: RunPanel, cmp: ComparePanel):
    """A timeline bar was clicked: open that round in the run view or on that side of the compare view."""
    def handler(value: str, a: str, b: str, view: v.View, present: bool):
        try:
            plot, round_no, _ = (value or "").rsplit(":", 2)
            round_no = int(round_no)
        except ValueError:
            return {}
        if plot == "timeline-plot":
            return run.round_view(v.with_round(replace(view, present=bool(present)), round_no))
        side = "a" if plot.endswith("-a") else "b"
        return cmp.side(side, resolve(a if side == "a" else b, view), round_no, bool(present))

    return handler
