"""The methods one engine runs (SPEC 4): who drafts each step (a policy) and how a round drafts.

A policy is the "when" of SPEC 2/5: before each draft step it sees the tree and the
round's history (never a model) and picks SMALL or MID. `build_method` is the one
factory: it turns a `MethodSpec` into how a round drafts (a `Stepwise` plan of a policy
and its drafters, or the CSD cascade), so the engine never asks a method's name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .config import ConfigError, DraftingConfig, resolve_path
from .kv import Stopwatch
from .profile import profiled
from .trace import StepTrace
from .tree import MID, SMALL, DraftTree

TREE_METHODS = ("all-small", "all-mid", "fixed", "treegraft", "oracle", "csd")
HF_METHODS = ("hf-pld", "hf-assisted")
METHODS = ("ar",) + TREE_METHODS + HF_METHODS


@dataclass(frozen=True)
class MethodSpec:
    name: str
    eg: bool = True  # expanded graft sites (SPEC 2.1); False = the w/o-EG ablation
    nd: bool = True  # non-destructive grafting (SPEC 2.2); False = the w/o-ND ablation

    def __post_init__(self):
        if self.name not in METHODS:
            raise ConfigError(f"unknown method '{self.name}'. Methods: {', '.join(METHODS)}")

    @property
    def hf_peer(self) -> bool:
        """Run by Hugging Face's own generate (no rounds of ours)."""
        return self.name in HF_METHODS

    @property
    def drafts(self) -> bool:
        """Drafts trees (every method but plain autoregressive decoding and the HF peers)."""
        return self.name in TREE_METHODS

    @property
    def label(self) -> str:
        return self.name + ("" if self.eg else " --no-eg") + ("" if self.nd else " --no-nd")


@dataclass
class StepState:
    """What a policy may look at before draft step k."""

    k: int  # 1..D
    depth: int  # D
    tree: DraftTree
    actions: list[int] = field(default_factory=list)  # this round's earlier actions
    prompt_len: int = 0
    t_target_ms: float = 0.0  # measured verification time (running mean)
    t_mid_ms: float = 0.0  # measured mid step time (running mean)
    verify_growth: float = 0.0  # log T(8) / T(0) of this host's verification cost curve (0: not measured)


@dataclass
class Decision:
    action: int  # SMALL or MID
    margin: float | None = None
    features: list[float] | None = None
    by: str = ""  # what computed the margin (StepTrace.decided_by)


@dataclass
class RoundOutcome:
    """What a verified round tells its policy (`Policy.observe`), before anything is committed."""

    tree: DraftTree
    kept: np.ndarray  # [n] verified non-root nodes
    path: list[int]  # the accepted path, root first
    bonus: int  # the target's token after it
    round_ms: float  # the round's drafting + verification
    mid_ms: float  # its mid steps
    row_ms: float  # what one more accepted token's logits row costs here
    verify_ms: Callable[[np.ndarray], np.ndarray]  # T(n) on this host: [m] node counts -> [m] ms
    small_cut: Callable[[DraftTree, np.ndarray], np.ndarray]  # the tree's n-gram nodes -> those an all-small round
    # would have verified (Pruner.cut_among)


class Policy:
    name = "policy"
    note: str | None = None  # said once in the result (e.g. a fallback)
    calls_mid = True  # whether it may ever call the mid (if not, the mid is never fed the prompt)
    calls_every_round = True  # whether it calls the mid in (nearly) every round: then the mid reads the prompt in
    # the prefill; a policy that calls it only where it pays (the learned scheduler) feeds it at its first call
    observes = False  # whether it learns within a request from each verified round (`observe`; the yield gate)

    def start_round(self) -> None:
        """Called before each round's first step."""

    def decide(self, state: StepState) -> Decision:
        raise NotImplementedError

    def observe(self, outcome: RoundOutcome) -> None:
        """After each committed round, for a policy that `observes`."""


class AllSmall(Policy):
    name = "all-small"
    calls_mid = calls_every_round = False

    def decide(self, state: StepState) -> Decision:
        return Decision(SMALL)


class AllMid(Policy):
    name = "all-mid"

    def decide(self, state: StepState) -> Decision:
        return Decision(MID)


class Fixed(Policy):
    name = "fixed"

    def __init__(self, schedule: tuple[int, ...]):
        self.schedule = tuple(schedule)
        self.calls_mid = self.calls_every_round = any(self.schedule)

    def decide(self, state: StepState) -> Decision:
        return Decision(MID if self.schedule[(state.k - 1) % len(self.schedule)] else SMALL)


SCHEDULED = ("treegraft", "oracle")  # methods whose policy reads a trained scheduler file and the timing means


def yield_gated(spec: MethodSpec, drafting: DraftingConfig) -> bool:
    """`treegraft` whose step 1 the request's yield gate decides (scheduler/online.py), not the learned scheduler."""
    return spec.name == "treegraft" and drafting.mid_gate == "yield"


