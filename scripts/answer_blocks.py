"""Answer the draft head's training prompts block by block, chat, follow-up and task blocks interleaved, keeping each
finished block in the repository's answer store (`AnswerSettings.store`), so that training on a fresh machine
reads them instead of answering them again. Resumable: a block in the cache folder continues where it stopped,
a block in the store is not answered again.

    PYTHONPATH=. .venv/bin/python scripts/answer_blocks.py --answers 3840 --tasks 1920 --first-block 4 \
        --first-task-block 3
    PYTHONPATH=. .venv/bin/python scripts/answer_blocks.py --answers 0 --tasks 0 --followups 1280
"""
import argparse
import time

import torch

from treegraft.answers import AnswerSettings, block_answers, followup_block_answers, task_block_answers
from treegraft.config import load_pair
from treegraft.models import load_model, load_tokenizer, pick_device

STORE = "models/smollm2-answers"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="default")
    ap.add_argument("--answers", type=int, default=2560)
    ap.add_argument("--tasks", type=int, default=1440)
    ap.add_argument("--followups", type=int, default=0, help="3-turn follow-up prompts (whole blocks of 640)")
    ap.add_argument("--first-block", type=int, default=0, help="chat blocks from this one")
    ap.add_argument("--first-followup-block", type=int, default=0, help="follow-up blocks from this one")
    ap.add_argument("--first-task-block", type=int, default=0, help="task blocks from this one")
    ap.add_argument("--store", default=STORE)
    args = ap.parse_args()
    pair = load_pair(args.pair)
    s = AnswerSettings(prompts=args.answers, tasks=args.tasks, store=args.store, first_block=args.first_block,
                       first_task_block=args.first_task_block, followups=args.followups,
                       first_followup_block=args.first_followup_block)
    target = load_model(pair.target, torch.float32, pick_device(pair.device))
    tok = load_tokenizer(pair.target)
    answer = {"chat": block_answers, "follow-up": followup_block_answers, "task": task_block_answers}
    order = ([("chat", b) for b in range(s.first_block, s.blocks) if args.answers]
             + [("follow-up", b) for b in range(s.first_followup_block, s.followup_blocks)]
             + [("task", b) for b in range(s.first_task_block, s.task_blocks)])
    order.sort(key=lambda kb: (kb[1], kb[0]))  # c0, f0, t0, c1, f1, t1, ...
    for kind, b in order:
        t0 = time.time()
        rows = answer[kind](target, tok, s, b)
        print(f"{kind} block {b}: {len(rows)} answers in {(time.time() - t0) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
