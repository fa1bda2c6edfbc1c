"""`python -m treegraft bench`: every method on the same prompts, interleaved, speedups as ratios of one run.

For each prompt (after one warm-up generation) the methods run back to back, in
a rotating order, so machine drift hits all alike. Methods are isolated: every
generation starts from the same calibrated engine state (`Engine.state()` taken
after the warm-ups: cost curve T(n), acceptance model, timing means), so no method
runs on what the one before it taught the engine. Speedup of a method on a
prompt = AR's wall time / the method's wall time for the same prompt and the
same new tokens (greedy outputs are identical, which the run checks and reports).
Writes DIR/results.json, DIR/results.csv and DIR/report.md.
"""
from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .config import ConfigError, DraftingConfig, GenerationConfig, with_overrides
from .methods import MethodSpec
from .models import host
from .profile import BOOKKEEPING_PARTS, FORWARD_PARTS
from .prompts import Prompt


@dataclass(frozen=True)
class BenchMethod:
    label: str
    spec: MethodSpec
    drafting: DraftingConfig
    pair: str | None = None  # run on another pair's engine (same target, another mid); None: the bench's pair


# knob suffixes of a bench label: `:d=6` sets DraftingConfig.depth, and so on (the names of SPEC 2)
KNOBS = {"d": "depth", "w": "width", "k": "top_k", "b": "budget", "span": "span_max", "n": "ngram_max",
         "cap": "verify_cost_cap", "scores": "scores", "lv": "mid_levels", "corpus": "corpus",
         "sp": "small_pool", "ex": "expand", "pf": "mid_prefill", "gate": "mid_gate", "mk": "mid_top_k",
         "lead": "lead", "dg": "depth_gate", "ml": "mid_lead"}


def parse_methods(text: str, drafting: DraftingConfig) -> list[BenchMethod]:
    """Comma-separated labels: a method name, optionally with suffixes, and @PAIR to run it on another pair of
    models.yaml (e.g. all-mid@smollm2-lm: the same target with another mid, side by side in one run).

    Suffixes: :no-eg / :no-nd (ablations), :s=10101 (the fixed schedule), :adaptive / :fixed-budget, and
    the drafting knobs of KNOBS: :d=N (depth D), :w=N (width W), :k=N (top-K), :b=N (B_ver), :span=N
    (copied spans, 0: off), :n=N (n-gram order), :cap=X (verify-cost cap), :lv=N (mid pool bound),
    :scores=paper|calibrated (how a node's p is set, tree.py), :sp=paper|shared (a small step's pool,
    tree.small_sites), :ex=all|keepable (which pool nodes a step expands, prune.expandable), :corpus=off (the
    n-gram drafter without the pair's corpus), :pf=off (the mid fed the prompt by its first call, not in the
    prefill), :gate=yield|off (treegraft's step 1 by the request's yield gate, scheduler/online.py), :mk=N (K of a
    mid step alone), :lead=nodes|path (which logits rows the verification batches with the root's,
    prune.lead_rows), :dg=yield|off (the depth gate: how many of the D steps a round takes, scheduler/depth.py),
    :ml=N (a gated call round's first N steps the mid's).
    So one run can sweep the tree's shape side by side, e.g.
    `all-small,all-small:d=3,all-small:w=4:k=2`.
    Values are validated as in models.yaml."""
    out = []
    for label in [m.strip() for m in text.split(",") if m.strip()]:
        body, _, pair = label.partition("@")
        name, *mods = body.split(":")
        update: dict = {}
        for mod in mods:
            key, eq, val = mod.partition("=")
            if key == "s" and eq:
                update["schedule"] = tuple(val)
            elif key in KNOBS and eq:
                update[KNOBS[key]] = val  # pydantic parses and range-checks it below
            elif mod in ("adaptive", "fixed-budget"):
                update["adaptive_budget"] = mod == "adaptive"
            elif mod not in ("no-eg", "no-nd"):
                raise ConfigError(f"unknown suffix {mod!r} in bench method {label!r}: use no-eg, no-nd, s=BITS, "
                                 f"adaptive, fixed-budget or {', '.join(k + '=VALUE' for k in KNOBS)}")
        try:
            d = with_overrides(drafting, **update)
        except ConfigError as err:
            raise ConfigError(f"bench method {label!r}: {err}") from None
        spec = MethodSpec(name, eg="no-eg" not in mods, nd="no-nd" not in mods)
        out.append(BenchMethod(label, spec, d, pair or None))
    if not any(m.spec.name == "ar" for m in out):
        out.insert(0, BenchMethod("ar", MethodSpec("ar"), drafting))
    return out


