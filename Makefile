# `make demo` and `make test` set everything up on a fresh machine: a .venv with a CPU build of torch.
# TORCH_SPEC pins the CPU wheel available here; the package itself only declares a range.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast test-integration lint format clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	# keep TORCH_SPEC in the same command so that no extra's requirements can swap torch;
	# DS_BUILD_OPS=0: DeepSpeed compiles the few CPU ops it needs at first use instead of at install
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet -e ".[dev,trl,verl,deepspeed]" "$(TORCH_SPEC)"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/rlguard demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# real TRL and verl runs on CPU with tiny models: several steps per objective, under torchrun with 2 processes,
# and TRL under DeepSpeed ZeRO-2 and ZeRO-3 with 2 processes
test-integration: setup
	$(PY) -m pytest integration_tests $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check rlguard tests benchmarks integration_tests
	$(VENV)/bin/ruff format --check rlguard tests benchmarks integration_tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff format rlguard tests benchmarks integration_tests
	$(VENV)/bin/ruff check --fix rlguard tests benchmarks integration_tests

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
