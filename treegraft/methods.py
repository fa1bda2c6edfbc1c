"""The methods one engine runs (SPEC 4), and the policy each one drafts with."""
from __future__ import annotations

from dataclasses import dataclass

from .config import ConfigError, DraftingConfig, resolve_path
from .policies import AllMid, AllSmall, Fixed, Policy

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
    def label(self) -> str:
        return self.name + ("" if self.eg else " --no-eg") + ("" if self.nd else " --no-nd")


def make_policy(spec: MethodSpec, drafting: DraftingConfig, scheduler: str | None = None,
                b0: int | None = None) -> Policy:
    """The policy of a method; `treegraft`/`oracle` need the pair's trained scheduler file and fall back
    to the fixed schedule, saying so in `policy.note`, when the pair has none."""
    if spec.name in ("treegraft", "oracle"):
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
    if spec.name in ("all-small", "csd"):  # csd drafts by its own cascade rule (Engine.csd_draft)
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
