"""The methods one engine runs (SPEC 4), and the policy each one drafts with."""
from __future__ import annotations

from dataclasses import dataclass

from .config import ConfigError, DraftingConfig
from .policies import AllMid, AllSmall, Fixed, Policy

TREE_METHODS = ("all-small", "all-mid", "fixed")
METHODS = ("ar",) + TREE_METHODS


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


def make_policy(spec: MethodSpec, drafting: DraftingConfig) -> Policy:
    if spec.name == "all-small":
        return AllSmall()
    if spec.name == "all-mid":
        return AllMid()
    if spec.name == "fixed":
        return Fixed(drafting.schedule)
    raise ConfigError(f"method '{spec.name}' drafts no tree")


def parse_schedule(text: str) -> tuple[int, ...]:
    try:
        bits = tuple(int(x) for x in text.replace(" ", "").split(",") if x != "")
    except ValueError:
        raise ConfigError(f"--schedule must be comma-separated 0/1 values, got '{text}'") from None
    if not bits or any(b not in (0, 1) for b in bits):
        raise ConfigError(f"--schedule must be comma-separated 0/1 values, got '{text}'")
    return bits
