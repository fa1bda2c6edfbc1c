"""The round loop: draft (D steps on one shared tree), prune, verify, accept, commit -> RoundTrace.

`Engine` owns a loaded pair; `Engine.rounds(...)` yields one RoundTrace per
speculative round (or per token for `ar`), `Engine.generate(...)` collects them
into a GenerationResult. One Engine serves one generation at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from . import budget
from .config import DraftingConfig, GenerationConfig
from .drafters.neural import MidDrafter, MidScores
from .drafters.ngram import NgramIndex
from .kv import timed
from .methods import HF_METHODS, MethodSpec, make_policy
from .models import LoadedPair
from .policies import Policy, StepState
from .profile import Profile
from .prompt_check import PromptError, check_length, check_special_only, check_text
from .sampling import draw, processed_probs
from .trace import GenerationResult, RoundTrace, StepTrace, TreeSnapshot
from .tree import (MID, SMALL, DraftTree, add_child, delete_subtree, mid_pool, path_tokens, prune,
                   recompute_scores, reselection_rate, rows_of, small_pool, top_w, unvisited_closure)
from .verify import TargetModel, accept


@dataclass
class Session:
    """The state of one generation, carried across rounds."""

    committed: list[int]  # prompt + accepted tokens
    prompt_len: int
    drafting: DraftingConfig
    gen: GenerationConfig
    method: MethodSpec
    policy: Policy | None
    ngram: NgramIndex
    generator: torch.Generator | None
    rounds: int = 0
    t_target_ms: float = 0.0
    t_mid_ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def new_tokens(self) -> list[int]:
        return self.committed[self.prompt_len:]


def running_mean(old: float, new: float, weight: float = 0.2) -> float:
    return new if old == 0.0 else (1 - weight) * old + weight * new


class Engine:
    def __init__(self, pair: LoadedPair):
        self.pair = pair
        self.tokenizer = pair.tokenizer
        self.target = TargetModel(pair.target)
        self.mid = MidDrafter(pair.mid, len(pair.tokenizer), pair.mid_vocab)
        gc_eos = pair.target.generation_config.eos_token_id
        eos = set(gc_eos if isinstance(gc_eos, list) else [gc_eos] if gc_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos = eos
        self.context = int(getattr(pair.target.config, "max_position_embeddings", 0) or 1 << 30)
        self.timing_ms = {"target": 0.0, "mid": 0.0}  # running means kept across generations (scheduler inputs)
        self.profile = self.target.profile = self.mid.profile = Profile(self.target.device)
        self.acceptance = budget.AcceptanceModel()  # for the adaptive budget, learned across generations
        self.verify_cost = budget.VerifyCost()

    # --- prompts ---------------------------------------------------------------------------------
    def encode(self, prompt: str | tuple[str, ...], raw: bool = False) -> list[int]:
        """Token ids of a prompt (or of alternating user/assistant turns), chat template applied unless raw."""
        turns = (prompt,) if isinstance(prompt, str) else tuple(prompt)
        for t in turns:
            check_text(t)
        check_special_only(self.tokenizer, turns[-1])
        tok = self.tokenizer
        if not raw and self.pair.config.chat_template and tok.chat_template:
            msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
            return list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
        return tok("\n".join(turns)).input_ids

    # --- one speculative round -------------------------------------------------------------------
    def small_step(self, s: Session, tree: DraftTree, k: int) -> StepTrace:
        t0 = timed(self.target.device)
        part = self.profile.part
        with part("tree"):
            pool = small_pool(tree)
            frontier = top_w(tree, pool, s.drafting.width)
        added, confirmed = [], []
        for f in frontier:
            with part("ngram"):
                proposals = s.ngram.propose(path_tokens(tree, int(f), s.drafting.ngram_max), s.drafting.top_k)
            with part("tree"):
                for tok, p in proposals:
                    v, new = add_child(tree, int(f), tok, math.log(p), SMALL, k)
                    (added if new else confirmed).append(v)
        with part("tree"):
            if confirmed:
                recompute_scores(tree)
            tree.last_added = added + confirmed
        return StepTrace(k, "small", pool.tolist(), frontier.tolist(), added, confirmed, [], len(pool), None,
                         timed(self.target.device) - t0)

    def mid_step(self, s: Session, tree: DraftTree, k: int) -> StepTrace:
        t0 = timed(self.target.device)
        with self.profile.part("tree"):
            leaf_depth = tree.max_leaf_depth()
            n_k = len(small_pool(tree))
            pool = mid_pool(tree) if s.method.eg else small_pool(tree)
            batch = unvisited_closure(tree, pool)
        added, confirmed, removed, frontier = [], [], [], pool[:0]
        if len(batch):
            logq = self.mid.evaluate(tree, s.committed, batch)  # [len(batch), vocab]
            with self.profile.part("tree"):
                frontier, added, confirmed, removed = self._graft(s, tree, k, pool, batch, logq)
        with self.profile.part("tree"):
            tree.last_added = added + confirmed
            resel = reselection_rate(tree, frontier, leaf_depth)
        dt = timed(self.target.device) - t0
        s.t_mid_ms = running_mean(s.t_mid_ms, 1000 * dt)
        return StepTrace(k, "mid", pool.tolist(), frontier.tolist(), added, confirmed, removed, n_k, resel, dt)

    def _graft(self, s: Session, tree: DraftTree, k: int, pool: np.ndarray, batch: np.ndarray, logq: MidScores):
        """Re-score the evaluated nodes' children, pick the top-W graft sites, add the mid's top-K under each."""
        tree.mid_visited[batch] = True
        self._refresh_children(tree, batch, logq)
        frontier = top_w(tree, pool, s.drafting.width)
        tree.graft_site[frontier] = True
        rows = rows_of(batch, tree.n)[frontier]
        top_tokens, top_lp = logq.topk(torch.from_numpy(rows), s.drafting.top_k)  # [W, K] each
        added, confirmed, removed = [], [], []
        for f, toks, lps in zip(frontier.tolist(), top_tokens.tolist(), top_lp.tolist()):
            if not tree.alive[f]:  # w/o ND: an earlier graft site's overwrite deleted it
                continue
            if not s.method.nd:
                removed += delete_subtree(tree, f)
            for tok, lp in zip(toks, lps):
                v, new = add_child(tree, f, tok, lp, MID, k)
                (added if new else confirmed).append(v)
        if confirmed:
            recompute_scores(tree)
        return frontier, added, confirmed, removed

    @staticmethod
    def _refresh_children(tree: DraftTree, batch: np.ndarray, logq: MidScores) -> None:
        """p(c) = q_mid(token(c) | parent(c)) for every live child of an evaluated node; then s top-down."""
        row = rows_of(batch, tree.n)
        n = tree.n
        kids = np.flatnonzero(tree.alive[:n] & (tree.parent[:n] >= 0))
        kids = kids[row[tree.parent[kids]] >= 0]
        if len(kids):
            lp, known = logq.of(torch.from_numpy(row[tree.parent[kids]]), torch.from_numpy(tree.token[kids]))
            known = known.cpu().numpy()
            tree.logp[kids[known]] = lp.double().cpu().numpy()[known]
            recompute_scores(tree)

    def csd_draft(self, s: Session, tree: DraftTree) -> list[StepTrace]:
        """The sequence-level cascade contrast (CSD-style): the small drafter proposes one chain of up to D
        tokens; the mid reviews the chain in one forward and, at the first token it disagrees with, deletes
        the rest of the chain and writes its own token there (overwrite, no tree)."""
        dev = self.target.device
        t0 = timed(dev)
        v, chain = 0, [0]
        for k in range(1, s.drafting.depth + 1):
            props = s.ngram.propose(path_tokens(tree, v, s.drafting.ngram_max), 1)
            if not props:
                break
            v, _ = add_child(tree, v, props[0][0], math.log(props[0][1]), SMALL, 1)
            chain.append(v)
        t1 = timed(dev)
        small = StepTrace(1, "small", [0], [0], chain[1:], [], [], 1, None, t1 - t0)
        nodes = np.array(chain)
        logq = self.mid.evaluate(tree, s.committed, nodes)
        tree.mid_visited[nodes] = True
        self._refresh_children(tree, nodes, logq)
        tokens, lps = logq.topk(torch.arange(len(chain)), 1)  # [len(chain), 1]
        site, removed, added = chain[-1], [], []
        for i, u in enumerate(chain):
            nxt = chain[i + 1] if i + 1 < len(chain) else None
            if nxt is not None and tree.token[nxt] == int(tokens[i, 0]):
                continue
            site = u
            removed = delete_subtree(tree, u) if nxt is not None else []
            added = [add_child(tree, u, int(tokens[i, 0]), float(lps[i, 0]), MID, 2)[0]]
            break
        tree.graft_site[site] = True
        dt = timed(dev) - t1
        s.t_mid_ms = running_mean(s.t_mid_ms, 1000 * dt)
        return [small, StepTrace(2, "mid", chain, [site], added, [], removed, len(chain), None, dt)]

    def draft(self, s: Session, tree: DraftTree) -> list[StepTrace]:
        if s.method.name == "csd":
            return self.csd_draft(s, tree)
        steps: list[StepTrace] = []
        actions: list[int] = []
        s.policy.start_round()
        for k in range(1, s.drafting.depth + 1):
            t0 = timed(self.target.device)
            with self.profile.part("scheduler"):
                decision = s.policy.decide(StepState(k, s.drafting.depth, tree, list(actions), s.prompt_len,
                                                     s.t_target_ms, s.t_mid_ms))
            sched_s = timed(self.target.device) - t0
            step = (self.mid_step if decision.action == MID else self.small_step)(s, tree, k)
            step.margin, step.sched_s, step.features = decision.margin, sched_s, decision.features
            actions.append(decision.action)
            steps.append(step)
        return steps

    def draft_and_verify(self, s: Session):
        """Grow the tree (D steps), prune to B_ver, verify once, accept. Nothing is committed."""
        dev = self.target.device
        t0 = timed(dev)
        d = s.drafting
        with self.profile.part("tree"):
            tree = DraftTree.new(s.committed[-1], capacity=1 + d.depth * d.width * d.top_k)
            self.mid.begin_round()
        steps = self.draft(s, tree)
        t1 = timed(dev)
        with self.profile.part("prune"):
            kept = prune(tree, d.budget)
            if d.adaptive_budget:
                kept = self.adapt_budget(tree, kept)
            nodes = np.concatenate([[0], kept])  # root + kept, index order
        logits = self.target.verify(tree, nodes)  # [len(nodes), vocab]
        with self.profile.part("accept"):
            acc = accept(tree, nodes, logits, s.gen, s.generator)
        t2 = timed(dev)
        if d.adaptive_budget:
            with self.profile.part("prune"):  # the budget learns what it chose: T(n) and acceptance
                self.verify_cost.observe(len(kept), 1000 * (t2 - t1))
                self.acceptance.update(tree, kept, acc.path)
        return tree, steps, acc, (t0, t1, t2)

    def adapt_budget(self, tree: DraftTree, kept: np.ndarray) -> np.ndarray:
        """The kept nodes that pay for their verification time (treegraft/budget.py); updates tree.kept."""
        if not self.verify_cost:  # not calibrated (a one-token prompt): verify the pruned tree
            return kept
        pi = self.acceptance.path_acceptance(tree, kept)  # [len(kept)]
        order, _ = budget.choose(pi, self.verify_cost)
        chosen = np.sort(kept[order])
        tree.kept[kept] = False
        tree.kept[chosen] = True
        return chosen

    def calibrate_budget(self, prompt_ids: list[int], drafting: DraftingConfig) -> None:
        """Seed T(n), once per engine, by timing verifications of chains of a few sizes on this prompt's
        prefilled cache (then rolled back). Runs before a generation's clock starts, like model loading."""
        if not drafting.adaptive_budget or self.verify_cost or len(prompt_ids) < 2:
            return
        self.target.start(prompt_ids)
        last = prompt_ids[-1]
        for n in budget.probe_sizes(drafting.budget):
            chain = DraftTree.new(last, capacity=n + 1)
            for i in range(n):
                add_child(chain, i, last, 0.0, SMALL, 1)
            nodes = np.arange(n + 1)
            for _ in range(2):  # the first one warms up
                t0 = timed(self.target.device)
                self.target.verify(chain, nodes)
                ms = 1000 * (timed(self.target.device) - t0)
                self.target.rollback()
            self.verify_cost.observe(n, ms)

    def speculative_round(self, s: Session) -> RoundTrace:
        tree, steps, acc, (t0, t1, t2) = self.draft_and_verify(s)
        s.t_target_ms = running_mean(s.t_target_ms, 1000 * (t2 - t1))
        tokens = [int(tree.token[v]) for v in acc.path[1:]] + [acc.bonus]
        self.commit(s, tokens, acc.rows, acc.path)
        with self.profile.part("trace"):
            snapshot = TreeSnapshot.of(tree)
        t3 = timed(self.target.device)
        return RoundTrace(s.rounds, len(s.committed) - len(tokens), snapshot, steps, acc.path, tokens[:-1],
                          acc.bonus, t1 - t0, t2 - t1, t3 - t2, t3 - t0, self.profile.take(t3 - t0))

    def trial_round(self, s: Session, policy: Policy) -> tuple[list[StepTrace], int, float, float]:
        """Draft and verify with another policy from the current state, then roll every cache back.

        Returns (steps, A, t_D, t_V): what scheduler data collection records per schedule.
        """
        saved, mid_cached = s.policy, self.mid.cached
        s.policy = policy
        try:
            tree, steps, acc, (t0, t1, t2) = self.draft_and_verify(s)
        finally:
            s.policy = saved
            self.target.rollback()
            self.mid.rollback(mid_cached)
            self.profile.take(0.0)  # a trial is not a round
        return steps, acc.accepted_tokens, t1 - t0, t2 - t1

    def commit(self, s: Session, tokens: list[int], rows: list[int], path: list[int]) -> None:
        s.committed += tokens
        self.target.commit(rows)
        self.mid.end_round(path)
        with self.profile.part("ngram"):
            s.ngram.extend(tokens)

    def ar_step(self, s: Session) -> RoundTrace:
        """Plain autoregressive decoding with the KV cache: the speedup denominator."""
        dev = self.target.device
        t0 = timed(dev)
        logits = self.target.decode_one(s.committed[-1])  # [vocab]
        if s.gen.temperature == 0:
            tok = int(logits.argmax())
        else:
            tok = draw(processed_probs(logits[None], s.gen)[0], s.generator)
        t1 = timed(dev)
        s.committed.append(tok)
        tree = DraftTree.new(s.committed[-2], capacity=1)
        tree.kept[0] = True
        return RoundTrace(s.rounds, len(s.committed) - 1, TreeSnapshot.of(tree), [], [0], [], tok,
                          0.0, t1 - t0, 0.0, t1 - t0, self.profile.take(t1 - t0))

    # --- a whole generation ----------------------------------------------------------------------
    def start(self, prompt_ids: list[int], method: MethodSpec, drafting: DraftingConfig,
              gen: GenerationConfig, seed: int = 0) -> Session:
        if not prompt_ids:
            raise PromptError("the prompt encodes to no tokens")
        check_length(len(prompt_ids), gen.max_new_tokens, self.context)
        policy = None if method.name == "ar" else make_policy(method, drafting, self.pair.config.scheduler, drafting.mid_budget)
        generator = torch.Generator().manual_seed(seed) if gen.temperature > 0 else None
        ngram = NgramIndex(drafting.ngram_max)
        if method.name != "ar":
            ngram.extend(prompt_ids)
        s = Session(list(prompt_ids), len(prompt_ids), drafting, gen, method, policy, ngram, generator,
                    t_target_ms=self.timing_ms["target"], t_mid_ms=self.timing_ms["mid"])
        if policy is not None and policy.note:
            s.notes.append(policy.note)
        if method.name != "ar":
            self.calibrate_budget(s.committed, drafting)  # once per engine; generate() does it off the clock
        self.target.start(s.committed)
        self.mid.start()
        self.profile.take(0.0)  # the prefill is not a round
        return s

    def finished(self, s: Session) -> str | None:
        new = s.new_tokens
        if any(t in self.eos for t in new):
            return "eos"
        if len(new) >= s.gen.max_new_tokens:
            return "length"
        return None

    def rounds(self, s: Session) -> Iterator[RoundTrace]:
        step = self.ar_step if s.method.name == "ar" else self.speculative_round
        while self.finished(s) is None:
            trace = step(s)
            s.rounds += 1
            self.timing_ms = {"target": s.t_target_ms, "mid": s.t_mid_ms}
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
        if method.name in HF_METHODS:
            return self.generate_hf(prompt_ids, method, drafting, gen, seed)
        dev = self.target.device
        if method.name != "ar":
            self.calibrate_budget(prompt_ids, drafting)
        t0 = timed(dev)
        s = self.start(prompt_ids, method, drafting, gen, seed)
        prefill = timed(dev) - t0
        traces, stopped = [], None
        for trace in self.rounds(s):
            traces.append(trace)
            if on_round:
                on_round(trace)
            if should_stop and should_stop():
                stopped = "cancelled"
                break
        wall = timed(dev) - t0
        new = self.trim(s.new_tokens, s.gen.max_new_tokens)
        return GenerationResult(
            pair=self.pair.config.name, method=method.label, prompt_tokens=len(prompt_ids), new_tokens=new,
            text=self.tokenizer.decode(new, skip_special_tokens=True), wall_s=wall, prefill_s=prefill,
            dtype=str(self.target.dtype).replace("torch.", ""), device=str(dev),
            settings={"drafting": drafting.model_dump(), "generation": gen.model_dump(), "seed": seed,
                      "eg": method.eg, "nd": method.nd},
            rounds=traces, token_strings=self.token_strings(traces), notes=s.notes,
            stopped=stopped or self.finished(s) or "length")

    def generate_hf(self, prompt_ids, method, drafting, gen, seed) -> GenerationResult:
        """A Hugging Face peer (prompt lookup / assisted generation) on the same models: wall time only."""
        from .baselines import hf_generate

        check_length(len(prompt_ids), gen.max_new_tokens, self.context)
        new, wall = hf_generate(self.pair, prompt_ids, method.name, gen, seed)
        new = self.trim(new, gen.max_new_tokens)
        return GenerationResult(
            pair=self.pair.config.name, method=method.name, prompt_tokens=len(prompt_ids), new_tokens=new,
            text=self.tokenizer.decode(new, skip_special_tokens=True), wall_s=wall, prefill_s=0.0,
            dtype=str(self.target.dtype).replace("torch.", ""), device=str(self.target.device),
            settings={"generation": gen.model_dump(), "seed": seed}, notes=["Hugging Face generate: no per-round trace"],
            stopped="eos" if new and new[-1] in self.eos else "length")

    def token_strings(self, traces: list[RoundTrace]) -> dict[int, str]:
        ids = sorted({t for r in traces for t in r.tree.token} | {r.bonus_token for r in traces})
        return {i: self.tokenizer.decode([i]) for i in ids}
