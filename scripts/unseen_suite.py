"""Write a prompt suite that neither drafter of a pair has learned from (`answers.unseen_suite`): chat prompts
from the ShareGPT block after the head's answered ones, task prompts from the task block after its answered
ones, read from the head's own record of what it was trained on (`distill.json`).

    PYTHONPATH=. .venv/bin/python scripts/unseen_suite.py models/smollm2-head/distill.json \
        treegraft/data/sched_unseen.jsonl
"""
import json
import sys
from dataclasses import fields
from pathlib import Path

from treegraft.answers import AnswerSettings, unseen_suite
from treegraft.config import load_pair
from treegraft.models import load_tokenizer


def main(record: str, out: str, pair: str = "default", per_category: int = 6) -> None:
    trained = json.loads(Path(record).read_text())["settings"]["answers"]
    s = AnswerSettings(**{f.name: trained[f.name] for f in fields(AnswerSettings) if f.name in trained})
    rows = unseen_suite(load_tokenizer(load_pair(pair).target), s, per_category)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} prompts -> {out} (after chat blocks 0-{s.blocks - 1}, task blocks 0-{s.task_blocks - 1})")


if __name__ == "__main__":
    main(*sys.argv[1:3])
