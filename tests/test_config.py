"""models.yaml validation: each bad case gives its clear message."""
import textwrap

import pytest

from treegraft.config import ConfigError, load_models_file, load_pair, with_overrides, DraftingConfig

GOOD = """
pairs:
  p:
    target: {hub: org/big}
    mid: {hub: org/small}
"""


def write(tmp_path, text):
    f = tmp_path / "models.yaml"
    f.write_text(textwrap.dedent(text))
    return f


def test_shipped_models_yaml_is_valid():
    pairs = load_models_file().pairs
    assert "default" in pairs and "qwen3-32b/qwen3-0.6b" in pairs and "llama-3.3-70b/llama-3.2-1b" in pairs
    assert all(not p.target.trust_remote_code and not p.mid.trust_remote_code for p in pairs.values())


def test_a_corpus_is_one_file_or_a_list(tmp_path):
    assert load_pair("p", write(tmp_path, GOOD)).corpus == []
    base = GOOD.rstrip("\n")
    assert load_pair("p", write(tmp_path, base + "\n    corpus: a.npz\n")).corpus == ["a.npz"]
    assert load_pair("p", write(tmp_path, base + "\n    corpus: [a.npz, b.npz]\n")).corpus == ["a.npz", "b.npz"]
    with pytest.raises(ConfigError, match="pairs.p.corpus"):
        load_pair("p", write(tmp_path, base + "\n    corpus: {a: 1}\n"))


def test_defaults_merge_and_pair_override(tmp_path):
    f = write(tmp_path, GOOD + "defaults:\n  drafting: {width: 3}\n")
    assert load_pair("p", f).drafting.width == 3


@pytest.mark.parametrize("text, message", [
    ("pairs: [", "not valid YAML"),
    ("foo: 1", "must be a mapping with a 'pairs' section"),
    ("pairs: {}", "non-empty mapping"),
    ("pairs:\n  p: 3", "pair 'p' must be a mapping"),
    ("pairs:\n  p:\n    target: {hub: a}", "pairs.p.mid: Field required"),
    ("pairs:\n  p:\n    target: {hub: a, path: b}\n    mid: {hub: c}", "exactly one of hub, path or gguf_package"),
    ("pairs:\n  p:\n    target: {hub: a}\n    mid: {hub: c}\n    dtype: float8", "pairs.p.dtype"),
    ("pairs:\n  p:\n    target: {hub: a}\n    mid: {hub: c}\n    drafting: {width: zero}", "pairs.p.drafting.width"),
    ("pairs:\n  p:\n    target: {hub: a}\n    mid: {hub: c}\n    drafting: {budget: 0}", "greater than or equal to 1"),
    ("pairs:\n  p:\n    target: {hub: a}\n    mid: {hub: c}\n    colour: red", "pairs.p.colour: Extra inputs"),
    ("pairs:\n  p:\n    target: {gguf_package: x}\n    mid: {hub: c}", "gguf_package needs gguf_file"),
])
def test_bad_files_give_clear_messages(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        load_models_file(write(tmp_path, text))


def test_unknown_pair_lists_known_ones(tmp_path):
    with pytest.raises(ConfigError, match="unknown pair 'nope'.*p"):
        load_pair("nope", write(tmp_path, GOOD))


def test_missing_file():
    with pytest.raises(ConfigError, match="models file not found"):
        load_models_file("/nonexistent/models.yaml")


def test_out_of_range_override_is_rejected():
    with pytest.raises(ConfigError, match="depth"):
        with_overrides(DraftingConfig(), depth=99)
    with pytest.raises(ConfigError, match="schedule"):
        with_overrides(DraftingConfig(), schedule=(1, 2))
