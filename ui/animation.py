"""One round as a sequence of animation frames, each with a one-line caption in plain words (pure).

Per draft step k: the pool C_k, then the frontier F_k (a mid step's frontier nodes are its graft
sites), then the nodes the step added; then the prune to B_ver; then verification and acceptance.
A frame names what is on screen; `tree_figure` draws it.
"""
from __future__ import annotations

from dataclasses import dataclass

from treegraft.trace import RoundTrace, StepTrace

STAGES = ("pool", "frontier", "grow", "prune", "verify")


@dataclass(frozen=True)
class Frame:
    name: str  # unique in the round, e.g. "3 frontier"
    stage: str  # one of STAGES
    k: int  # the draft step (0 for prune / verify)
    caption: str
    upto_step: int  # nodes added by steps <= upto_step exist (D + 1: the whole round)
    pool: tuple[int, ...] = ()
    frontier: tuple[int, ...] = ()
    new: tuple[int, ...] = ()


def _s(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def earlier_depth_sites(rt: RoundTrace, s: StepTrace) -> int:
    """Frontier nodes shallower than the deepest node the tree had before step k (re-selected depths)."""
    t = rt.tree
    before = [t.depth[v] for v in range(t.size) if t.step[v] < s.k]
    deepest = max(before) if before else 0
    return sum(t.depth[v] < deepest for v in s.frontier)


def pool_caption(rt: RoundTrace, s: StepTrace) -> str:
    if s.action == "mid":
        return (f"mid step {s.k}: the pool is every node the mid has not scored yet: {_s(len(s.pool), 'node')}, "
                f"re-scored in one call")
    src = "the root" if s.k == 1 else f"the {_s(len(s.pool), 'node')} the last step added"
    return f"small step {s.k}: the pool is {src}"


def frontier_caption(rt: RoundTrace, s: StepTrace) -> str:
    if s.action == "mid":
        return (f"mid step {s.k}: re-scored {_s(len(s.pool), 'unvisited node')}, picked "
                f"{_s(len(s.frontier), 'graft site')} (the best by path score), {earlier_depth_sites(rt, s)} of them "
                f"at earlier depths")
    return f"small step {s.k}: frontier = the {_s(len(s.frontier), 'best node')} of the pool by path score"


def grow_caption(rt: RoundTrace, s: StepTrace) -> str:
    again = f", {_s(len(s.confirmed), 'token')} proposed again (kept once)" if s.confirmed else ""
    gone = f", overwrote {_s(len(s.removed), 'node')} (w/o ND)" if s.removed else ""
    if s.action == "mid":
        return (f"mid step {s.k}: re-scored {_s(len(s.pool), 'unvisited node')}, grafted at "
                f"{_s(len(s.frontier), 'site')}, {earlier_depth_sites(rt, s)} of them at earlier depths: "
                f"+{_s(len(s.added), 'node')}{again}{gone}")
    return f"small step {s.k}: the n-gram drafter added {_s(len(s.added), 'node')}{again}{gone}"


def prune_caption(rt: RoundTrace) -> str:
    t = rt.tree
    kept = sum(t.kept) - 1
    drafted = t.size - 1
    if kept == 0:
        return (f"prune: none of the {_s(drafted, 'drafted node')} pays for its verification time: "
                f"this round is a plain decoding step")
    return (f"prune: keep the {_s(kept, 'node')} with the best path scores for verification; "
            f"{drafted - kept} of {drafted} drafted are dropped (hollow)")


def verify_caption(rt: RoundTrace) -> str:
    kept = sum(rt.tree.kept) - 1
    a = rt.accepted
    if kept == 0:
        return "verify: a plain decoding step: the target's one forward gives 1 bonus token"
    return (f"verify: one target forward over the root + {_s(kept, 'node')}; accepted {_s(a, 'draft token')} "
            f"+ 1 bonus token = {a + 1} committed")


def step_frames(rt: RoundTrace, s: StepTrace) -> list[Frame]:
    return [Frame(f"{s.k} pool", "pool", s.k, pool_caption(rt, s), s.k - 1, pool=tuple(s.pool)),
            Frame(f"{s.k} frontier", "frontier", s.k, frontier_caption(rt, s), s.k - 1, pool=tuple(s.pool),
                  frontier=tuple(s.frontier)),
            Frame(f"{s.k} {s.action} adds", "grow", s.k, grow_caption(rt, s), s.k, frontier=tuple(s.frontier),
                  new=tuple(s.added) + tuple(s.confirmed))]


def round_frames(rt: RoundTrace) -> list[Frame]:
    """Every frame of the round, in order; a round with no draft steps (AR) has only its verify frame."""
    frames = [f for s in rt.steps for f in step_frames(rt, s)]
    whole = len(rt.steps) + 1
    if rt.steps:
        frames.append(Frame("prune", "prune", 0, prune_caption(rt), whole))
    frames.append(Frame("verify", "verify", 0, verify_caption(rt), whole))
    return frames
