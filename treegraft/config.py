"""Model pairs and drafting settings, loaded from `models.yaml` and validated.

Every value a user can set lives here, with its bounds. Validation errors are
turned into one readable message naming the file, the pair and the field
(`ConfigError`), never a raw traceback.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS_YAML = REPO_ROOT / "models.yaml"


class ConfigError(ValueError):
    """A models.yaml problem or an out-of-range setting, with a message meant for users."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DraftingConfig(_Strict):
    """The tree-growing knobs of SPEC 2 (names follow the paper)."""

    depth: int = Field(5, ge=1, le=16, description="D: draft steps per round")
    width: int = Field(8, ge=1, le=64, description="W: frontier width per step")
    top_k: int = Field(4, ge=1, le=32, description="K: children proposed per frontier node")
    mid_top_k: int | None = Field(None, ge=1, le=32, description="K of a mid step alone (None: K, as the n-gram "
                                  "drafter's)")
    budget: int = Field(63, ge=1, le=512, description="B_ver: non-root nodes kept for verification")
    ngram_max: int = Field(5, ge=1, le=16, description="n_max of the small (n-gram) drafter")
    span_max: int = Field(10, ge=0, le=32, description="longest copied span a small step may add under one "
                                                      "frontier node (drafters/ngram.py; 0: one token per child)")
    schedule: tuple[int, ...] = Field((1, 0, 1, 0, 1), description="the `fixed` method's schedule")
    corpus: bool = Field(True, description="the small drafter also reads the pair's corpus of the target's earlier "
                         "answers (PairConfig.corpus; drafters/corpus.py), where the pair has one")
    scores: Literal["calibrated", "paper"] = Field(
        "calibrated", description="p(v) of a node: 'paper' = the last drafter's own probability (a mid refresh "
        "replaces the n-gram drafter's); 'calibrated' = the learned probability that the target accepts it, "
        "from both drafters' own scores (tree.py)")
    small_pool: Literal["shared", "paper"] = Field(
        "shared", description="C_k of a small step: 'paper' = N_k, the nodes the previous step added (SPEC 2.1); "
        "'shared' = N_k plus the mid's graft sites the small drafter has not expanded, so a mid step never "
        "takes a site from the n-gram drafter (tree.small_sites)")
    expand: Literal["keepable", "all"] = Field(
        "keepable", description="which pool nodes a draft step expands: 'keepable' = only those the prune to this "
        "round's B_ver could still keep (their children score no higher, so any other's would be cut; "
        "prune.expandable); 'all' = the whole pool C_k (SPEC 2.1)")
    mid_levels: int | None = Field(None, ge=1, le=64, description="a mid step scores only pool nodes at most "
                                   "this many unevaluated ancestors deep (the draft head runs one forward per such "
                                   "level); deeper ones wait for a later call. None: every one (SPEC 2.1)")
    mid_prefill: bool = Field(True, description="the mid reads the prompt in one plain pass of its own: in the "
                              "prefill (as EAGLE does) for a method that calls it every round, at its first call "
                              "for the learned scheduler, which may never call it (timed as `mid_prefill`); "
                              "False: inside its first call's tree forward (the ablation)")
    mid_gate: Literal["yield", "off"] = Field(
        "off", description="treegraft's step 1: 'yield' = a mid call while this request's earlier calls measured "
        "more tokens per ms than their rounds would have had without them (scheduler/online.py), the n-gram "
        "drafter taking the steps after `mid_lead`; 'off' = the learned scheduler decides every step (the paper)")
    mid_lead: int = Field(1, ge=1, le=16, description="with mid_gate 'yield': a call round's first this many steps "
                          "are the mid's (its chain grows this deep before the n-gram drafter's first step; "
                          "scheduler/online.py); 1: the call at step 1 alone")
    lead: Literal["nodes", "path"] = Field(
        "nodes", description="with lazy logits and lead_rows: which kept nodes' logits rows the verification computes "
        "with the root's in one head call: 'nodes' = any, most likely first, while batching a row is cheaper than its "
        "expected lone call; 'path' = one path from the root (the likeliest child at each node)")
    depth_gate: Literal["yield", "off"] = Field(
        "off", description="how many of the D steps a round takes: 'yield' = the depth with the most tokens per ms by "
        "this request's measured steps (what each step's nodes added to accepted paths against its draft and "
        "verification ms; every few rounds all D, to keep measuring; scheduler/depth.py); 'off' = always D (the paper)")
    mid_budget: int | None = Field(None, ge=0, le=16, description="B0: at most this many mid calls per round "
                                                                  "for `treegraft` (None: no limit)")
    adaptive_budget: bool = Field(False, description="verify only the n <= B_ver nodes that pay for their "
                                                     "verification time (treegraft/prune.py); n = 0 is a plain step")
    verify_cost_cap: float | None = Field(1.6, ge=1.0, le=100.0, description="with adaptive_budget: B_ver shrinks "
                                          "to the largest probed n whose measured T(n) <= cap x T(0) (trees sized to "
                                          "the host; None: B_ver as set)")

    @model_validator(mode="after")
    def _schedule_bits(self) -> "DraftingConfig":
        if any(a not in (0, 1) for a in self.schedule):
            raise ValueError(f"schedule must be 0/1 values, got {list(self.schedule)}")
        return self


class GenerationConfig(_Strict):
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=100_000, description="0 = no top-k filter")
    max_new_tokens: int = Field(128, ge=1, le=4096)

    @property
    def greedy(self) -> bool:
        """The one place that decides greedy (temperature 0) vs sampling."""
        return self.temperature == 0


