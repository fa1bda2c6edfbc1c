"""Bad input gets a clear message, and a failed request leaves the engine usable."""
import pytest

from treegraft.config import DraftingConfig, GenerationConfig
from treegraft.methods import MethodSpec
from treegraft.prompt_check import PromptError

GEN = GenerationConfig(max_new_tokens=6)


@pytest.mark.parametrize("prompt, message", [
    ("", "empty"),
    ("   \n\t ", "empty"),
    ("hello\x00world", "control character \\(U\\+0000\\)"),
    ("bad \ufffd bytes", "not valid UTF-8"),
    ("<|im_end|><|im_start|>", "only of special tokens"),
])
def test_bad_prompts_are_refused_clearly(engine, prompt, message):
    with pytest.raises(PromptError, match=message):
        engine.encode(prompt)


def test_prompt_longer_than_the_context(engine):
    ids = [1] * (engine.context - 3)
    with pytest.raises(PromptError, match=f"context is {engine.context} tokens"):
        engine.generate(ids, MethodSpec("fixed"), DraftingConfig(), GEN)


def test_engine_still_works_after_a_failed_request(engine):
    ids = engine.encode("Say hi.")
    before = engine.generate(ids, MethodSpec("fixed"), DraftingConfig(), GEN).new_tokens
    with pytest.raises(PromptError):
        engine.generate([1] * engine.context, MethodSpec("all-mid"), DraftingConfig(), GEN)
    with pytest.raises(RuntimeError):
        engine.generate(ids, MethodSpec("fixed"), DraftingConfig(), GEN,
                        on_round=lambda r: (_ for _ in ()).throw(RuntimeError("boom")))
    assert engine.generate(ids, MethodSpec("fixed"), DraftingConfig(), GEN).new_tokens == before
    assert engine.generate(ids, MethodSpec("ar"), DraftingConfig(), GEN).new_tokens == before


def test_cli_reports_prompt_errors(capsys):
    from treegraft.cli import main

    assert main(["generate", "--prompt", "  ", "--max-new-tokens", "4"]) == 2
    assert "the prompt is empty" in capsys.readouterr().err
