"""`scheduler collect` and `scheduler train`: the offline half of SPEC 5.

collect: for sampled rounds of real prompts, from the same starting state, run
every schedule tau in {0,1}^D through drafting and target verification (caches
rolled back after each), recording A, t_D, t_V and the candidate features at
every step; one JSON line per round, appended, so a run can be resumed.

train: fit f_theta with 5-fold CV grouped by prompt, select the compact tree
features by that CV, compute margin labels on canonical states and fit g_psi
(17-64-32-1 for D = 5); write the scheduler file.
"""
from __future__ import annotations

import gzip
import itertools
import json
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..config import DraftingConfig, GenerationConfig
from ..models import host
from ..methods import Decision, Fixed, MethodSpec, StepState
from .features import PAPER_SIX, TREE_CANDIDATES, FeatureTracker, context_names
from .costs import CostProfile, retime
from .policy import NumpyMLP, SchedulerFile
from .value import (MIN_GAIN, canonical, decision_threshold, heldout_sign_agreement, margin_labels, select_features,
                    step_rows, train_regressor, value_inputs)

G_HIDDEN = [64, 32]
VALUE_HIDDEN = [64, 64]


class RecordingPolicy(Fixed):
    """A fixed schedule that also computes every candidate feature before each step."""

    def __init__(self, schedule, width: int, top_k: int):
        super().__init__(schedule)
        self.tracker = FeatureTracker(width, top_k)

    def start_round(self) -> None:
        self.tracker.start_round()

    def decide(self, st: StepState) -> Decision:
        tree, ctx = self.tracker.all_features(st)
        d = super().decide(st)
        d.features = [tree[n] for n in TREE_CANDIDATES] + ctx
        return d


def collect(engine, prompts, out: Path, drafting: DraftingConfig, rounds_per_prompt: int = 6,
            max_new_tokens: int = 96, max_minutes: float = 30.0, behaviour: tuple[int, ...] = (1, 0, 1, 0, 1)) -> int:
    """Append one line per sampled round to `out`; prompts already there are skipped (resume)."""
    done = set()
    if out.exists():
        done = {json.loads(ln)["prompt_id"] for ln in out.read_text().splitlines() if ln.strip()}
    schedules = list(itertools.product([0, 1], repeat=drafting.depth))
    gen = GenerationConfig(max_new_tokens=max_new_tokens)
    deadline = time.time() + 60 * max_minutes
    written = 0
    todo = [p for p in prompts if p.id not in done]
    if todo:  # t_mid as a run measures it, so the scheduler reads it as it was trained
        engine.calibrate_mid(engine.encode(todo[0].messages), drafting)
    with out.open("a") as f, tqdm(total=len(todo) * rounds_per_prompt, desc="collect rounds") as bar:
        for prompt in todo:
            if time.time() > deadline:
                break
            s = engine.start(engine.encode(prompt.messages), MethodSpec("fixed"),
                             drafting.model_copy(update={"schedule": behaviour}), gen)
            engine.speculative_round(s)  # warm the timing estimates
            lines = []
            for r in range(rounds_per_prompt):
                if engine.finished(s) or time.time() > deadline:
                    break
                trajs = []
                for tau in schedules:
                    v = engine.trial_round(s, RecordingPolicy(tau, drafting.width, drafting.top_k))
                    trajs.append({"schedule": list(tau), "A": v.acc.accepted_tokens, "t_draft": v.draft_s,
                                  "t_verify": v.verify_s, "verified": len(v.kept),
                                  "step_s": [st.draft_s for st in v.steps],
                                  "features": [st.features for st in v.steps]})
                lines.append({"prompt_id": prompt.id, "category": prompt.category, "round": r,
                              "prompt_len": s.prompt_len, "verify_ms": engine.pruner.verify_cost.ms,
                              "trajectories": trajs})
                engine.speculative_round(s)
                s.rounds += 1
                bar.update(1)
            for line in lines:  # a prompt is written whole, so resuming never duplicates rounds
                f.write(json.dumps(line) + "\n")
            f.flush()
            written += len(lines)
    return written


