"""Typed, JSON-serialisable records of a generation: what the UI and the benchmark read.

A `RoundTrace` holds the whole tree as drafted (pruned and overwritten nodes
included, flagged), every draft step (action, pool, frontier, added nodes,
graft sites, timings, the scheduler's margin) and the verification outcome.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from .profile import profiled
from .tree import DraftTree

TRACE_VERSION = 1
TREE_FIELDS = ("token", "parent", "depth", "logp", "score", "drafter", "step", "confirmed",
               "mid_visited", "graft_site", "alive", "kept")


@dataclass
class StepTrace:
    """One draft step; built with keywords (every field but k and action has a default)."""

    k: int  # 1..D
    action: str  # "small" | "mid"
    pool: list[int] = field(default_factory=list)  # C_k
    frontier: list[int] = field(default_factory=list)  # F_k
    added: list[int] = field(default_factory=list)  # new nodes
    confirmed: list[int] = field(default_factory=list)  # existing nodes re-proposed (de-duplicated)
    removed: list[int] = field(default_factory=list)  # nodes deleted by an overwrite (w/o-ND only)
    n_k: int = 0  # |N_k|, the small pool size at this step, for the pool-size ratio
    reselect_rate: float | None = None  # mid steps: share of F_k shallower than the deepest leaf
    draft_s: float = 0.0  # drafter time of this step
    margin: float | None = None  # the margin the decision read (learned policies: g_psi(z) - tau; the yield gate:
    # tokens per ms with its step-1 call minus without; "call the mid" where > 0)
    decided_by: str = ""  # what set the margin: "g_psi", "f_theta" (oracle), "yield" (the gate); "" where none did
    sched_s: float = 0.0  # scheduler decision time
    features: list[float] | None = None


@dataclass
class TreeSnapshot:
    token: list[int]
    parent: list[int]
    depth: list[int]
    logp: list[float]
    score: list[float]
    drafter: list[int]
    step: list[int]
    confirmed: list[int]
    mid_visited: list[bool]
    graft_site: list[bool]
    alive: list[bool]
    kept: list[bool]
    # each drafter's own p of a node (None: that drafter did not score it); p above follows the tree's rule
    # (tree.py: "paper" = the last drafter's, "calibrated" = learned acceptance). Absent in older traces.
    p_small: list[float | None] | None = None
    p_mid: list[float | None] | None = None

    @classmethod
    @profiled("trace")
    def of(cls, tree: DraftTree) -> "TreeSnapshot":
        n = tree.n
        own = [[None if p != p else p for p in col] for col in np.exp(tree.raw[:n]).round(4).T.tolist()]  # NaN: None
        return cls(**{f: getattr(tree, f)[:n].tolist() for f in TREE_FIELDS}, p_small=own[0], p_mid=own[1])

    @property
    def size(self) -> int:
        return len(self.token)


@dataclass
class RoundTrace:
    """One speculative round (or one AR token); built with keywords."""

    index: int
    prefix_len: int  # committed tokens before the round (root = the last of them)
    tree: TreeSnapshot
    bonus_token: int
    steps: list[StepTrace] = field(default_factory=list)
    accepted_path: list[int] = field(default_factory=lambda: [0])  # node ids, root first
    accepted_tokens: list[int] = field(default_factory=list)  # tokens of the accepted draft nodes (root excluded)
    draft_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    wall_s: float = 0.0
    profile_ms: dict = field(default_factory=dict)  # time per part of the round (treegraft/profile.py)

    @property
    def accepted(self) -> int:  # A
        return len(self.accepted_tokens)

    @property
    def mid_calls(self) -> int:
        return sum(s.action == "mid" for s in self.steps)


@dataclass
class GenerationResult:
    pair: str
    method: str
    prompt_tokens: int
    new_tokens: list[int]
    text: str
    wall_s: float
    prefill_s: float
    dtype: str
    device: str
    settings: dict
    rounds: list[RoundTrace] = field(default_factory=list)
    token_strings: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stopped: str = "length"  # "length" | "eos" | "cancelled"
    host: dict = field(default_factory=dict)  # this host's measured costs (Engine.host_costs): T(n), floor, B_ver

    @property
    def accepted(self) -> list[int]:
        return [r.accepted for r in self.rounds]

    def summary(self) -> dict:
        rounds = self.rounds
        n = len(self.new_tokens)
        draft = float(sum(r.draft_s for r in rounds))
        verify = float(sum(r.verify_s for r in rounds))
        return {
            "pair": self.pair, "method": self.method, "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens, "text": self.text, "rounds": len(rounds),
            "accepted": self.accepted,
            "mean_accepted": float(np.mean(self.accepted)) if rounds else 0.0,
            "tokens_per_round": n / len(rounds) if rounds else 1.0,
            "wall_s": self.wall_s, "prefill_s": self.prefill_s, "draft_s": draft, "verify_s": verify,
            "tokens_per_s": n / self.wall_s if self.wall_s > 0 else 0.0,
            "mid_calls": sum(r.mid_calls for r in rounds),
            "sched_s": float(sum(s.sched_s for r in rounds for s in r.steps)),
            "dtype": self.dtype, "device": self.device, "settings": self.settings,
            "notes": self.notes, "stopped": self.stopped, "host": self.host,
        }

    def to_json(self) -> dict:
        d = self.summary()
        d["version"] = TRACE_VERSION
        d["round_traces"] = [asdict(r) for r in self.rounds]
        d["token_strings"] = {str(k): v for k, v in self.token_strings.items()}
        return d


def round_from_dict(d: dict) -> RoundTrace:
    tree = TreeSnapshot(**{f: d["tree"][f] for f in TREE_FIELDS},
                        **{f: d["tree"].get(f) for f in ("p_small", "p_mid")})
    steps = [StepTrace(**{f.name: s[f.name] for f in fields(StepTrace) if f.name in s}) for s in d["steps"]]
    keys = {f.name for f in fields(RoundTrace)} - {"tree", "steps"}
    return RoundTrace(tree=tree, steps=steps, **{k: d[k] for k in keys if k in d})


def result_from_json(d: dict) -> GenerationResult:
    keys = {f.name for f in fields(GenerationResult)} - {"rounds", "token_strings"}
    res = GenerationResult(**{k: d[k] for k in keys if k in d})
    res.rounds = [round_from_dict(r) for r in d.get("round_traces", [])]
    res.token_strings = {int(k): v for k, v in d.get("token_strings", {}).items()}
    return res


def dumps(result: GenerationResult) -> str:
    return json.dumps(result.to_json())