def run_row(engine, prompt: Prompt, ids: list[int], m: BenchMethod, gen: GenerationConfig, rep: int) -> dict:
    res = engine.generate(ids, m.spec, m.drafting, gen)
    s = res.summary()
    mid_steps = [st for r in res.rounds for st in r.steps if st.action == "mid"]
    resel = [st.reselect_rate for st in mid_steps if st.reselect_rate is not None]
    all_steps = [st for r in res.rounds for st in r.steps]
    peer = m.spec.hf_peer  # the Hugging Face peers have no rounds of ours: their per-round figures are None ("-")
    return {
        "prompt_id": prompt.id, "category": prompt.category, "method": m.label, "repeat": rep,
        "new_tokens": len(res.new_tokens), "tokens": res.new_tokens, "wall_s": s["wall_s"],
        "rounds": s["rounds"], "mean_accepted": None if peer else s["mean_accepted"],
        "tokens_per_round": None if peer else s["tokens_per_round"],
        "tokens_per_s": s["tokens_per_s"], "draft_s": s["draft_s"], "verify_s": s["verify_s"],
        "prefill_s": s["prefill_s"], "mid_calls": s["mid_calls"], "sched_s": s["sched_s"], "hf_peer": peer,
        "steps": len(all_steps),
        "mid_pool": float(np.mean([len(st.pool) for st in mid_steps])) if mid_steps else None,
        "mid_nk": float(np.mean([st.n_k for st in mid_steps])) if mid_steps else None,
        "reselect_rate": float(np.mean(resel)) if resel else None,
        "profile_ms": round_profile(res.rounds),
        "notes": s["notes"],
    }


def round_profile(rounds) -> dict:
    """Total ms per part of the rounds (model forwards and the engine's bookkeeping: treegraft/profile.py)."""
    total: dict[str, float] = {}
    for r in rounds:
        for k, v in r.profile_ms.items():
            total[k] = total.get(k, 0.0) + v
    return total


def warm_up(engine, prompt_ids: list[int], drafting, gen: GenerationConfig,
            methods: tuple[str, ...] = ("ar", "all-small", "treegraft")):
    """The bench's warm-up for the scripts that time live generations beside it: each method once, 8 new tokens, on
    one prompt (every code path, the calibration of T(n), off the clock). Returns the calibrated state each timed
    generation then starts from (`Engine.restore`), as the bench's rows do."""
    for m in methods:
        engine.generate(prompt_ids, MethodSpec(m), drafting, gen.model_copy(update={"max_new_tokens": 8}))
    return engine.state()


def run_bench(engine, prompts: list[Prompt], methods: list[BenchMethod], gen: GenerationConfig,
              repeats: int = 1, progress: bool = True, others: dict | None = None) -> list[dict]:
    """Rows of every method on every prompt; `others` maps a pair name to its engine (methods labelled @PAIR)."""
    def engine_of(m: BenchMethod):
        return (others or {}).get(m.pair, engine)

    rows = []
    warm = engine.encode(prompts[0].messages)
    for m in methods:  # warm-up: every code path once (and the calibration of T(n), off the clock)
        run_row(engine_of(m), prompts[0], warm, m, gen.model_copy(update={"max_new_tokens": 8}), -1)
    share_host_costs(engine, list((others or {}).values()))
    calibrated = {id(e): (e, e.state()) for e in [engine, *(others or {}).values()]}
    total = len(prompts) * len(methods) * repeats
    with tqdm(total=total, desc="bench", disable=not progress) as bar:
        for i, prompt in enumerate(prompts):
            ids = engine.encode(prompt.messages)
            for rep in range(repeats):
                shift = (i + rep) % len(methods)
                for m in methods[shift:] + methods[:shift]:
                    e, state = calibrated[id(engine_of(m))]
                    e.restore(state)
                    rows.append(run_row(engine_of(m), prompt, ids, m, gen, rep))
                    bar.update(1)
    add_speedups(rows)
    return rows


