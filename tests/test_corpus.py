"""The n-gram drafter's corpus of the target's earlier answers (drafters/corpus.py): counts, merge, files."""
import random
from collections import Counter, defaultdict

import numpy as np
import pytest

from treegraft.drafters.corpus import MAX_FOLLOWERS, CorpusError, CorpusIndex, load_corpus, save_corpus
from treegraft.drafters.ngram import BACKOFF, NgramIndex


def _docs(seed=0, vocab=7, n=40):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(1, 50))] for _ in range(n)]


@pytest.mark.parametrize("vocab", [7, 49_152])
def test_every_ngram_has_its_counted_followers(vocab):
    """Against a plain count per order: the best follower and its p = count / total, never across documents."""
    docs = _docs(vocab=7)
    docs = [[t * (vocab // 7) for t in d] for d in docs]  # wide ids exercise the packed keys' high bits
    index = CorpusIndex([np.array(d) for d in docs], vocab, n_max=4)
    assert index.n_max == 4
    for n in range(1, 5):
        ref = defaultdict(Counter)
        for d in docs:
            for i in range(len(d) - n):
                ref[tuple(d[i:i + n])][d[i + n]] += 1
        for gram, followers in ref.items():
            props, order = index.propose(gram, MAX_FOLLOWERS)
            total, best = sum(followers.values()), max(followers.values())
            assert order == n
            assert followers[props[0][0]] == best and props[0][1] == pytest.approx(best / total)
            assert [p for _, p in props] == sorted((p for _, p in props), reverse=True)
    # the last token of one document is never followed by the first of the next
    joins = {(a[-1], b[0]) for a, b in zip(docs, docs[1:])}
    inside = {(d[i], d[i + 1]) for d in docs for i in range(len(d) - 1)}
    for a, b in joins - inside:
        assert b not in [t for t, _ in index.propose((a,), MAX_FOLLOWERS)[0]]


def test_wide_vocabularies_keep_exact_keys():
    assert CorpusIndex([np.array([1, 2, 3])], 151_936, n_max=5).n_max == 3  # 18 bits a token
    assert CorpusIndex([np.array([1, 2, 3])], 49_152, n_max=5).n_max == 4


def test_the_longer_match_leads_and_the_context_wins_ties():
    corpus = CorpusIndex([np.array([10, 11, 12, 13, 14]), np.array([11, 12, 20])], 64, n_max=4)
    ctx = NgramIndex(5, corpus)
    ctx.extend([5, 12, 30, 9, 10, 11, 12])
    # context: "12" -> 30 (order 1); corpus: "10 11 12" -> 13 (order 3) leads, the context fills in scaled
    props = ctx.propose([], 3)
    assert props[0] == (13, pytest.approx(1.0))
    assert (30, pytest.approx(BACKOFF * 1.0)) in props
    # a tie at order 2
    tie = NgramIndex(5, corpus)
    tie.extend([11, 12, 40, 7, 11, 12])  # context "11 12" -> 40 (order 2); corpus "11 12" -> 13 or 20
    props = tie.propose([], 2)
    assert props[0][0] == 40  # the context's own text leads on a tie
    assert props[1][0] in (13, 20) and props[1][1] == pytest.approx(BACKOFF * 0.5)


def test_without_a_corpus_the_drafter_is_unchanged():
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3, 8]
    a, b = NgramIndex(3), NgramIndex(3, CorpusIndex([], 16))
    a.extend(toks)
    b.extend(toks)
    for tail in ([], [1, 2, 3], [2, 3], [42]):
        assert a.propose(tail, 4) == b.propose(tail, 4)


def test_a_corpus_span_copies_a_phrase_the_context_never_held():
    corpus = CorpusIndex([np.array([1, 2, 3, 4, 5, 6, 7, 8])] * 2, 16, n_max=4)
    idx = NgramIndex(5, corpus)
    idx.extend([9, 1, 2, 3])
    assert [t for t, _ in idx.span([], 4)] == [4, 5, 6, 7]


def test_saved_corpus_round_trips_and_bad_files_are_refused(tmp_path):
    docs = _docs(seed=1)
    path = tmp_path / "c.npz"
    save_corpus(path, docs, {"source": "test"})
    loaded = load_corpus(path, 7, 4)
    fresh = CorpusIndex([np.array(d) for d in docs], 7, 4)
    assert loaded.describe() == fresh.describe()
    for gram in [(1,), (2, 3), (0, 1, 2), (4, 4, 4, 4)]:
        assert loaded.propose(gram, 4) == fresh.propose(gram, 4)
    with pytest.raises(CorpusError, match="outside the vocabulary"):
        load_corpus(path, 3, 4)
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path / "none.npz", 7, 4)
    (tmp_path / "bad.npz").write_text("x")
    with pytest.raises(CorpusError, match="is not a TreeGraft corpus"):
        load_corpus(tmp_path / "bad.npz", 7, 4)


def test_several_corpus_files_are_read_as_one_store(tmp_path):
    """A pair may list corpus files (models.yaml `corpus: [a, b]`): their documents form one index, the same as one
    file holding them all; a missing one is named."""
    a, b = _docs(seed=2), _docs(seed=3)
    save_corpus(tmp_path / "a.npz", a, {})
    save_corpus(tmp_path / "b.npz", b, {})
    save_corpus(tmp_path / "ab.npz", a + b, {})
    both = load_corpus([tmp_path / "a.npz", tmp_path / "b.npz"], 7, 4)
    one = load_corpus(tmp_path / "ab.npz", 7, 4)
    assert both.describe() == one.describe() and both.docs == len(a) + len(b)
    assert both.describe() != load_corpus(tmp_path / "a.npz", 7, 4).describe()
    for gram in [(1,), (2, 3), (0, 1, 2), (4, 4, 4, 4)]:
        assert both.propose(gram, 4) == one.propose(gram, 4)
    with pytest.raises(CorpusError, match="c.npz not found"):
        load_corpus([tmp_path / "a.npz", tmp_path / "c.npz"], 7, 4)


def test_the_engine_drafts_from_the_corpus_and_stays_exact(engine):
    """The default pair ships a corpus: all-small with and without it equals AR, and the corpus changes the drafts
    (a fixed B_ver, so that no timing decides the trees)."""
    from treegraft.config import GenerationConfig, load_pair
    from treegraft.methods import MethodSpec
    from treegraft.prompts import load_prompts

    assert engine.pair.corpus is not None and engine.pair.corpus.tokens > 10_000
    prompt = next(p for p in load_prompts("default") if p.category == "math")
    ids, gen = engine.encode(prompt.messages), GenerationConfig(max_new_tokens=24)
    base = load_pair("default").drafting.model_copy(update={"adaptive_budget": False, "budget": 15})
    ar = engine.generate(ids, MethodSpec("ar"), base, gen).new_tokens
    runs = {c: engine.generate(ids, MethodSpec("all-small"), base.model_copy(update={"corpus": c}), gen)
            for c in (True, False)}
    assert all(r.new_tokens == ar for r in runs.values())
    assert runs[True].rounds[0].tree.token != runs[False].rounds[0].tree.token
    session = engine.start(ids, MethodSpec("all-small"), base.model_copy(update={"corpus": False}), gen)
    assert session.ngram.corpus is None


def test_corpus_documents_leave_out_sampled_answers_and_the_schedulers_prompts(fp32_pair):
    from treegraft.answers import corpus_documents
    from treegraft.prompts import chat_ids, load_prompts

    tok = fp32_pair.tokenizer
    train = chat_ids(tok, list(load_prompts("train")[0].messages))
    other = chat_ids(tok, ["What is the capital of France?"])
    rows = [{"ids": other + [10, 11, 2], "prompt_len": len(other), "sampled": False},
            {"ids": other + [12, 2], "prompt_len": len(other), "sampled": True},
            {"ids": train + [13, 2], "prompt_len": len(train), "sampled": False}]
    docs = corpus_documents(tok, rows)
    assert len(docs) == 1 and docs[0][-3:] == [10, 11, 2]
    assert tok.decode(docs[0][:-3]).strip().endswith("assistant")  # the generation header leads in


def test_corpus_documents_leave_out_answers_about_an_evaluated_prompts_passage(fp32_pair):
    """Task prompts are composed from a pool of passages, so a later block can ask about the passage an evaluated
    prompt asks about (the unseen suite's code, articles and contexts were, until this filter): such an answer is
    left out of the store, an answer to an unrelated prompt is kept, and a prompt that shares only the chat
    template with an evaluated one is kept."""
    from treegraft.answers import corpus_documents
    from treegraft.prompts import chat_ids, load_prompts

    tok = fp32_pair.tokenizer
    held = max((p for p in load_prompts("unseen") if p.category in ("code", "summarisation", "qa")),
               key=lambda p: len(p.messages[0]))  # the longest passage-bearing prompt (code, article or context)
    passage = held.messages[0][len(held.messages[0]) // 3:]  # the part after the instruction: its passage
    same = chat_ids(tok, ["Explain what this does, line by line:\n" + passage])
    other = chat_ids(tok, ["Write a haiku about the sea."])
    rows = [{"ids": same + [10, 2], "prompt_len": len(same), "sampled": False},
            {"ids": other + [11, 2], "prompt_len": len(other), "sampled": False}]
    docs = corpus_documents(tok, rows)
    assert [d[-2:] for d in docs] == [[11, 2]]


def test_the_corpus_is_switched_per_method_and_per_generation():
    from treegraft.bench import parse_methods
    from treegraft.cli import build_parser
    from treegraft.config import ConfigError, load_pair
    from treegraft.generate_cli import settings_from_args

    pair = load_pair("default")
    methods = {m.label: m.drafting.corpus for m in parse_methods("all-small,all-small:corpus=off", pair.drafting)}
    assert methods == {"ar": True, "all-small": True, "all-small:corpus=off": False}
    with pytest.raises(ConfigError, match="corpus"):
        parse_methods("all-small:corpus=maybe", pair.drafting)
    for flag, want in (([], True), (["--corpus", "off"], False)):
        args = build_parser().parse_args(["generate", "--prompt", "x", *flag])
        assert settings_from_args(pair, args)[0].corpus is want


def test_draft_vocabulary_ranked_by_the_targets_own_answers(tmp_path):
    """`draft-vocab --answer-store`: answer tokens (never prompt tokens) of every stored block, most frequent first."""
    import gzip
    import json

    from treegraft.distill import write_draft_vocab

    store = tmp_path / "store"
    store.mkdir()
    blocks = [[{"ids": [9, 9, 9, 9, 5, 7, 7, 3], "prompt_len": 4, "sampled": False}],
              [{"ids": [9, 7, 3, 3, 3], "prompt_len": 1, "sampled": True}]]
    for i, rows in enumerate(blocks):
        with gzip.open(store / f"answers-b{i}.jsonl.gz", "wt") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "vocab.json"
    info = write_draft_vocab(list(range(16)), out, size=3, answer_store=store)
    assert json.loads(out.read_text()) == [3, 7, 5]  # 3 x4, 7 x3, 5 x1; the prompts' 9s are not counted
    assert info["tokens_counted"] == 8 and info["coverage"][2048] == 1.0