def make_policy(spec: MethodSpec, drafting: DraftingConfig, scheduler: str | None = None,
                b0: int | None = None) -> Policy:
    """The policy of a method; `treegraft`/`oracle` need the pair's trained scheduler file and fall back
    to the fixed schedule, saying so in `policy.note`, when the pair has none. `treegraft` with
    `mid_gate = "yield"`: step 1 by the request's yield gate (scheduler/online.py), a call round's steps up to
    `mid_lead` the mid's, the later ones the n-gram's."""
    if yield_gated(spec, drafting):
        from .scheduler.online import GatedPolicy

        return GatedPolicy(drafting.mid_lead)
    if spec.name in SCHEDULED:
        from .scheduler.policy import LearnedPolicy, OraclePolicy, SchedulerFile

        path = resolve_path(scheduler) if scheduler else None
        if path is None or not path.is_file():
            policy = Fixed(drafting.schedule)
            policy.note = (f"no trained scheduler for this pair ({scheduler or 'none configured'}): "
                           f"{spec.name} falls back to the fixed schedule {list(drafting.schedule)}")
            return policy
        sched = SchedulerFile.load(path)
        if sched.depth != drafting.depth:
            raise ConfigError(f"the scheduler {path} was trained for D={sched.depth}, not D={drafting.depth}")
        if spec.name == "oracle":
            return OraclePolicy(sched, drafting.width, drafting.top_k)
        return LearnedPolicy(sched, drafting.width, drafting.top_k, b0)
    if spec.name == "all-small":
        return AllSmall()
    if spec.name == "all-mid":
        return AllMid()
    if spec.name == "fixed":
        return Fixed(drafting.schedule)
    raise ConfigError(f"method '{spec.name}' drafts no tree of this engine")


def parse_schedule(text: str) -> tuple[int, ...]:
    try:
        bits = tuple(int(x) for x in text.replace(" ", "").split(",") if x != "")
    except ValueError:
        raise ConfigError(f"--schedule must be comma-separated 0/1 values, got '{text}'") from None
    if not bits or any(b not in (0, 1) for b in bits):
        raise ConfigError(f"--schedule must be comma-separated 0/1 values, got '{text}'")
    return bits


@profiled("scheduler")
def decide(policy: Policy, state: StepState) -> Decision:
    return policy.decide(state)


class Stepwise:
    """How a tree method drafts a round: D steps on one shared tree; before each the policy decides, then
    that action's drafter steps (SMALL: n-gram, MID: the mid grafter)."""

    def __init__(self, policy: Policy, drafters: dict):
        self.policy = policy
        self.drafters = drafters  # SMALL / MID -> a drafter with .step(session, tree, k) -> StepTrace
        self.note = policy.note

    @property
    def calls_mid(self) -> bool:
        return self.policy.calls_mid

    @property
    def calls_every_round(self) -> bool:
        return self.policy.calls_every_round

    def with_policy(self, policy: Policy) -> "Stepwise":
        """The same drafters under another policy (scheduler data collection replays schedules)."""
        return Stepwise(policy, self.drafters)

    def draft(self, s, tree: DraftTree) -> list[StepTrace]:
        steps, actions = [], []
        self.policy.start_round()
        watch = Stopwatch(s.device)
        depth = s.drafting.depth  # D, or the depth gate's once step 1 is taken
        for k in range(1, s.drafting.depth + 1):
            if k > depth:
                break
            decision = decide(self.policy, s.step_state(tree, k, actions))
            sched_s = watch.lap()
            if decision.action == MID and s.prompt_at_first_call:
                self.drafters[MID].feed_prompt(s)  # once: the prompt, not this step's cost (nor t_mid's)
                s.prompt_at_first_call = False
                watch.lap()
            step = self.drafters[decision.action].step(s, tree, k)
            step.draft_s, step.sched_s = watch.lap(), sched_s
            step.margin, step.features, step.decided_by = decision.margin, decision.features, decision.by
            actions.append(decision.action)
            steps.append(step)
            if k == 1 and s.depth_gate is not None:
                depth = s.depth_gate.of(step.action).steps()  # by who took step 1
        return steps


def build_method(spec: MethodSpec, drafting: DraftingConfig, mid, scheduler: str | None = None):
    """The factory: how a tree method drafts, over the engine's mid drafter (LM or head). Returns an object
    with .draft(session, tree) -> [StepTrace] and .note: a `Stepwise` plan, or the CSD `Cascade`."""
    from .drafters.cascade import Cascade
    from .drafters.graft import MidGrafter
    from .drafters.ngram import SmallDrafter

    if spec.name == "csd":
        return Cascade(mid)
    policy = make_policy(spec, drafting, scheduler, drafting.mid_budget)
    return Stepwise(policy, {SMALL: SmallDrafter(), MID: MidGrafter(mid, eg=spec.eg, nd=spec.nd)})
