"""Prompt validation shared by the CLI, the Python API and the app: clear errors, nothing silently changed."""
from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class PromptError(ValueError):
    """A prompt the engine refuses, with the reason in words."""


def check_text(prompt: str) -> None:
    if not isinstance(prompt, str):
        raise PromptError(f"the prompt must be text, got {type(prompt).__name__}")
    if not prompt.strip():
        raise PromptError("the prompt is empty (or only whitespace)")
    bad = _CONTROL.search(prompt)
    if bad:
        raise PromptError(f"the prompt contains a control character (U+{ord(bad.group()):04X}) at position "
                          f"{bad.start()}; remove it")
    if "\ufffd" in prompt:
        raise PromptError("the prompt contains U+FFFD: it was not valid UTF-8 text")


def check_special_only(tokenizer, prompt: str) -> None:
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    special = set(tokenizer.all_special_ids)
    if ids and all(i in special for i in ids):
        raise PromptError("the prompt consists only of special tokens; write some text")


def check_length(n_prompt: int, max_new_tokens: int, context: int) -> None:
    if n_prompt + max_new_tokens > context:
        raise PromptError(f"the prompt is {n_prompt} tokens and {max_new_tokens} new tokens were asked for, "
                          f"but the target's context is {context} tokens; shorten the prompt or ask for fewer "
                          f"tokens (at most {max(0, context - n_prompt)})")
