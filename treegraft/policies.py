"""Who drafts each step: the "when" of SPEC 2/5. Policies see the tree and the round's history, never models."""
from __future__ import annotations

from dataclasses import dataclass, field

from .tree import MID, SMALL, DraftTree


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


@dataclass
class Decision:
    action: int  # SMALL or MID
    margin: float | None = None
    features: list[float] | None = None


class Policy:
    name = "policy"
    note: str | None = None  # said once in the result (e.g. a fallback)

    def start_round(self) -> None:
        """Called before each round's first step."""

    def decide(self, state: StepState) -> Decision:
        raise NotImplementedError


class AllSmall(Policy):
    name = "all-small"

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

    def decide(self, state: StepState) -> Decision:
        return Decision(MID if self.schedule[(state.k - 1) % len(self.schedule)] else SMALL)