def same_target(a, b) -> bool:
    """Two engines run the same target model, dtype and device (pairs that differ only in their mid or scheduler)."""
    return (a.pair.config.target == b.pair.config.target and a.target.dtype == b.target.dtype
            and a.device == b.device)


def share_host_costs(engine, others: list) -> None:
    """Engines of other pairs (@PAIR methods) with the bench pair's target take its measured costs (T(n), B_ver,
    threads: `Pruner.share_host`), so their methods verify and cut as the bench pair's do. Each engine used to keep
    its own calibration, one noisy probe apart: in one run the second engine's trees were cut to another B_ver, and
    an A/B of two schedulers measured the calibrations as much as the schedulers."""
    if not engine.pruner.verify_cost:
        return
    for other in others:
        if same_target(engine, other):
            other.pruner.share_host(engine.pruner)
    if engine.pruner.threads:
        torch.set_num_threads(engine.pruner.threads)  # process-wide: the last engine calibrated set it


def add_speedups(rows: list[dict]) -> None:
    ar = {(r["prompt_id"], r["repeat"]): r for r in rows if r["method"] == "ar"}
    for r in rows:
        base = ar[(r["prompt_id"], r["repeat"])]
        r["speedup"] = base["wall_s"] / r["wall_s"]
        r["decode_speedup"] = decode_s(base) / decode_s(r)
        r["exact"] = r["tokens"] == base["tokens"]


def decode_s(row: dict) -> float:
    """A generation's time after its prefill: the part speculation changes (the prefill is the same target forward in
    every method; with 64 new tokens it is ~20% of a speculative method's wall time on a 2-core CPU)."""
    return max(row["wall_s"] - row["prefill_s"], 1e-9)


PAIRED_BASES = ("all-small", "all-mid")  # the single drafters a method is paired against (`paired`)


def paired(rows: list[dict], bases: tuple[str, ...] = PAIRED_BASES) -> dict:
    """{"method / base": {"all" | category: figures}}: per prompt and repeat, the base's time over the method's, end to
    end and after the prefill (`decode_s`), each mean with its 95% bootstrap interval; for every method but AR
    against each base of `bases` (the single drafters) that ran."""
    by = {(r["method"], r["prompt_id"], r["repeat"]): r for r in rows}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    out = {}
    for base in (b for b in bases if b in methods):
        for m in (m for m in methods if m not in ("ar", base) and not (m in PAIRED_BASES and base == "all-mid")):
            pairs = [(by[k], by[(base, *k[1:])]) for k in by if k[0] == m and (base, *k[1:]) in by]
            groups = {"all": pairs}
            for r, b in pairs:
                groups.setdefault(r["category"], []).append((r, b))
            out[f"{m} / {base}"] = {g: paired_figures(ps) for g, ps in groups.items()}
    return out


def paired_figures(pairs: list[tuple[dict, dict]]) -> dict:
    """(method row, base row) pairs -> the base's time over the method's, mean and 95% interval, end to end and
    after the prefill."""
    e2e = [b["wall_s"] / r["wall_s"] for r, b in pairs]
    dec = [decode_s(b) / decode_s(r) for r, b in pairs]
    return {"ratio": float(np.mean(e2e)), "ci95": bootstrap_ci(e2e), "decode": float(np.mean(dec)),
            "decode_ci95": bootstrap_ci(dec), "n": len(pairs)}


PER_ROUND_FIGURES = ("mean_accepted", "tokens_per_round", "draft_share", "verify_share", "mid_calls_per_round",
                     "steps_per_round", "mid_call_rate_per_step", "sched_ms_per_step", "draft_ms_per_round",
                     "verify_ms_per_round", "other_ms_per_round", "overhead_share")


