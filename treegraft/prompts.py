"""Prompt suites: JSONL files of {"id", "category", "prompt"} or {"id", "category", "turns": [...]}."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError

DATA = Path(__file__).resolve().parent / "data"
SUITES = {"default": DATA / "prompts.jsonl", "bench": DATA / "bench.jsonl", "train": DATA / "sched_train.jsonl",
          "unseen": DATA / "sched_unseen.jsonl"}  # unseen: prompts neither drafter learned from (answers.unseen_suite)


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: tuple[str, ...]  # alternating user / assistant turns, ending with a user turn

    @property
    def text(self) -> str:
        return self.messages[-1]


def chat_ids(tok, turns) -> list[int]:
    """Token ids of alternating user / assistant turns under the tokenizer's chat template, with the generation
    header (what the target answers from)."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))


def parse_line(line: str, where: str) -> Prompt:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: not valid JSON ({err})") from None
    turns = d.get("turns") if isinstance(d, dict) else None
    if isinstance(d, dict) and isinstance(d.get("prompt"), str):
        turns = [d["prompt"]]
    if not turns or not all(isinstance(t, str) for t in turns) or len(turns) % 2 == 0:
        raise ConfigError(f"{where}: needs a string 'prompt' or an odd-length list of strings 'turns'")
    return Prompt(str(d.get("id", where)), str(d.get("category", "uncategorised")), tuple(turns))


def load_prompts(suite_or_path: str = "default") -> list[Prompt]:
    path = SUITES.get(suite_or_path) or Path(suite_or_path)
    if not path.is_file():
        raise ConfigError(f"unknown suite or file '{suite_or_path}'. Suites: {', '.join(SUITES)}")
    lines = [(i, ln) for i, ln in enumerate(path.read_text().splitlines(), 1) if ln.strip()]
    return [parse_line(ln, f"{path.name}:{i}") for i, ln in lines]


def select(prompts: list[Prompt], per_category: int | None = None, limit: int | None = None) -> list[Prompt]:
    """The first `per_category` prompts of each category (in file order), then the first `limit`."""
    if per_category:
        prompts = [p for i, p in enumerate(prompts)
                   if sum(q.category == p.category for q in prompts[:i]) < per_category]
    return prompts[:limit] if limit else prompts
