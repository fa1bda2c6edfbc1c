"""Task prompts: the kinds of request the bench measures, composed from the distillation sources.

ShareGPT's first turns are mostly chat and code; the bench also asks for
translations, summaries of a passage, answers from a context and word problems,
which they cover thinly (the head's depth-1 agreement on the bench's translation
answers was 0.02, against 0.40 on chat). These prompts give the target's answers
to such requests to the head's training, without using the bench suites: passages
and sentences are ShareGPT answers (English, and the few German / French /
Spanish turns for translation into English), code is the Python standard
library's own functions, word problems are templates filled with seeded numbers;
the instructions are this file's own wording. `task_prompts(n, seed)` returns n
first user turns in one fixed seeded order (a fixed share per kind).
"""
from __future__ import annotations

import ast
import copy
import random
import re

KINDS = {"translation": 0.25, "summarisation": 0.1875, "qa": 0.1875, "math": 0.1875, "code": 0.1875}
LANGS = {"German": (" und ", " der ", " die ", " ist ", " nicht ", " ich ", " wir "),
         "French": (" le ", " les ", " et ", " est ", " pas ", " une ", " nous "),
         "Spanish": (" el ", " los ", " y ", " es ", " que ", " una ", " para ")}
CHATTY = ("Sure", "Yes", "Certainly", "Of course", "Great", "Thank", "As an AI", "I'm sorry", "Hello")
CODE_CHARS = re.compile(r"[{}<>=_`#|\\]|\d\.\d|https?:")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _prose(text: str) -> bool:
    return not CODE_CHARS.search(text) and text.isascii()


def _language(text: str) -> str | None:
    low = f" {text.lower()} "
    hits = {lang: sum(w in low for w in words) for lang, words in LANGS.items()}
    lang = max(hits, key=hits.get)
    return lang if hits[lang] >= 3 else None


def translation(convs: list[list[dict]], n: int, rng: random.Random) -> list[str]:
    """Into German / French / Spanish from English answer sentences; a fifth from those languages into English."""
    english = [s for c in convs for t in c[1:2] if _prose(t["content"]) for s in _sentences(t["content"])
               if 8 <= len(s.split()) <= 30 and s[0].isupper()]
    foreign = [(lang, " ".join(_sentences(t["content"])[:2])) for c in convs for t in c
               if (lang := _language(t["content"][:600])) and not CODE_CHARS.search(t["content"][:300])]
    foreign = [(lang, s) for lang, s in foreign if 6 <= len(s.split()) <= 45]
    into = ["Translate into {lang}: \"{s}\"", "Translate the following sentence into {lang}:\n\n{s}",
            "Please translate this into {lang}:\n\n{s}", "How would you say this in {lang}? \"{s}\"",
            "Translate to {lang}, keeping the meaning and tone:\n\n{s}"]
    back = ["Translate this {lang} text into English:\n\n{s}", "What does this mean in English? \"{s}\"",
            "Translate the following {lang} passage into English.\n\n{s}"]
    out = []
    for i in range(n):
        if foreign and i % 5 == 4:
            lang, s = rng.choice(foreign)
            out.append(rng.choice(back).format(lang=lang, s=s))
        else:
            out.append(rng.choice(into).format(lang=rng.choice(list(LANGS)), s=rng.choice(english)))
    return out


def _passages(convs: list[list[dict]], lo: int, hi: int) -> list[tuple[str, str]]:
    """(user question, English prose answer of lo..hi characters) pairs."""
    out = []
    for c in convs:
        text = c[1]["content"].strip()
        if text.startswith(CHATTY):  # "Sure! ...": the passage starts after the reply's first sentence
            text = text.split(" ", 1)[-1] if len(_sentences(text)) < 2 else " ".join(_sentences(text)[1:])
        if lo <= len(text) <= hi and _prose(text):
            out.append((c[0]["content"].strip(), text))
    return out


def summarisation(convs: list[list[dict]], n: int, rng: random.Random) -> list[str]:
    asks = ["Summarise the following text in two or three sentences.", "Write a one-paragraph summary of this passage.",
            "Give a short summary of the text below, then list its main points as bullets.",
            "Summarise this for a busy reader in no more than 60 words.",
            "Read the passage and summarise its key ideas in plain language.",
            "Condense the following explanation into three sentences."]
    pool = _passages(convs, 500, 1400)
    return [f"{rng.choice(asks)}\n\n{rng.choice(pool)[1]}" for _ in range(n)]


def qa(convs: list[list[dict]], n: int, rng: random.Random) -> list[str]:
    asks = ["Answer the question using only the context.", "Read the context and answer the question briefly.",
            "Use the text below to answer the question. If the answer is not in it, say so.",
            "Answer the question based on the passage, in one or two sentences."]
    generic = ["What is the main point of the context?", "What two recommendations does the text make?",
               "According to the context, what should be done first?", "Who or what is the text mainly about?"]
    pool = _passages(convs, 400, 1200)
    out = []
    for _ in range(n):
        question, context = rng.choice(pool)
        if len(question) > 200 or not _prose(question):
            question = rng.choice(generic)
        out.append(f"{rng.choice(asks)}\n\nContext: {context}\n\nQuestion: {question}")
    return out


