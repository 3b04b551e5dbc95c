# `make demo` and `make test` set everything up on a fresh machine: a .venv with a CPU build of torch.
# TORCH_SPEC pins the CPU wheel available here; the package itself only declares a range.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# the unit suite runs on one pytest-xdist worker per core (at most 4), a module per worker (module fixtures built
# once); the tests marked `serial` (they bound a wall time or race a writer) run after, alone. The long property
# tests have no fixture to share: spread test by test.
PYTEST_WORKERS ?= -n auto --maxprocesses=4
PYTEST_PARALLEL ?= $(PYTEST_WORKERS) --dist loadfile

.PHONY: setup demo docs docs-serve test test-fast test-integration lint format clean dist-check

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	# keep TORCH_SPEC in the same command so that no extra's requirements can swap torch;
	# DS_BUILD_OPS=0: DeepSpeed compiles the few CPU ops it needs at first use instead of at install
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet -e ".[dev,trl,verl,deepspeed]" "$(TORCH_SPEC)"
	touch $@

setup: $(VENV)/.installed

# the demo needs TRL only: no verl, DeepSpeed or development tools
$(VENV)/.demo-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[trl]" "$(TORCH_SPEC)"
	touch $@

demo: $(VENV)/.demo-installed
	$(VENV)/bin/rlguard demo

# the docs site into site/, strict: a broken link, reference or docstring fails the build (offline: KaTeX vendored)
$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[docs]" "$(TORCH_SPEC)"
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# exit code 5 (no test selected) is no failure of the serial pass: PYTEST_ARGS may name modules without one
test: setup
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not serial" $(PYTEST_ARGS)
	$(PY) -m pytest -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

# real TRL and verl runs on CPU with tiny models: several steps per objective, under torchrun with 2 processes,
# and TRL under DeepSpeed ZeRO-2 and ZeRO-3 with 2 processes; then the doctor's property tests with many examples
# (tests/helpers/profiles.py)
test-integration: setup
	$(PY) -m pytest integration_tests $(PYTEST_ARGS)
	RLGUARD_HYPOTHESIS_PROFILE=long $(PY) -m pytest $(PYTEST_WORKERS) --dist load tests/doctor/test_properties.py tests/doctor/test_fold_incremental.py "tests/doctor/test_stream.py::test_the_follower_agrees_with_read_log_however_the_log_is_cut" $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow and not serial" $(PYTEST_ARGS)
	$(PY) -m pytest -m "serial and not slow" $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: setup
	$(VENV)/bin/ruff check rlguard tests benchmarks integration_tests
	$(VENV)/bin/ruff format --check rlguard tests benchmarks integration_tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff format rlguard tests benchmarks integration_tests
	$(VENV)/bin/ruff check --fix rlguard tests benchmarks integration_tests

# a release build: sdist + wheel pass `twine check`, the unpacked sdist's tests collect and its CLI tests pass, and
# the wheel installs as a user installs it (.ci/wheel-check: the torch-free core runs the doctor, watch and report on
# real logs, [torch] runs an objective; the venvs' sizes printed)
$(VENV)/.release-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[release]" "$(TORCH_SPEC)"
	touch $@

dist-check: $(VENV)/.release-installed
	rm -rf dist build/sdist-check
	$(PY) -m build --sdist --wheel --outdir dist . > /dev/null
	$(VENV)/bin/twine check --strict dist/*
	PYTHON="$(PYTHON)" TORCH_SPEC="$(TORCH_SPEC)" .ci/wheel-check
	mkdir -p build/sdist-check && tar xzf dist/rlguard-*.tar.gz -C build/sdist-check --strip-components=1
	cd build/sdist-check && PYTHONPATH=$$PWD ../../$(PY) -m pytest --collect-only -q -p no:cacheprovider | tail -1
	cd build/sdist-check && PYTHONPATH=$$PWD ../../$(PY) -m pytest -q -p no:cacheprovider tests/cli/test_cli.py tests/core_losses/test_objectives.py

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
