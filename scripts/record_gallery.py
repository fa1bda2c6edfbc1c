"""Re-record the app's offline gallery (ui/gallery/): one trace per prompt category from the default pair
(treegraft, its scheduler), plus a fixed schedule and its w/o-EG and w/o-ND ablations on one prompt.

    HF_HUB_OFFLINE=1 nice -n 19 .venv/bin/python scripts/record_gallery.py

float32, greedy, 40 new tokens by default; the first prompt of each category of the bench suite.
Each file must stay under 300 KB (checked here; the app refuses nothing bigger than its upload limit).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from treegraft.config import DEFAULT_MODELS_YAML, load_pair, with_overrides  # noqa: E402
from treegraft.methods import MethodSpec  # noqa: E402
from treegraft.prompts import load_prompts  # noqa: E402
from ui.gallery import GALLERY_DIR, MANIFEST, MAX_ENTRY_BYTES, Entry, compact_json  # noqa: E402

ABLATIONS = [("fixed", MethodSpec("fixed")), ("fixed w/o EG", MethodSpec("fixed", eg=False)),
             ("fixed w/o ND", MethodSpec("fixed", nd=False))]


def plan(prompts, ablation_category: str):
    """[(entry name, file stem, prompt, MethodSpec)]: treegraft per category, then the fixed-schedule trio."""
    firsts = {}
    for p in prompts:
        firsts.setdefault(p.category, p)
    out = [(f"{c}: treegraft", f"{c}-treegraft", p, MethodSpec("treegraft")) for c, p in firsts.items()]
    p = firsts[ablation_category]
    out += [(f"{ablation_category}: {label}", f"{ablation_category}-{label.replace(' ', '-').replace('/', '')}",
             p, spec) for label, spec in ABLATIONS]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=GALLERY_DIR)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ablation-category", default="chat")
    ap.add_argument("--only", default="", help="comma-separated entry names to re-record (others kept)")
    args = ap.parse_args(argv)
    from treegraft.engine import Engine
    from treegraft.models import load_pair_models

    pair = load_pair("default", DEFAULT_MODELS_YAML)
    engine = Engine(load_pair_models(pair, args.dtype))
    gen = with_overrides(pair.generation, max_new_tokens=args.max_new_tokens, temperature=0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    listed = args.out / MANIFEST
    old = {e["name"]: e for e in json.loads(listed.read_text())} if listed.exists() else {}
    manifest = []
    for name, stem, prompt, spec in plan(load_prompts("bench"), args.ablation_category):
        if only and name not in only and name in old:
            manifest.append(old[name])
            continue
        ids = engine.encode(prompt.messages)
        engine.generate(ids, spec, pair.drafting, gen.model_copy(update={"max_new_tokens": 4}))  # warm-up
        res = engine.generate(ids, spec, pair.drafting, gen)
        text = compact_json(res)
        size = len(text.encode())
        if size > MAX_ENTRY_BYTES:
            raise SystemExit(f"{name}: {size / 1024:.0f} KB is over the gallery's {MAX_ENTRY_BYTES // 1024} KB")
        (args.out / f"{stem}.json").write_text(text)
        manifest.append(asdict(Entry(name, f"{stem}.json", prompt.category, spec.label, prompt.text)))
        write_manifest(args.out, manifest, old)
        mids = sum(r.mid_calls for r in res.rounds)
        print(f"{name}: {len(res.new_tokens)} tokens, {len(res.rounds)} rounds, {mids} mid calls, "
              f"{size / 1024:.0f} KB", flush=True)
    write_manifest(args.out, manifest, {})
    return 0


def write_manifest(folder: Path, done: list[dict], old: dict) -> None:
    """The entries recorded so far (then the old ones not yet re-recorded), so a stopped run keeps its work."""
    names = {e["name"] for e in done}
    rows = done + [e for n, e in old.items() if n not in names]
    (folder / MANIFEST).write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())