def read_dataset(path: Path) -> list[dict]:
    """Collected rounds, one JSON line each (gzipped where the name ends in .gz)."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


def train(records: list[dict], depth: int, select: bool = True, log=print, seed: int = 0, n_keep: int = 6,
          candidates: list[str] | None = None, bonus: float = 1.0, features: list[str] | None = None,
          profiles: list[CostProfile] | None = None, heldout: bool = True) -> SchedulerFile:
    """The scheduler file from collected rounds. `profiles`: train on the rounds re-timed under each of these
    hosts' costs (costs.py) instead of as collected (tree features are still selected on the rounds as
    collected: which tree signals matter does not depend on the host); `features`: these, no selection."""
    rows = step_rows(records, depth)
    log(f"dataset: {len(records)} rounds, {len(rows.A)} step rows, {len(np.unique(rows.group))} prompts")
    table: list = []
    if features is not None:
        names = list(features)
    elif select:
        log(f"feature selection (greedy forward, 5-fold CV grouped by prompt, f_theta held-out MSE, "
            f"stops below a {100 * MIN_GAIN:.0f}% gain):")
        names, table = select_features(rows, n_keep=n_keep, candidates=candidates, log=log)
    else:
        names = list(PAPER_SIX)
    source = None
    if profiles:
        source = CostProfile.of_records(records)
        records = [rec for prof in profiles for rec in retime(records, source, prof)]
        rows = step_rows(records, depth)
        log(f"re-timed under {len(profiles)} cost profiles ({', '.join(p.name for p in profiles)}): "
            f"{len(rows.A)} step rows")
    idx = [TREE_CANDIDATES.index(n) for n in names]
    x = value_inputs(rows, idx)
    y = np.stack([rows.A, rows.t], 1)
    net, xn, yn = train_regressor(x, y, VALUE_HIDDEN, epochs=600, seed=seed)
    z, margin = margin_labels(rows, idx, net, xn, yn, depth, bonus)
    pays = float((margin > 0).mean())
    log(f"margin labels: {len(z)} canonical states, share where calling the mid pays (> 0): {pays:.3f}")
    g, gx, gy = train_regressor(z, margin[:, None], G_HIDDEN, epochs=1500, seed=seed)
    g_np = NumpyMLP.from_torch(g, gx, gy).clip_to(z)
    pred = g_np(z)[:, 0]
    agree = float(np.mean((pred > 0) == (margin > 0)))
    heldout = heldout_sign_agreement(z, margin, rows.group[canonical(rows)], G_HIDDEN, 1500, seed) \
        if heldout else None
    log(f"g_psi: {g_np.n_params} parameters, sign agreement with the margin labels {agree:.3f} "
        f"(training states), {heldout if heldout is None else round(heldout, 3)} (held-out prompts, 5 folds)")
    tau = decision_threshold(pred, margin)
    log(f"decision threshold tau = {tau:.4f}: mid called on {float((pred > tau).mean()):.3f} of the states "
        f"(labels > 0: {pays:.3f}), summed margin {float(margin[pred > tau].sum()):.2f} "
        f"vs {float(margin[pred > 0].sum()):.2f} at tau = 0")
    ctx = rows.ctx
    names_ctx = context_names(depth)[: ctx.shape[1]]
    meta = {"context_features": names_ctx, "cv_table": table, "eta_bonus": bonus, "n_params": g_np.n_params,
            "sign_agreement": agree, "sign_agreement_heldout": heldout, "share_mid_pays": pays,
            "mid_called_share": float((pred > tau).mean()), "rounds": len(records), "hardware": host(),
            "cost_profiles": [p.name for p in profiles] if profiles else None,
            "timings": source_timings(ctx, names_ctx, source),
            "trained_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    return SchedulerFile(depth, names, g_np, NumpyMLP.from_torch(net, xn, yn), meta, tau)


def source_timings(ctx: np.ndarray, names: list[str], source: CostProfile | None) -> dict:
    """The timing inputs a policy uses before it has measured its own (policy.with_timings)."""
    col = {n: i for i, n in enumerate(names)}
    out = {"t_target_ms": float(np.median(ctx[:, col["t_target_ms"]])),
           "t_mid_ms": float(np.median(ctx[:, col["t_mid_ms"]]))}
    if "verify_growth" in col:
        out["verify_growth"] = source.growth if source else float(np.median(ctx[:, col["verify_growth"]]))
    return out
