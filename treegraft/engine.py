"""The round loop: draft (D steps on one shared tree), prune, verify, accept, commit -> RoundTrace.

`Engine` owns a loaded pair; `Engine.rounds(...)` yields one RoundTrace per
speculative round (or per token for `ar`), `Engine.generate(...)` collects them
into a GenerationResult. One Engine serves one generation at a time. Components
time themselves (treegraft/profile.py); the round only marks its stage edges.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from .accept import Acceptance, accept, next_token
from .config import DraftingConfig, GenerationConfig
from .drafters import make_mid_drafter
from .drafters.ngram import NgramIndex
from .kv import Stopwatch
from .drafters.cascade import Cascade
from .methods import SCHEDULED, AllMid, MethodSpec, RoundOutcome, StepState, Stepwise, build_method, yield_gated
from .models import LoadedPair
from .profile import Profile
from .scheduler.depth import DepthGate
from .prompt_check import PromptError, check_length, check_special_only, check_text
from .prompts import chat_ids
from .prune import Pruner, probe_sizes
from .target import TargetModel
from .trace import GenerationResult, RoundTrace, StepTrace, TreeSnapshot
from .tree import DraftTree


@dataclass
class Session:
    """The state of one generation, carried across rounds."""

    committed: list[int]  # prompt + accepted tokens
    prompt_len: int
    drafting: DraftingConfig
    gen: GenerationConfig
    method: MethodSpec
    plan: Stepwise | Cascade | None  # how a round drafts (None: plain autoregressive decoding)
    ngram: NgramIndex
    generator: torch.Generator | None
    device: torch.device
    rounds: int = 0
    t_target_ms: float = 0.0  # running means: the scheduler's timing inputs
    t_mid_ms: float = 0.0
    verify_growth: float = 0.0  # log T(8) / T(0) measured at load (the pruner's calibration)
    prompt_at_first_call: bool = False  # the mid is still to read the prompt, at its first call (not in the prefill)
    depth_gate: DepthGate | None = None  # how many draft steps a round takes (None: D; scheduler/depth.py)
    notes: list[str] = field(default_factory=list)

    @property
    def new_tokens(self) -> list[int]:
        return self.committed[self.prompt_len:]

    def step_state(self, tree: DraftTree, k: int, actions: list[int]) -> StepState:
        return StepState(k, self.drafting.depth, tree, list(actions), self.prompt_len, self.t_target_ms,
                         self.t_mid_ms, self.verify_growth)


@dataclass
class Verified:
    """A drafted and verified round, nothing committed yet."""

    tree: DraftTree
    steps: list[StepTrace]
    kept: np.ndarray  # [n] verified non-root nodes
    acc: Acceptance
    draft_s: float
    verify_s: float  # prune + verification forward + acceptance
    forward_ms: float = 0.0  # the verification forward alone (T(n) learns from it)
    row_ms: float | None = None  # acceptance's time per logits row it computed lazily (None: none was)


@dataclass(frozen=True)
class EngineState:
    """What an engine learns across generations: the pruner (cost curve T(n), acceptance model) and the
    scheduler's timing means. `Engine.state()` freezes a copy, `Engine.restore()` puts it back: the benchmark
    starts every generation from one calibrated state, so no method inherits what another taught."""

    pruner: Pruner
    timing_ms: dict


CPU_THREADS = torch.get_num_threads()  # torch's own choice at start; the calibration may settle on fewer


def thread_candidates(device: torch.device) -> list[int] | None:
    """The thread counts a CPU calibration compares: torch's default and one (None on a GPU)."""
    return sorted({1, CPU_THREADS}, reverse=True) if device.type == "cpu" else None


def running_mean(old: float, new: float, weight: float = 0.2) -> float:
    return new if old == 0.0 else (1 - weight) * old + weight * new