NAMES = ["Maya", "Tom", "Priya", "Lucas", "Amara", "Jonas", "Sofia", "Omar", "Lena", "Kenji"]
ITEMS = [("pencils", "box"), ("cupcakes", "tray"), ("stickers", "sheet"), ("bottles", "crate"), ("books", "shelf")]
MATH = [
    "{a} buys {n} {item} at ${p} each and pays with a ${bill} note. How much change does {a} get? Show your working.",
    "A {unit} holds {n} {item}. A shop has {m} full {unit}s and sells {k} {item}. How many {item} are left? "
    "Explain step by step.",
    "{a} reads {n} pages a day. The book has {big} pages. How many days does {a} need to finish it? "
    "Solve step by step.",
    "{a} has {n} {item} and {b} has {m} more than {a}. How many {item} do they have together? Show the steps.",
    "A train travels at {n}0 km per hour for {k} hours and then at {m}0 km per hour for 2 hours. How far does it "
    "go in total? Explain.",
    "A price of ${big} is reduced by {pct}%. What is the new price? Think it through step by step.",
    "{a} saves ${n} every week. How many weeks will it take to save ${big}? Show your working.",
    "A recipe needs {k} eggs for {n} people. How many eggs are needed for {m2} people? Explain your reasoning.",
    "There are {big} seats in a hall and {pct}% of them are taken. How many seats are free? Solve step by step.",
    "{a} is {n} years old. {b} is {k} times as old as {a} was {m0} years ago. How old is {b}? Show the steps.",
]


def math(n: int, rng: random.Random) -> list[str]:
    out = []
    for _ in range(n):
        a, b = rng.sample(NAMES, 2)
        item, unit = rng.choice(ITEMS)
        k, nn, m = rng.randint(2, 6), rng.randint(3, 24), rng.randint(2, 15)
        out.append(rng.choice(MATH).format(
            a=a, b=b, item=item, unit=unit, n=nn, m=m, k=k, p=rng.randint(2, 9), bill=rng.choice([50, 100]),
            big=rng.randrange(120, 2000, 10), pct=rng.choice([10, 15, 20, 25, 30, 40]), m2=nn * rng.randint(2, 3),
            m0=rng.randint(1, nn - 1)))
    return out


def _functions(sources: list[str]) -> list[ast.FunctionDef]:
    out = []
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and 4 <= len(node.body) and \
                    node.end_lineno - node.lineno <= 24 and not node.name.startswith("_"):
                out.append(node)
    return out


def code(sources: list[str], n: int, rng: random.Random) -> list[str]:
    """Write / explain / refactor the standard library's own small documented functions."""
    funcs = _functions(sources)
    out = []
    for _ in range(n):
        f = rng.choice(funcs)
        doc = ast.get_docstring(f).split("\n\n")[0].replace("\n", " ").strip().rstrip(".")
        bare = copy.copy(f)
        bare.body, bare.decorator_list = f.body[1:], []  # without the docstring
        src = ast.unparse(bare)
        args = ", ".join(a.arg for a in f.args.args)
        out.append(rng.choice([
            f"Write a Python function `{f.name}({args})`: {doc[0].lower() + doc[1:]}. Briefly explain it.",
            f"Explain step by step what this Python function does, and give an example call.\n\n{src}",
            f"Add type hints and a docstring to this Python function.\n\n{src}",
            f"Refactor this Python function so that it is easier to read, without changing what it does.\n\n{src}",
        ]))
    return out


def labelled_task_prompts(n: int, seed: int) -> list[tuple[str, str]]:
    """n (kind, first user turn) pairs, a fixed share of each kind (KINDS), in one seeded order."""
    from .distill import sharegpt_conversations, stdlib_sources

    rng = random.Random(seed)
    convs = sharegpt_conversations(10 ** 9, seed + 2)
    counts = {k: round(share * n) for k, share in KINDS.items()}
    counts["translation"] += n - sum(counts.values())
    texts = {"translation": translation(convs, counts["translation"], rng),
             "summarisation": summarisation(convs, counts["summarisation"], rng),
             "qa": qa(convs, counts["qa"], rng), "math": math(counts["math"], rng),
             "code": code(stdlib_sources(seed), counts["code"], rng)}
    out = [(kind, t) for kind in KINDS for t in texts[kind]]
    rng.shuffle(out)
    return out


def task_prompts(n: int, seed: int) -> list[str]:
    """n first user turns, a fixed share of each kind (KINDS), in one seeded order."""
    return [t for _, t in labelled_task_prompts(n, seed)]