def summarise(rows: list[dict], key: str | None = None) -> dict:
    """Mean figures per method (and per `key`, e.g. category)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["method"], r[key] if key else "all"), []).append(r)

    def mean(vals):
        vals = [v for v in vals if v is not None]
        return float(np.mean(vals)) if vals else None

    out = {}
    for (method, cat), rs in groups.items():
        draft, verify = sum(r["draft_s"] for r in rs), sum(r["verify_s"] for r in rs)
        wall = max(1e-9, sum(r["wall_s"] for r in rs))
        pool, nk = mean([r["mid_pool"] for r in rs]), mean([r["mid_nk"] for r in rs])
        mid_calls = sum(r["mid_calls"] for r in rs)
        fig = {
            "speedup": mean([r["speedup"] for r in rs]),
            "speedup_ci95": bootstrap_ci([r["speedup"] for r in rs]),
            "decode_speedup": mean([r.get("decode_speedup") for r in rs]),
            "mean_accepted": mean([r["mean_accepted"] for r in rs]),
            "tokens_per_round": mean([r["tokens_per_round"] for r in rs]),
            "tokens_per_s": mean([r["tokens_per_s"] for r in rs]),
            "draft_share": draft / wall,
            "verify_share": verify / wall,
            "mid_calls_per_round": mid_calls / max(1, sum(r["rounds"] for r in rs)),
            "steps_per_round": sum(r["steps"] for r in rs) / max(1, sum(r["rounds"] for r in rs)),  # D, or the gate's
            "mid_call_rate_per_step": mid_calls / max(1, sum(r["steps"] for r in rs)),
            "sched_ms_per_step": 1000 * sum(r["sched_s"] for r in rs) / max(1, sum(r["steps"] for r in rs)),
            "mid_pool": pool,
            "pool_over_nk": pool / nk if pool and nk else None,  # N_k = 0 (nothing to expand): no ratio
            "reselect_rate": mean([r["reselect_rate"] for r in rs]),
            "mid_ms_per_call": (sum(r["profile_ms"].get("mid_forward", 0.0) for r in rs) / mid_calls)
            if mid_calls else None,
            "exact_rate": mean([float(r["exact"]) for r in rs]),
            **per_round_ms(rs),
            **overhead(rs),
            "n": len(rs),
        }
        if all(r.get("hf_peer") for r in rs):  # no rounds of ours: the per-round figures do not apply
            fig.update({k: None for k in PER_ROUND_FIGURES})
        out.setdefault(method, {})[cat] = fig
    return out


def bootstrap_ci(values: list[float], n: int = 2000, seed: int = 0) -> list[float] | None:
    """95% interval of the mean by bootstrap over the rows (prompts x repeats); None for one row."""
    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=float)
    means = x[np.random.default_rng(seed).integers(0, len(x), (n, len(x)))].mean(1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def per_round_ms(rs: list[dict]) -> dict:
    rounds = max(1, sum(r["rounds"] for r in rs))
    draft, verify = sum(r["draft_s"] for r in rs), sum(r["verify_s"] for r in rs)
    other = sum(decode_s(r) for r in rs) - draft - verify
    return {"draft_ms_per_round": 1000 * draft / rounds, "verify_ms_per_round": 1000 * verify / rounds,
            "other_ms_per_round": 1000 * max(other, 0.0) / rounds}


def overhead(rs: list[dict]) -> dict:
    """The overhead profile: ms per round of each part, and bookkeeping's share of the rounds' time."""
    rounds = max(1, sum(r["rounds"] for r in rs))
    parts = {k: sum(r["profile_ms"].get(k, 0.0) for r in rs) / rounds for k in FORWARD_PARTS + BOOKKEEPING_PARTS}
    total = sum(parts.values())
    book = sum(parts[k] for k in BOOKKEEPING_PARTS)
    return {"profile_ms_per_round": parts, "overhead_share": book / total if total else None}


def write_outputs(out: Path, rows: list[dict], meta: dict, png: bool = True) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    summary = {"overall": summarise(rows), "per_category": summarise(rows, "category"), "paired": paired(rows)}
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    fields = [k for k in rows[0] if k not in ("tokens", "notes", "profile_ms")]
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    from .bench_plots import write_plots

    pngs = write_plots(out, summary, png)
    (out / "report.md").write_text(report(summary, meta) + "".join(f"\n![{p[:-4]}]({p})\n" for p in pngs))
    return summary


def paired_table(pairs: dict, cats: list[str]) -> list[str]:
    """Each method against each single drafter, paired per prompt and repeat (`paired`): overall with 95% intervals,
    end to end and after the prefill, then the latter per category."""
    if not pairs:
        return []

    def ci(v):
        return f"{v[0]:.3f}-{v[1]:.3f}" if v else "-"

    lines = ["", "## Paired against each single drafter", "",
             "Per prompt and repeat, the single drafter's time over the method's (greedy outputs are identical); end to "
             "end, and after the prefill (the same target forward in every method, which speculation cannot change).",
             "", "| method / drafter | end to end | 95% interval | after the prefill | 95% interval | "
             + " | ".join(f"{c} (after the prefill)" for c in cats) + " |", "|---|---|---|---|---|" + "---|" * len(cats)]
    for name, g in pairs.items():
        a = g["all"]
        lines.append(f"| {name} | {a['ratio']:.3f}x | {ci(a['ci95'])} | {a['decode']:.3f}x | {ci(a['decode_ci95'])} | "
                     + " | ".join(f"{g[c]['decode']:.3f}" if c in g else "-" for c in cats) + " |")
    return lines


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def report(summary: dict, meta: dict) -> str:
    lines = [f"# TreeGraft benchmark: pair `{meta['pair']}`", "",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}  ",
             f"Background load: {meta.get('background_load', 0)} CPU-bound process(es) beside the run  ",
             f"dtype {meta['dtype']}, {meta['prompts']} prompts x {meta['max_new_tokens']} new tokens x "
             f"{meta['repeats']} repeat(s), greedy, {meta['date']}", ""] + cost_table(meta) + kernel_table(meta)
    lines += ["",
              "| method | speedup vs AR | 95% interval | after the prefill | mean A | tokens/round | tokens/s | draft share | "
              "verify share | mid calls/round | steps/round | sched ms/step | mid pool | pool/N_k | reselect | exact |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for method, cats in summary["overall"].items():
        s = cats["all"]
        ci = s["speedup_ci95"]
        lines.append(f"| {method} | {fmt(s['speedup'])}x | {f'{ci[0]:.2f}-{ci[1]:.2f}' if ci else '-'} | "
                     f"{fmt(s.get('decode_speedup'))}x | {fmt(s['mean_accepted'])} | {fmt(s['tokens_per_round'])} | "
                     f"{fmt(s['tokens_per_s'], '.1f')} | {fmt(s['draft_share'])} | {fmt(s['verify_share'])} | "
                     f"{fmt(s['mid_calls_per_round'])} | {fmt(s['steps_per_round'])} | "
                     f"{fmt(s['sched_ms_per_step'], '.3f')} | "
                     f"{fmt(s['mid_pool'], '.1f')} | {fmt(s['pool_over_nk'])} | {fmt(s['reselect_rate'])} | "
                     f"{fmt(s['exact_rate'])} |")
    cats = sorted({c for m in summary["per_category"].values() for c in m})
    lines += ["", "## Speedup over AR per category", "", "| method | " + " | ".join(cats) + " |",
              "|---|" + "---|" * len(cats)]
    for method, by_cat in summary["per_category"].items():
        lines.append(f"| {method} | " + " | ".join(fmt(by_cat.get(c, {}).get("speedup")) for c in cats) + " |")
    return "\n".join(lines + category_table(summary, cats, "speedup_ci95", "95% interval of the speedup per category")
                     + paired_table(summary.get("paired") or {}, cats)
                     + category_table(summary, cats, "mid_call_rate_per_step", "Mid calls per draft step, per category")
                     + mid_cost_table(summary, meta) + overhead_table(summary)) + "\n"


def cost_table(meta: dict) -> list[str]:
    """The host's verification cost T(tokens) (the calibration's probes, a monotone fit), against T(1) and the
    memory floor, and the B_ver it allows; below it the same curve refined by the run's rounds (what the cut
    prices)."""
    host = meta.get("host") or {}
    curve = {int(k): v for k, v in (host.get("verify_ms") or {}).items()}
    if not curve:
        return ["Verification cost: not measured (no adaptive budget in this run)  "]
    t1 = curve.get(1)
    lines = ["## Verification cost on this host", "",
             f"One target forward over n tokens (root + n - 1 tree nodes), ms; memory floor of a step (reading every "
             f"weight once) {fmt(host.get('memory_floor_ms'), '.1f')} ms; one logits row computed alone (lazy head) "
             f"{fmt(host.get('row_ms'), '.1f') + ' ms' if host.get('row_ms') else 'not seen (the lead rows held every row read)'}"
             f". **B_ver on this host: {host.get('b_ver')}** nodes; torch threads "
             f"chosen by the calibration: {host.get('threads') or '-'}. T: the calibration's interleaved probes "
             f"(what B_ver reads); T in rounds: that fit refined by the verified rounds (what the cut prices).", "",
             "| tokens | " + " | ".join(str(n) for n in curve) + " |", "|---|" + "---|" * len(curve),
             "| T ms | " + " | ".join(f"{v:.1f}" for v in curve.values()) + " |"]
    if t1:
        lines.append("| / T(1) | " + " | ".join(f"{v / t1:.2f}" for v in curve.values()) + " |")
    rounds = {int(k): v for k, v in (host.get("verify_ms_rounds") or {}).items()}
    if rounds and rounds != curve:
        lines.append("| T in rounds ms | " + " | ".join(fmt(rounds.get(n), ".1f") for n in curve) + " |")
    return lines


def kernel_paths(engine) -> dict:
    """What the small-batch CPU paths measured at load (cpu_kernels): per part, the path chosen at each row bucket
    and every path's ms there. Parts: the target's layers and head, the mid's layers, the mid's output rows."""
    parts = {}
    for name, owner in (("target", engine.pair.target), ("mid", engine.pair.mid),
                        ("mid rows", getattr(engine.mid, "scorer", None))):
        table = getattr(owner, "kernel_table", None)
        for part, ms in (table.ms.items() if table else ()):
            label = name if name == "mid rows" else f"{name} {'layers' if part == 'body' else part}"
            parts[label] = {"chosen": dict(getattr(table, part)), "ms": ms,
                            "prefetch": dict(table.prefetch.get(part, {})), "cold": table.cold}
    return parts


def runtime_line(rt: dict | None) -> str:
    if not rt:
        return ""
    return (f" Torch threads: {rt['threads']}; the packed kernel runs on {rt['packed_threads'] or 'none (not built)'}"
            f"; the target's attention: `{rt['attention']}`"
            + (f"; the draft head's forward: `{rt['head_forward']}`" if rt.get("head_forward") else "") + ".")


def kernel_table(meta: dict) -> list[str]:
    """Per part and row bucket: the path chosen at load (the packed one with its prefetch distance), its ms per layer
    and stock F.linear's (the part's largest layer shape)."""
    parts = meta.get("kernels") or {}
    if not parts:
        return []
    buckets = sorted({int(b) for p in parts.values() for b in p["chosen"]})
    lines = ["", "## CPU paths chosen at load", "",
             "Per part, its largest layer shape timed at every row bucket by `cpu_kernels` when the pair loaded "
             "(streaming through the layers of that shape; a drafter's part, marked cold, with the caches emptied "
             "before each call, as a call meets it after the target's forward): the path chosen (packed@d: the packed "
             "kernel prefetching d floats ahead), its ms per layer / stock `F.linear`'s ms; the last column's path "
             "also takes every longer batch (a prompt's prefill; measured for the layers only)."
             + runtime_line(meta.get("runtime")), "",
             "| part | " + " | ".join(f"{b} rows" for b in buckets) + " |", "|---|" + "---|" * len(buckets)]
    for label, p in parts.items():
        chosen, ms, pf = ({int(k): v for k, v in d.items()} for d in (p["chosen"], p["ms"], p.get("prefetch", {})))
        name = {b: f"packed@{pf[b]}" if c == "packed" and b in pf else c for b, c in chosen.items()}
        lines.append(f"| {label}{' (cold)' if p.get('cold') else ''} | " + " | ".join(
            f"{name[b]} {ms[b][chosen[b]]:.3f} / {ms[b]['stock']:.3f}" if b in chosen else "-" for b in buckets) + " |")
    return lines


def category_table(summary: dict, cats: list[str], key: str, title: str) -> list[str]:
    """One figure per method and category; methods where it never applies are left out."""
    rows = [(m, by_cat) for m, by_cat in summary["per_category"].items()
            if any(by_cat.get(c, {}).get(key) is not None for c in cats) and m != "ar"]
    if not rows:
        return []

    def cell(v):
        return "-" if v is None else (f"{v[0]:.2f}-{v[1]:.2f}" if isinstance(v, list) else f"{v:.2f}")

    lines = ["", f"## {title}", "", "| method | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
    return lines + [f"| {m} | " + " | ".join(cell(by_cat.get(c, {}).get(key)) for c in cats) + " |" for m, by_cat in rows]


def mid_cost_table(summary: dict, meta: dict | None = None) -> list[str]:
    """The mid's forward per call against AR's target forward per token (the issue's cost ratio); and, where the
    yield gate ran, what a step-1 call added to a whole round in the trial rounds at load (its cost)."""
    ar = summary["overall"].get("ar", {}).get("all")
    ar_ms = ar["profile_ms_per_round"]["target_forward"] if ar else None
    rows = [(m, c["all"]["mid_ms_per_call"]) for m, c in summary["overall"].items()
            if c["all"].get("mid_ms_per_call") is not None]
    if not rows or not ar_ms:
        return []
    lines = ["", "## Mid step cost", "", f"AR's target forward: {ar_ms:.1f} ms per token.", "",
             "| method | mid forward ms per call | / target step |", "|---|---|---|"]
    lines += [f"| {m} | {ms:.1f} | {ms / ar_ms:.2f} |" for m, ms in rows]
    call = ((meta or {}).get("host") or {}).get("step1_call_ms")
    if call:
        lines += ["", f"A step-1 mid call added **{call:.1f} ms** to a round ({call / ar_ms:.2f} of a target step) in the "
                  "trial rounds at load (`Engine.calibrate_call`: the call, the verification of its nodes, their rows; "
                  "reported only: the yield gate prices each call round by its own parts)."]
    return lines


def overhead_table(summary: dict) -> list[str]:
    parts = FORWARD_PARTS + BOOKKEEPING_PARTS
    lines = ["", "## Where a round's time goes (ms per round)", "",
             "Model forwards vs the engine's own bookkeeping (treegraft/profile.py); `other` is Python glue "
             "between the timed parts.", "",
             "| method | " + " | ".join(parts) + " | bookkeeping share |", "|---|" + "---|" * (len(parts) + 1)]
    for method, cats in summary["overall"].items():
        s = cats["all"]
        ms, share = s["profile_ms_per_round"], s["overhead_share"]
        if share is None:  # the Hugging Face peers: no rounds of ours
            continue
        lines.append(f"| {method} | " + " | ".join(fmt(ms[k]) for k in parts) + f" | {fmt(100 * share, '.1f')}% |")
    return lines


def bench_meta(pair: str, engine, prompts, gen, repeats, command: str, drafting=None, background: int = 0) -> dict:
    """The run's settings and what the host measured (the calibrated T(n), the memory floor, the B_ver it allows)."""
    costs = engine.host_costs(drafting)
    return {"pair": pair, "dtype": engine.dtype_name, "prompts": len(prompts),
            "max_new_tokens": gen.max_new_tokens, "repeats": repeats, "command": command,
            "machine": host(), "date": time.strftime("%Y-%m-%d %H:%M"), "background_load": background,
            "host": costs, "kernels": kernel_paths(engine), "runtime": runtime(engine)}


def runtime(engine) -> dict:
    """Torch's intra-op threads, how many of them the packed kernel runs on, the target's attention function, how
    a draft head's forward runs (`DraftHead.path`)."""
    from .cpu_kernels import packed_threads

    return {"threads": torch.get_num_threads(), "packed_threads": packed_threads(),
            "attention": getattr(engine.pair.target.config, "_attn_implementation", None),
            "head_forward": getattr(engine.pair.mid, "path", None)}
