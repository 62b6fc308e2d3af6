# Set-up is two commands: `make job` runs the main job on the embedded defaults, `make test`
# runs the test suite. Both install what they need into .venv first (once: a stamp file
# remembers it until pyproject.toml changes).
#
# torch is pinned and installed first: this machine's pip finds the CPU wheel of that release
# (find-links), while an unpinned `torch` with no torch installed would pull a multi-GB CUDA
# build. The pin is repeated in the second install so the resolver can never move it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
STAMP := $(VENV)/.tracegym-installed

.PHONY: job test install

job: $(STAMP)
	$(BIN)/tracegym demo
	$(BIN)/tracegym analyze
	$(BIN)/tracegym synthesize

test: $(STAMP)
	$(BIN)/python -m pytest

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install '$(TORCH)'
	$(BIN)/python -m pip install -e '.[all,dev]' '$(TORCH)'
	touch $@