class Engine:
    def __init__(self, pair: LoadedPair):
        self.pair = pair
        self.tokenizer = pair.tokenizer
        self.mid = make_mid_drafter(pair)
        lazy = pair.config.lazy_logits == "on" or (pair.config.lazy_logits == "auto" and pair.device.type == "cpu")
        self.target = TargetModel(pair.target, keep_features=self.mid.needs_target_features, lazy=lazy,
                                  lead_rows=pair.config.lead_rows, taps=self.mid.taps)
        self.device = self.target.device
        gc_eos = pair.target.generation_config.eos_token_id
        eos = set(gc_eos if isinstance(gc_eos, list) else [gc_eos] if gc_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos = eos
        self.context = int(getattr(pair.target.config, "max_position_embeddings", 0) or 1 << 30)
        self.timing_ms = {"target": 0.0, "mid": 0.0}  # running means kept across generations (scheduler inputs)
        self.profile = Profile(self.device)
        self.pruner = Pruner()  # B_ver and the cost-aware cut; learns across generations

    def state(self) -> EngineState:
        return EngineState(copy.deepcopy(self.pruner), dict(self.timing_ms))

    def restore(self, state: EngineState) -> None:
        self.pruner, self.timing_ms = copy.deepcopy(state.pruner), dict(state.timing_ms)

    def restore_timings(self, state: EngineState) -> None:
        """Put back what `state` had measured by the clock (T(n), the head's H, B_ver, the thread count, the rounds'
        rate, the cut's recent choices, the scheduler's timing means), keeping what the generations since taught the
        acceptance model. The app's drawn run is timed while a browser may render its frames on the same cores
        (docs/app.md): its rounds then read 2-3x their time, and a cut priced on them verifies almost nothing in every
        later run."""
        self.pruner.take_timings(state.pruner)
        self.timing_ms = dict(state.timing_ms)

    def host_costs(self, drafting: DraftingConfig | None = None) -> dict:
        """What this host measured: T(n) by tokens verified (n + 1 with the root; monotone fits) in the calibration's
        probes (`verify_ms`, what B_ver reads) and refined by the rounds (`verify_ms_rounds`, what the cut prices),
        the memory floor of a step, a lazily computed logits row, and the B_ver the probes allow."""
        cost = self.pruner.verify_cost
        if not cost:
            return {}
        b = self.pruner.host_budget(drafting.budget, drafting.verify_cost_cap) if drafting else self.pruner.host_b
        probes = set(probe_sizes(max(cost.ms)))  # the calibration's sizes, not the odd sizes rounds added

        def at_probes(c) -> dict[int, float]:
            return {n + 1: round(t, 2) for n, t in c.ms.items() if n in probes}

        return {"verify_ms": at_probes(self.pruner.probe_cost or cost), "verify_ms_rounds": at_probes(cost),
                "memory_floor_ms": round(self.target.memory_floor_ms(), 2), "row_ms": round(self.pruner.row_ms, 2),
                "b_ver": b, "threads": self.pruner.threads,
                **({"step1_call_ms": round(self.timing_ms["call"], 2)} if self.timing_ms.get("call") else {})}

    @property
    def dtype_name(self) -> str:
        return str(self.target.dtype).replace("torch.", "")

    # --- prompts ---------------------------------------------------------------------------------
    def encode(self, prompt: str | tuple[str, ...], raw: bool = False) -> list[int]:
        """Token ids of a prompt (or of alternating user/assistant turns), chat template applied unless raw."""
        turns = (prompt,) if isinstance(prompt, str) else tuple(prompt)
        for t in turns:
            check_text(t)
        check_special_only(self.tokenizer, turns[-1])
        tok = self.tokenizer
        if not raw and self.pair.config.chat_template and tok.chat_template:
            return chat_ids(tok, turns)
        return tok("\n".join(turns)).input_ids

    # --- one speculative round (SPEC 2, 3) ---------------------------------------------------------
    def draft_and_verify(self, s: Session) -> Verified:
        """Grow one tree (D steps), prune to B_ver (and the cost-aware cut), verify once, accept."""
        watch = Stopwatch(self.device)
        tree = self.new_tree(s)                                                  # root = last committed token
        steps = s.plan.draft(s, tree)                                           # D steps, one shared tree
        draft_s = watch.lap()
        kept = self.pruner.select(tree, s.drafting.budget, s.drafting.adaptive_budget,
                                  s.drafting.verify_cost_cap)
        nodes = np.concatenate([[0], kept])                                     # root + kept, index order
        lead = self.pruner.lead_rows(tree, nodes, s.drafting.lead) if self.target.lead_rows else None  # likely rows
        prune_s = watch.lap()
        logits = self.target.verify(tree, nodes, lead)                          # one tree-masked forward
        forward_s = watch.lap()
        acc = accept(tree, nodes, logits, s.gen, s.generator)                   # greedy walk or sampling
        accept_s = watch.lap()
        row_ms = 1000 * accept_s / logits.extra_rows if logits.extra_rows else None
        return Verified(tree, steps, kept, acc, draft_s, prune_s + forward_s + accept_s, 1000 * forward_s, row_ms)

    def speculative_round(self, s: Session) -> RoundTrace:
        watch = Stopwatch(self.device)
        with self.profile.active():
            v = self.draft_and_verify(s)
            self.learn(s, v)                                                    # timings, T(n), acceptance
            tokens = self.commit(s, v.tree, v.acc)                              # caches, n-gram index
            trace = RoundTrace(index=s.rounds, prefix_len=len(s.committed) - len(tokens),
                               tree=TreeSnapshot.of(v.tree), bonus_token=v.acc.bonus, steps=v.steps,
                               accepted_path=v.acc.path, accepted_tokens=tokens[:-1], draft_s=v.draft_s,
                               verify_s=v.verify_s)
        trace.wall_s = watch.total()
        trace.commit_s = trace.wall_s - v.draft_s - v.verify_s
        trace.profile_ms = self.profile.take(trace.wall_s)
        return trace

    def keep_budget(self, d: DraftingConfig) -> int | None:
        """The B_ver a draft step sizes itself to (`expand` = "keepable"): the host's, shrunk to what the cut has
        been verifying (`Pruner.draft_budget`), or as configured."""
        if d.expand != "keepable":
            return None
        if not d.adaptive_budget:
            return d.budget
        return self.pruner.draft_budget(self.pruner.host_budget(d.budget, d.verify_cost_cap))

    def new_tree(self, s: Session) -> DraftTree:
        d = s.drafting
        self.mid.begin_round()
        k = max(d.top_k, d.mid_top_k or 0)
        tree = DraftTree.new(s.committed[-1], capacity=1 + d.depth * d.width * (k + d.span_max))
        if d.scores == "calibrated":
            tree.calibration = self.pruner.acceptance
        tree.keep_budget = self.keep_budget(d)
        return tree

    def learn(self, s: Session, v: Verified) -> None:
        """What a committed round teaches: the scheduler's timing inputs, and the pruner's T(n) and acceptance."""
        s.t_target_ms = running_mean(s.t_target_ms, 1000 * v.verify_s)
        for step in v.steps:
            if step.action == "mid":
                s.t_mid_ms = running_mean(s.t_mid_ms, 1000 * step.draft_s)
        policy = s.plan.policy if isinstance(s.plan, Stepwise) else None
        if policy is not None and policy.observes:  # a policy that learns within the request (the yield gate)
            policy.observe(self.round_outcome(s, v))
        if s.depth_gate is not None:
            step_ms = [1000 * st.draft_s for st in v.steps]
            s.depth_gate.of(v.steps[0].action).observe(v.tree, v.kept, v.acc.path, step_ms,
                                                       1000 * (v.draft_s + v.verify_s), self.verify_ms)
        if s.drafting.adaptive_budget:
            self.pruner.learn(v.tree, v.kept, v.acc.path, v.forward_ms, v.row_ms, s.drafting.budget,
                              s.drafting.verify_cost_cap, round_ms=1000 * (v.draft_s + v.verify_s))
        elif s.drafting.scores == "calibrated":  # the calibration's data, without the cost-aware cut
            self.pruner.acceptance.update(v.tree, v.kept, v.acc.path)

    def round_outcome(self, s: Session, v: Verified) -> RoundOutcome:
        """What a verified round tells an observing policy: its tree, path and time, and this engine's measured costs
        (a token's row, T(n)) and cut, for the yield gate's counterfactual (scheduler/online.py)."""
        d = s.drafting
        return RoundOutcome(
            v.tree, v.kept, v.acc.path, v.acc.bonus, 1000 * (v.draft_s + v.verify_s),
            1000 * sum(st.draft_s for st in v.steps if st.action == "mid"), self.pruner.token_row_ms(),
            self.verify_ms,
            lambda tree, nodes: self.pruner.cut_among(tree, nodes, d.budget, d.adaptive_budget, d.verify_cost_cap))

    def verify_ms(self, n: np.ndarray) -> np.ndarray:
        """T(n) [m] for n [m] verified non-root nodes, as the cut prices it (zeros before a calibration)."""
        return self.pruner.verify_cost(n) if self.pruner.verify_cost else np.zeros(len(n))

    def commit(self, s: Session, tree: DraftTree, acc: Acceptance) -> list[int]:
        """Commit the accepted path + the bonus token; both caches keep exactly prefix + path."""
        tokens = [int(tree.token[v]) for v in acc.path[1:]] + [acc.bonus]
        s.committed += tokens
        self.mid.end_round(acc.path, self.target.accepted_features(acc.rows))
        self.target.commit(acc.rows)
        s.ngram.extend(tokens)
        return tokens

    def trial_round(self, s: Session, policy) -> Verified:
        """Draft and verify with another policy from the current state, then roll every cache back. Nothing
        is learned or committed (the pruner, the timing means, the n-gram index and both caches are as before),
        so every trial of a collected round starts from the same state. Scheduler data collection records
        its steps, A (`acc.accepted_tokens`), t_D (`draft_s`), t_V (`verify_s`) and the verified count."""
        saved, mid_state, unfed, gate = s.plan, self.mid.snapshot(), s.prompt_at_first_call, s.depth_gate
        s.plan, s.depth_gate = saved.with_policy(policy), None  # a trial takes all D steps
        try:
            v = self.draft_and_verify(s)  # no active profile: a trial is not a round
        finally:
            s.plan, s.prompt_at_first_call, s.depth_gate = saved, unfed, gate
            self.target.rollback()
            self.mid.rollback(mid_state)
        return v

    def calibrate_mid(self, prompt_ids: list[int], drafting: DraftingConfig) -> None:
        """Seed t_mid, the scheduler's input for what a mid step costs here, once per engine: the median mid step
        of one trial round of mid steps on this prompt (caches rolled back, nothing learned; the round's first step
        also feeds the prompt through the mid, which the median leaves out). Rounds then keep it as a running mean.
        Scheduler collection seeds it the same way (scheduler/train.collect), so a run reads the input as the
        scheduler was trained on it. Before this, a run read the time in the scheduler's file until its first mid
        call, and collection started each prompt from that first call, the prompt's prefill included."""
        if self.timing_ms["mid"] > 0.0 or len(prompt_ids) < 2:  # measured already (or by a mid round)
            return
        s = self.start(prompt_ids, MethodSpec("all-mid"), drafting, GenerationConfig(max_new_tokens=1))
        steps = self.trial_round(s, AllMid()).steps
        mid_ms = [1000 * st.draft_s for st in steps if st.action == "mid"]
        if mid_ms:
            self.timing_ms["mid"] = float(np.median(mid_ms))

    def calibrate_call(self, prompt_ids: list[int], drafting: DraftingConfig, states: int = 4, pairs: int = 2) -> None:
        """Measure what a step-1 mid call adds to a round here, once per engine, for the reports (bench "Mid step
        cost", `host_costs`; the yield gate prices each call round by its own parts, scheduler/online.py): at each of `states` successive rounds of an all-small generation of this prompt, `pairs` interleaved
        trial rounds of all-small and of one mid step at step 1 from that state (caches rolled back, nothing learned),
        the difference of their medians; the cost is the median of those differences (the call, the verification of
        its nodes, their logits rows; one state alone read 4-10 ms here). Off the clock, like `calibrate_mid`; the
        rounds that move the state on are committed in a throwaway session and the pruner is put back after."""
        room = min(64, self.context - len(prompt_ids))  # new tokens the throwaway session may commit
        if self.timing_ms.get("call", 0.0) > 0.0 or len(prompt_ids) < 2 or room < 1:
            return
        from .methods import AllSmall, Fixed

        saved = copy.deepcopy(self.pruner)
        s = self.start(prompt_ids, MethodSpec("all-mid"), drafting, GenerationConfig(max_new_tokens=room))
        call = Fixed((1,) + (0,) * (drafting.depth - 1))
        self.trial_round(s, call)  # warm-up (the first call's allocations)
        diffs = []
        try:
            for _ in range(states):
                if self.finished(s) is not None:
                    break
                ms: dict[str, list[float]] = {"small": [], "call": []}
                for _ in range(pairs):
                    for name, policy in (("small", AllSmall()), ("call", call)):
                        v = self.trial_round(s, policy)
                        ms[name].append(1000 * (v.draft_s + v.verify_s))
                diffs.append(float(np.median(ms["call"]) - np.median(ms["small"])))
                s.plan = s.plan.with_policy(AllSmall())
                self.speculative_round(s)  # the next state
                s.rounds += 1
        finally:
            self.pruner = saved
        if diffs:
            self.timing_ms["call"] = max(float(np.median(diffs)), 1e-3)

    def ar_step(self, s: Session) -> RoundTrace:
        """Plain autoregressive decoding with the KV cache: the speedup denominator."""
        watch = Stopwatch(self.device)
        with self.profile.active():
            tok = next_token(self.target.decode_one(s.committed[-1]), s.gen, s.generator)
        wall = watch.total()
        s.committed.append(tok)
        root = DraftTree.new(s.committed[-2], capacity=1)
        root.kept[0] = True
        return RoundTrace(index=s.rounds, prefix_len=len(s.committed) - 1, tree=TreeSnapshot.of(root),
                          bonus_token=tok, verify_s=wall, wall_s=wall, profile_ms=self.profile.take(wall))

    # --- a whole generation ----------------------------------------------------------------------
    def start(self, prompt_ids: list[int], method: MethodSpec, drafting: DraftingConfig,
              gen: GenerationConfig, seed: int = 0) -> Session:
        if not prompt_ids:
            raise PromptError("the prompt encodes to no tokens")
        check_length(len(prompt_ids), gen.max_new_tokens, self.context)
        plan = build_method(method, drafting, self.mid, self.pair.config.scheduler) if method.drafts else None
        ngram = NgramIndex(drafting.ngram_max, self.pair.corpus if drafting.corpus else None)
        s = Session(list(prompt_ids), len(prompt_ids), drafting, gen, method, plan, ngram,
                    None if gen.greedy else torch.Generator().manual_seed(seed), self.device,
                    t_target_ms=self.timing_ms["target"], t_mid_ms=self.timing_ms["mid"])
        if plan is not None:
            s.ngram.extend(prompt_ids)
            s.notes += [plan.note] if plan.note else []
            if drafting.adaptive_budget:  # once per engine; generate() does it off the clock
                self.pruner.calibrate(self.target, s.committed, drafting.budget, drafting.verify_cost_cap,
                                      threads=thread_candidates(self.device))
            s.verify_growth = self.pruner.verify_cost.growth()
            if drafting.depth_gate == "yield" and isinstance(plan, Stepwise):
                s.depth_gate = DepthGate(drafting.depth, drafting.mid_lead if yield_gated(method, drafting) else 1)
        self.target.start(s.committed)
        self.mid.start(self.target.head_features() if self.target.keep_features else None)
        if plan is not None and plan.calls_mid and drafting.mid_prefill:
            if plan.calls_every_round:  # the prompt, as the target reads it (EAGLE)
                self.mid.prefill(s.committed)
            else:  # a policy that may never call it (the learned scheduler) feeds it the prompt when it first does
                s.prompt_at_first_call = True
        return s

    def finished(self, s: Session) -> str | None:
        new = s.new_tokens
        if any(t in self.eos for t in new):
            return "eos"
        if len(new) >= s.gen.max_new_tokens:
            return "length"
        return None

    def rounds(self, s: Session) -> Iterator[RoundTrace]:
        step = self.speculative_round if s.plan is not None else self.ar_step
        while self.finished(s) is None:
            trace = step(s)
            s.rounds += 1
            self.timing_ms.update(target=s.t_target_ms, mid=s.t_mid_ms)
            yield trace

    def trim(self, tokens: list[int], max_new_tokens: int) -> list[int]:
        """New tokens up to max_new_tokens and the first EOS (included), as plain greedy would stop."""
        new = tokens[:max_new_tokens]
        for i, t in enumerate(new):
            if t in self.eos:
                return new[: i + 1]
        return new

    def generate(self, prompt_ids: list[int], method: MethodSpec, drafting: DraftingConfig,
                 gen: GenerationConfig, seed: int = 0, on_round: Callable[[RoundTrace], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> GenerationResult:
        if method.hf_peer:
            return self.generate_hf(prompt_ids, method, gen, seed)
        if method.drafts and drafting.adaptive_budget:
            self.pruner.calibrate(self.target, prompt_ids, drafting.budget,  # off the clock, like model loading
                                  drafting.verify_cost_cap, threads=thread_candidates(self.device))
        if method.name in SCHEDULED:
            self.calibrate_mid(prompt_ids, drafting)  # off the clock too
        if yield_gated(method, drafting):
            self.calibrate_call(prompt_ids, drafting)
        watch = Stopwatch(self.device)
        s = self.start(prompt_ids, method, drafting, gen, seed)
        prefill = watch.lap()
        traces, stopped = [], None
        for trace in self.rounds(s):
            traces.append(trace)
            if on_round:
                on_round(trace)
            if should_stop and should_stop():
                stopped = "cancelled"
                break
        new = self.trim(s.new_tokens, s.gen.max_new_tokens)
        settings = {"drafting": drafting.model_dump(), "generation": gen.model_dump(), "seed": seed,
                    "eg": method.eg, "nd": method.nd}
        wall = watch.total()
        return self.result(method.label, prompt_ids, new, wall, prefill, settings, rounds=traces,
                           token_strings=self.token_strings(traces), notes=s.notes,
                           stopped=stopped or self.finished(s) or "length",
                           host=self.host_costs(drafting) if method.drafts else {})

    def generate_hf(self, prompt_ids, method, gen, seed) -> GenerationResult:
        """A Hugging Face peer (prompt lookup / assisted generation) on the same models: wall time only."""
        from .baselines import hf_generate

        check_length(len(prompt_ids), gen.max_new_tokens, self.context)
        new, wall = hf_generate(self.pair, prompt_ids, method.name, gen, seed)
        new = self.trim(new, gen.max_new_tokens)
        return self.result(method.name, prompt_ids, new, wall, 0.0, {"generation": gen.model_dump(), "seed": seed},
                           notes=["Hugging Face generate: no per-round trace"],
                           stopped="eos" if new and new[-1] in self.eos else "length")

    def result(self, label: str, prompt_ids: list[int], new: list[int], wall: float, prefill: float,
               settings: dict, **extra) -> GenerationResult:
        return GenerationResult(pair=self.pair.config.name, method=label, prompt_tokens=len(prompt_ids),
                                new_tokens=new, text=self.tokenizer.decode(new, skip_special_tokens=True),
                                wall_s=wall, prefill_s=prefill, dtype=self.dtype_name, device=str(self.device),
                                settings=settings, **extra)

    def token_strings(self, traces: list[RoundTrace]) -> dict[int, str]:
        ids = sorted({t for r in traces for t in r.tree.token} | {r.bonus_token for r in traces})
        return {i: self.tokenizer.decode([i]) for i in ids}