class ModelSource(_Strict):
    """Where one model's weights come from: exactly one of hub / path / gguf_package."""

    hub: str | None = None
    revision: str | None = None
    path: str | None = None
    gguf_package: str | None = None
    gguf_file: str | None = None
    trust_remote_code: bool = False
    kind: Literal["lm", "head"] = Field("lm", description="mid only: a causal LM sharing the tokenizer, or a "
                                                        "draft head on the target's features (drafters/head.py)")
    share_embeddings_with_target: bool = False
    draft_vocab: str | None = None  # mid only: JSON list of token ids, most frequent first (FR-Spec-style head)
    draft_vocab_size: int | None = Field(None, ge=16, description="use the first N ids of draft_vocab")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSource":
        given = [k for k in ("hub", "path", "gguf_package") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of hub, path or gguf_package (got {given or 'none'})")
        if self.gguf_package and not self.gguf_file:
            raise ValueError("gguf_package needs gguf_file (the .gguf file name inside the package)")
        if self.kind == "head" and not self.path:
            raise ValueError("a draft head (kind: head) is a local folder: give `path`")
        return self

    def describe(self) -> str:
        if self.hub:
            return f"hub:{self.hub}" + (f"@{self.revision}" if self.revision else "")
        if self.path:
            return f"path:{self.path}"
        return f"pip:{self.gguf_package}/{self.gguf_file}"


class PairConfig(_Strict):
    name: str = ""
    description: str = ""
    target: ModelSource
    mid: ModelSource
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    device_map: Literal["auto"] | None = None
    requires_gpu: bool = False
    chat_template: bool = True
    scheduler: str | None = None
    corpus: list[str] = Field(default_factory=list, description="the target's own earlier answers (.npz files of "
                              "token ids, `python -m treegraft corpus`; models.yaml: one path or a list, read as one "
                              "store): the n-gram drafter's second source, beside the context")
    small_batch_linear: bool = Field(True, description="CPU: few-row Linear inputs and the output head on the "
                                                        "path measured fastest at load (treegraft/cpu_kernels.py), "
                                                        "and a draft head's forward in one C++ call "
                                                        "(treegraft/drafters/fused.py)")
    lazy_logits: Literal["auto", "on", "off"] = Field("auto", description="verification computes the target's "
                                                      "logits only at the rows acceptance walks (treegraft/target.py); "
                                                      "auto: on for a CPU, off for a GPU (a batched head is free there)")
    wide_kernel: bool = Field(True, description="CPU with AVX-512: the packed kernel on blocks of 16 output rows is "
                                                "one of the measured paths (treegraft/cpu_kernels.py)")
    lead_rows: bool = Field(True, description="with lazy logits: the likely rows come with the root's in one "
                                              "head call (treegraft/prune.py, Pruner.lead_rows)")
    half_drafter: bool = Field(False, description="CPU, fp32: the mid drafter's own Linear weights (and its scorer's "
                               "rows) are rounded to fp16 at load, and a kernel reading them as fp16 (AVX-512) is one of "
                               "the measured paths: half the bytes a mid call streams. The target is never touched, so "
                               "output stays exact; only the drafts may differ (treegraft/cpu_kernels.py)")
    drafting: DraftingConfig = DraftingConfig()
    generation: GenerationConfig = GenerationConfig()

    @field_validator("corpus", mode="before")
    @classmethod
    def _corpus_list(cls, v):
        """One path or a list of them (None: no corpus)."""
        return [] if v is None else [v] if isinstance(v, str) else v


class ModelsFile(_Strict):
    pairs: dict[str, PairConfig]


def _format_error(err: ValidationError, source: str) -> str:
    lines = [f"{source} is invalid:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        lines.append(f"  - {loc or '(top level)'}: {e['msg']}")
    return "\n".join(lines)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_models(data: object, source: str = "models.yaml") -> ModelsFile:
    """Validate the parsed YAML; `defaults` (optional) is merged under every pair."""
    if not isinstance(data, dict) or "pairs" not in data:
        raise ConfigError(f"{source} is invalid: it must be a mapping with a 'pairs' section")
    defaults = data.get("defaults") or {}
    pairs = data["pairs"]
    if not isinstance(pairs, dict) or not pairs:
        raise ConfigError(f"{source} is invalid: 'pairs' must be a non-empty mapping of name -> pair")
    merged = {}
    for name, pair in pairs.items():
        if not isinstance(pair, dict):
            raise ConfigError(f"{source} is invalid: pair '{name}' must be a mapping, got {type(pair).__name__}")
        merged[name] = _merge(defaults, {**pair, "name": name})
    try:
        return ModelsFile(pairs=merged)
    except ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None


def load_models_file(path: str | Path = DEFAULT_MODELS_YAML) -> ModelsFile:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"models file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    return parse_models(data, str(path))


def load_pair(name: str, path: str | Path = DEFAULT_MODELS_YAML) -> PairConfig:
    models = load_models_file(path)
    if name not in models.pairs:
        known = ", ".join(sorted(models.pairs))
        raise ConfigError(f"unknown pair '{name}'. Pairs in {path}: {known}")
    return models.pairs[name]


def with_overrides(model: BaseModel, **overrides):
    """A copy of a settings model with some fields replaced, re-validated (clear error on bad values)."""
    fields = {k: v for k, v in overrides.items() if v is not None}
    try:
        return type(model).model_validate({**model.model_dump(), **fields})
    except ValidationError as err:
        raise ConfigError(_format_error(err, type(model).__name__)) from None


def resolve_path(p: str) -> Path:
    """Relative model paths in models.yaml are relative to the repository root."""
    path = Path(p).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path
