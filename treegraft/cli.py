"""`python -m treegraft {generate,bench,scheduler,distill,draft-vocab,corpus,pairs}`: a thin shell over the engine."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import DEFAULT_MODELS_YAML, ConfigError, load_models_file, load_pair, resolve_path, with_overrides
from .generate_cli import on_off
from .models import ModelLoadError, VocabularyMismatchError
from .prompt_check import PromptError


def layer_list(text: str) -> tuple[int, ...]:
    """"2,15" -> (2, 15): decoder layer indices (argparse type)."""
    try:
        layers = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated layer indices, e.g. 2,15") from None
    if any(t < 0 for t in layers):
        raise argparse.ArgumentTypeError(f"{text!r}: layer indices are 0 or more")
    return layers


def _distill(args) -> int:
    pair = load_pair(args.pair, args.models)
    if (args.kind or pair.mid.kind) == "head":
        return _distill_head(args, pair)
    from .distill import DistillSettings, distill

    out = Path(args.out) if args.out else resolve_path(pair.mid.path or "models/distilled-mid")
    s = DistillSettings(layers=args.layers, minutes=args.minutes, max_steps=args.max_steps, seed=args.seed,
                        lr=args.lr or 6e-4, batch=args.batch, seq_len=args.seq_len or 128, init_from=args.init_from)
    distill(pair, out, s)
    return 0


def _distill_head(args, pair) -> int:
    from .answers import AnswerSettings
    from .distill_head import HeadSettings, default_out, measure_agreement, profile_step, promote, train_head

    out = Path(args.out) if args.out else default_out(pair)
    answers = AnswerSettings(prompts=args.answers, max_new_tokens=args.answer_tokens,
                             sampled_share=args.sampled_share, seed=args.seed, tasks=args.tasks,
                             first_block=args.first_block, first_task_block=args.first_task_block,
                             followups=args.followups, first_followup_block=args.first_followup_block,
                             store=args.answer_store)
    s = HeadSettings(windows=args.windows, seq_len=args.seq_len or 256, batch=args.batch,
                     lr=args.lr or 5e-4, minutes=args.minutes, max_steps=args.max_steps, depths=args.depths,
                     seed=args.seed, data=args.data, answers=answers, patience=args.patience,
                     eval_every=args.eval_every, init_from=args.init_from, loss=args.loss,
                     candidates=args.candidates, precision=args.precision, layers=args.head_layers,
                     taps=args.head_taps)
    if args.profile_step:
        print(json.dumps(profile_step(pair, s), indent=2))
        return 0
    if not args.agreement_only:
        train_head(pair, out, s, resume=args.resume)
    result = measure_agreement(pair, out, args.eval_suite, args.eval_limit, args.eval_tokens, args.eval_per_category)
    print(json.dumps(result, indent=2))
    if args.promote:
        print(promote(out, default_out(pair)))
    return 0


def _sched_collect(args) -> int:
    from .engine import Engine
    from .models import load_pair_models
    from .prompts import load_prompts
    from .scheduler.train import collect

    pair = load_pair(args.pair, args.models)
    engine = Engine(load_pair_models(pair, args.dtype))
    n = collect(engine, load_prompts(args.suite), Path(args.out), pair.drafting, args.rounds_per_prompt,
                args.max_new_tokens, args.max_minutes)
    print(f"wrote {n} rounds to {args.out}")
    return 0


def _sched_train(args) -> int:
    from .scheduler.train import read_dataset, train

    pair = load_pair(args.pair, args.models)
    out = Path(args.out) if args.out else (resolve_path(pair.scheduler) if pair.scheduler else None)
    if out is None:
        raise ConfigError(f"pair '{args.pair}' has no `scheduler:` path in models.yaml; pass --out")
    records = read_dataset(Path(args.data))
    profiles = None
    if args.jitter or args.profiles:
        from .scheduler.costs import CostProfile, jittered

        source = CostProfile.of_records(records)
        profiles = ([source] + jittered(source, args.jitter, args.seed)
                    + [CostProfile.from_json(json.loads(Path(f).read_text())) for f in args.profiles])
    sched = train(records, pair.drafting.depth, select=not args.no_select, bonus=0.0 if args.paper_eta else 1.0,
                  profiles=profiles, seed=args.seed, features=args.features.split(",") if args.features else None)
    sched.meta["pair"] = args.pair
    sched.save(out)
    print(f"wrote {out} (tree features: {', '.join(sched.tree_features)}; g_psi {sched.g.n_params} params)")
    return 0


def _sched_profile(args) -> int:
    from .engine import Engine
    from .models import load_pair_models
    from .models import host
    from .prompts import load_prompts
    from .scheduler.costs import measure

    pair = load_pair(args.pair, args.models)
    engine = Engine(load_pair_models(pair, args.dtype))
    ids = engine.encode(load_prompts(args.suite)[0].messages)
    prof = measure(engine, ids, pair.drafting, args.name or f"{engine.dtype_name}")
    Path(args.out).write_text(json.dumps({**prof.to_json(), "machine": host(), "dtype": engine.dtype_name}, indent=1))
    print(json.dumps(prof.to_json()))
    return 0


def _sched_mid_effect(args) -> int:
    from .engine import Engine
    from .mid_effect import mid_effect, summary
    from .models import load_pair_models
    from .prompts import load_prompts, select

    pair = load_pair(args.pair, args.models)
    engine = Engine(load_pair_models(pair, args.dtype))
    prompts = select(load_prompts(args.suite), args.per_category, args.limit)
    rows, fresh = {}, engine.state()
    for rule in args.scores.split(","):
        drafting = with_overrides(pair.drafting, scores=rule)
        engine.restore(fresh)  # each rule learns its own acceptance record from the same start
        result = mid_effect(engine, [engine.encode(p.messages) for p in prompts], drafting, args.rounds,
                            args.max_new_tokens)
        rows[rule] = {"rounds": result["rounds"], "mean_A": summary(result), "A": result["A"]}
        print(f"{rule}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows[rule]["mean_A"].items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"pair": args.pair, "suite": args.suite,
                                              "prompts": [p.id for p in prompts], **rows}, indent=1))
    return 0


def _sched_transfer(args) -> int:
    from .scheduler.costs import CostProfile
    from .scheduler.policy import SchedulerFile
    from .scheduler.replay import transfer_check
    from .scheduler.train import read_dataset

    pair = load_pair(args.pair, args.models)
    features = SchedulerFile.load(resolve_path(pair.scheduler)).tree_features if args.features is None \
        else args.features.split(",")
    profiles = [CostProfile.from_json(json.loads(Path(f).read_text())) for f in args.profiles]
    result = transfer_check(read_dataset(Path(args.data)), profiles, pair.drafting.depth, features,
                            n_jitter=args.jitter, seed=args.seed)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


def _sched_ceiling(args) -> int:
    from .scheduler.policy import SchedulerFile
    from .scheduler.replay import ceiling
    from .scheduler.train import read_dataset

    pair = load_pair(args.pair, args.models)
    sched = SchedulerFile.load(Path(args.scheduler) if args.scheduler else resolve_path(pair.scheduler))
    scales = tuple(float(x) for x in args.mid_scales.split(","))
    result = ceiling(read_dataset(Path(args.data)), pair.drafting.depth, sched, scales)
    for scale, rows in result["by_scale"].items():
        print(f"mid step x{scale} ({result['rounds']} rounds): speedup over AR (mid calls per step)")
        for cat, row in rows.items():
            print(f"  {cat:14s} " + "  ".join(f"{k} {v['speedup']:.3f}x ({v['mid_rate']:.2f})"
                                              for k, v in row.items() if isinstance(v, dict))
                  + "".join(f"  {c}/all-small {row[f'{c} / all-small']:.3f}, /best single {row[f'{c} / best single']:.3f}"
                            for c in ("prompt, held out", "prompt ceiling", "ceiling")))
    if args.out:
        Path(args.out).write_text(json.dumps({"data": args.data, **result}, indent=1))
        print(f"wrote {args.out}")
    return 0


def _draft_vocab(args) -> int:
    from .distill import write_draft_vocab
    from .models import load_tokenizer

    pair = load_pair(args.pair, args.models)
    out = Path(args.out) if args.out else resolve_path(pair.mid.draft_vocab or "draft_vocab.json")
    store = resolve_path(args.answer_store) if args.answer_store else None
    info = write_draft_vocab(load_tokenizer(pair.target), out, args.size, answer_store=store)
    print(json.dumps({"out": str(out), **info}))
    return 0


def _corpus(args) -> int:
    from .answers import AnswerSettings, corpus_documents, describe, target_answers
    from .drafters.corpus import load_corpus, save_corpus
    from .models import load_pair_models

    pair = load_pair(args.pair, args.models)
    out = Path(args.out) if args.out else resolve_path((pair.corpus or ["models/corpus.npz"])[0])
    loaded = load_pair_models(pair.model_copy(update={"corpus": []}), "float32")
    s = AnswerSettings(prompts=args.answers, tasks=args.tasks, max_new_tokens=args.answer_tokens, seed=args.seed,
                       first_block=args.first_block, first_task_block=args.first_task_block, store=args.answer_store)
    rows = target_answers(loaded.target, loaded.tokenizer, s)  # read from the store, or made in the cache folder
    docs = corpus_documents(loaded.tokenizer, rows)
    meta = {**describe(s, rows), "documents": len(docs), "tokens": sum(map(len, docs)),
            "note": "greedy answers only, each with the chat template's generation header"}
    save_corpus(out, docs, meta)
    index = load_corpus(out, len(loaded.tokenizer), pair.drafting.ngram_max)
    print(json.dumps({"out": str(out), **meta, "index": index.describe()}))
    return 0


def _bench(args) -> int:
    from .bench import bench_meta, parse_methods, run_bench, write_outputs
    from .engine import Engine
    from .load import background_load
    from .models import load_pair_models
    from .prompts import load_prompts, select

    pair = load_pair(args.pair, args.models)
    drafting = with_overrides(pair.drafting, budget=args.budget, width=args.width, depth=args.depth,
                              adaptive_budget=on_off(args.adaptive_budget))
    gen = with_overrides(pair.generation, max_new_tokens=args.max_new_tokens, temperature=0.0)
    prompts = select(load_prompts(args.prompts or args.suite), args.per_category, args.limit)
    methods = parse_methods(args.methods, drafting)
    engine = Engine(load_pair_models(pair, args.dtype))
    others = {m.pair: Engine(load_pair_models(load_pair(m.pair, args.models), args.dtype))
              for m in methods if m.pair and m.pair != args.pair}  # methods labelled @PAIR
    with background_load(args.background_load):  # calibration and every timed run on the busy host
        rows = run_bench(engine, prompts, methods, gen, args.repeats, progress=not args.json, others=others)
        meta = bench_meta(args.pair, engine, prompts, gen, args.repeats,
                          "python -m treegraft " + " ".join(sys.argv[1:]), drafting, args.background_load)
    summary = write_outputs(Path(args.out), rows, meta, png=not args.no_png)
    if args.json:
        print(json.dumps({"meta": meta, "overall": {m: v["all"] for m, v in summary["overall"].items()}}))
    else:
        print((Path(args.out) / "report.md").read_text())
    return 0


def _pairs(args) -> int:
    for name, pair in load_models_file(args.models).pairs.items():
        print(f"{name:32s} target={pair.target.describe():45s} mid={pair.mid.describe()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m treegraft", description=__doc__)
    p.add_argument("--models", default=str(DEFAULT_MODELS_YAML), help="models.yaml to read pairs from")
    sub = p.add_subparsers(dest="command", required=True)

    from .generate_cli import add_generate_parser

    add_generate_parser(sub)

    for add in (_add_distill, _add_scheduler, _add_draft_vocab, _add_corpus, _add_bench):
        add(sub)
    ls = sub.add_parser("pairs", help="list the pairs of models.yaml")
    ls.set_defaults(func=_pairs)
    return p


def _add_distill(sub) -> None:
    d = sub.add_parser("distill", help="train a pair's mid drafter from its target (an LM or a draft head)")
    d.add_argument("--pair", default="default")
    d.add_argument("--kind", choices=["lm", "head"], default=None, help="default: the pair's mid kind")
    d.add_argument("--out", default=None, help="output folder (default: the pair's mid path)")
    d.add_argument("--minutes", type=float, default=45.0)
    d.add_argument("--max-steps", type=int, default=100_000)
    d.add_argument("--lr", type=float, default=None, help="default: 6e-4 (lm), 5e-4 (head)")
    d.add_argument("--batch", type=int, default=8)
    d.add_argument("--seq-len", type=int, default=None, help="default: 128 (lm), 256 (head)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--layers", type=int, default=4, help="lm: decoder layers of the student")
    d.add_argument("--init-from", default=None, help="continue training a saved mid folder (lm) or head folder "
                   "(head: its weights, a new optimiser)")
    d.add_argument("--data", choices=["answers", "text", "mix"], default="answers",
                   help="head: the target's own answers to prompts, distillation text, or both")
    d.add_argument("--answers", type=int, default=1280,
                   help="head: prompts the target answers (data answers/mix; whole blocks of 640, each cached)")
    d.add_argument("--tasks", type=int, default=0,
                   help="head: also answer this many task prompts (translation, summaries, context QA, word "
                        "problems, code; composed from the distillation sources, treegraft/task_prompts.py), in "
                        "cached blocks of 480: more only adds blocks")
    d.add_argument("--first-block", type=int, default=0, help="head: train on chat blocks from this one (earlier "
                   "blocks: what the --init-from head already learned)")
    d.add_argument("--first-task-block", type=int, default=0, help="head: the same for task blocks")
    d.add_argument("--followups", type=int, default=0,
                   help="head: also answer this many follow-up prompts (ShareGPT conversations' first three turns: "
                        "user, assistant, user; the bench's chat shape), in cached blocks of 640")
    d.add_argument("--first-followup-block", type=int, default=0, help="head: the same for follow-up blocks")
    d.add_argument("--answer-store", default="", help="head: a folder (relative to the repo root) that keeps every "
                   "finished block gzipped and is read before answering one (models/smollm2-answers for the default)")
    d.add_argument("--answer-tokens", type=int, default=160, help="head: longest answer the target writes")
    d.add_argument("--sampled-share", type=float, default=0.25, help="head: share of answers sampled, not greedy")
    d.add_argument("--patience", type=int, default=3,
                   help="head: held-out evaluations without a better depth-1 agreement before the deeper passes")
    d.add_argument("--eval-every", type=int, default=50, help="head: steps between held-out evaluations")
    d.add_argument("--promote", action="store_true",
                   help="head: copy the trained head into the pair's mid folder if it beats the head there "
                        "on depth-1 top-1 agreement (same suite)")
    d.add_argument("--windows", type=int, default=800, help="head: text windows (data text/mix)")
    d.add_argument("--depths", type=int, default=3, help="head: unrolled passes in training (HASS style)")
    d.add_argument("--head-layers", type=int, default=1, choices=range(1, 5), metavar="{1..4}",
                   help="head: decoder layers; more than the --init-from head has: its layers first, each new one "
                        "starting as the identity (the grown head starts as the trained one)")
    d.add_argument("--head-taps", type=layer_list, default=(), metavar="L1,L2",
                   help="head: the target's decoder layers (0-based, below its last) whose outputs a committed "
                        "token's feature carries too (EAGLE-3's fused features), e.g. 2,15; a head grown from an "
                        "untapped --init-from head starts as that head")
    d.add_argument("--loss", choices=["full", "candidates"], default="full",
                   help="head: KL over the whole draft vocabulary, or over one candidate set per batch (cheaper)")
    d.add_argument("--candidates", type=int, default=1024, help="head: tokens in the candidates loss's set")
    d.add_argument("--precision", choices=["float32", "bfloat16", "auto"], default="float32",
                   help="head: train in float32 or under bf16 autocast (auto: bf16 where the CPU has native bf16)")
    d.add_argument("--profile-step", action="store_true",
                   help="head: time one training step's phases on this host for both losses and precisions, then stop")
    d.add_argument("--resume", action="store_true", help="head: continue from the folder's train_state.pt")
    d.add_argument("--agreement-only", action="store_true", help="head: only measure agreement per depth")
    d.add_argument("--eval-suite", default="bench", help="head: prompt suite for the agreement figures")
    d.add_argument("--eval-limit", type=int, default=None, help="head: only the first N prompts of it")
    d.add_argument("--eval-tokens", type=int, default=64, help="head: greedy answer length per prompt")
    d.add_argument("--eval-per-category", type=int, default=None, help="head: only the first N prompts per category")
    d.set_defaults(func=_distill)


def _add_scheduler(sub) -> None:
    sc = sub.add_parser("scheduler", help="offline scheduler training (SPEC 5)")
    ssub = sc.add_subparsers(dest="scheduler_command", required=True)
    c = ssub.add_parser("collect", help="run all 2^D schedules on sampled rounds and record them")
    c.add_argument("--pair", default="default")
    c.add_argument("--suite", default="unseen", help="prompt suite name or JSONL file (default: prompts neither of "
                   "the default pair's drafters learned from; 'train': the hand-written training suite)")
    c.add_argument("--out", default="scheduler_data.jsonl")
    c.add_argument("--rounds-per-prompt", type=int, default=6)
    c.add_argument("--max-new-tokens", type=int, default=96)
    c.add_argument("--max-minutes", type=float, default=30.0)
    c.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    c.set_defaults(func=_sched_collect)
    t = ssub.add_parser("train", help="fit f_theta, select features, distil g_psi, write the scheduler file")
    t.add_argument("--pair", default="default")
    t.add_argument("--data", default="scheduler_data.jsonl")
    t.add_argument("--out", default=None, help="default: the pair's `scheduler:` path")
    t.add_argument("--no-select", action="store_true", help="use the paper's six tree features, no CV selection")
    t.add_argument("--paper-eta", action="store_true", help="margins on eta = A / t (the paper) instead of (A + 1) / t")
    t.add_argument("--jitter", type=int, default=0, help="also train on the rounds re-timed under N jittered "
                   "hosts' costs (scheduler/costs.py), so the file transfers across machines and dtypes")
    t.add_argument("--profiles", nargs="*", default=[], help="measured cost profiles (scheduler profile) to add")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--features", default=None, help="comma-separated tree features: use these, no selection")
    t.set_defaults(func=_sched_train)
    pr = ssub.add_parser("profile", help="measure this host's step costs for a pair and dtype (a cost profile)")
    pr.add_argument("--pair", default="default")
    pr.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    pr.add_argument("--suite", default="bench", help="its first prompt is the probe")
    pr.add_argument("--name", default=None)
    pr.add_argument("--out", required=True)
    pr.set_defaults(func=_sched_profile)
    me = ssub.add_parser("mid-effect", help="the same rounds drafted with and without one mid call: mean "
                         "accepted length A per schedule, for each score rule")
    me.add_argument("--pair", default="default")
    me.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    me.add_argument("--suite", default="train", help="prompt suite name or JSONL file")
    me.add_argument("--per-category", type=int, default=1)
    me.add_argument("--limit", type=int, default=None)
    me.add_argument("--rounds", type=int, default=6, help="sampled rounds per prompt")
    me.add_argument("--max-new-tokens", type=int, default=96)
    me.add_argument("--scores", default="calibrated,paper", help="score rules to compare, comma-separated")
    me.add_argument("--out", default=None, help="write the per-round A to this JSON file")
    me.set_defaults(func=_sched_mid_effect)
    tr = ssub.add_parser("transfer", help="replay schedulers on held-out rounds under each cost profile: "
                         "each profile's own scheduler vs one trained on jittered costs")
    tr.add_argument("--pair", default="default")
    tr.add_argument("--data", default="scheduler_data.jsonl")
    tr.add_argument("--profiles", nargs="+", required=True)
    tr.add_argument("--features", default=None, help="comma-separated tree features (default: the pair's file's)")
    tr.add_argument("--jitter", type=int, default=8)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--out", default="transfer.json")
    tr.set_defaults(func=_sched_transfer)
    ce = ssub.add_parser("ceiling", help="on collected rounds: the best any scheduler could do (a hindsight pick of "
                         "each round's schedule) against all-small, all-mid and a scheduler, at several mid step costs")
    ce.add_argument("--pair", default="default")
    ce.add_argument("--data", default="scheduler_data.jsonl")
    ce.add_argument("--scheduler", default=None, help="scheduler file (default: the pair's)")
    ce.add_argument("--mid-scales", default="1,0.5,0", help="mid step cost x these (0: a free call)")
    ce.add_argument("--out", default=None)
    ce.set_defaults(func=_sched_ceiling)


def _add_draft_vocab(sub) -> None:
    v = sub.add_parser("draft-vocab", help="rank tokens by frequency for the mid's draft head (FR-Spec style)")
    v.add_argument("--pair", default="default")
    v.add_argument("--out", default=None, help="default: the pair's mid draft_vocab path")
    v.add_argument("--size", type=int, default=16384)
    v.add_argument("--answer-store", default=None,
                   help="rank by the target's own answers in this store (e.g. models/smollm2-answers), not the "
                        "distillation text")
    v.set_defaults(func=_draft_vocab)


def _add_corpus(sub) -> None:
    c = sub.add_parser("corpus", help="the n-gram drafter's corpus: the target's own greedy answers to prompts "
                                      "that are never the bench's (drafters/corpus.py)")
    c.add_argument("--pair", default="default")
    c.add_argument("--out", default=None, help="default: the pair's corpus path")
    c.add_argument("--answers", type=int, default=640, help="chat prompts answered (whole blocks of 640, cached)")
    c.add_argument("--tasks", type=int, default=480, help="task prompts answered (whole blocks of 480, cached)")
    c.add_argument("--answer-tokens", type=int, default=160, help="longest answer the target writes")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--first-block", type=int, default=0, help="chat blocks first-block .. (answers / 640) - 1")
    c.add_argument("--first-task-block", type=int, default=0, help="task blocks first-task-block .. (tasks / 480) - 1")
    c.add_argument("--answer-store", default="", help="a folder (relative to the repo root) of finished answer blocks "
                                                     "(distill --answer-store): a block kept there is read, not made")
    c.set_defaults(func=_corpus)


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="run methods side by side on a prompt suite; speedups over AR")
    b.add_argument("--pair", default="default")
    b.add_argument("--methods", default="ar,all-small,all-mid,fixed")
    b.add_argument("--suite", default="bench")
    b.add_argument("--prompts", default=None, help="a JSONL prompt file (overrides --suite)")
    b.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    b.add_argument("--per-category", type=int, default=None, help="only the first N prompts of each category")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--budget", type=int, default=None)
    b.add_argument("--adaptive-budget", choices=["on", "off"], default=None, help="default: the pair's setting")
    b.add_argument("--width", type=int, default=None)
    b.add_argument("--depth", type=int, default=None)
    b.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    b.add_argument("--out", default="bench_out")
    b.add_argument("--background-load", type=int, default=0, metavar="N",
                   help="run N CPU-bound processes beside the whole run (a busy host; 0: none)")
    b.add_argument("--no-png", action="store_true", help="write the plots as HTML only (no browser needed)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=_bench)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, PromptError, ModelLoadError, VocabularyMismatchError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
