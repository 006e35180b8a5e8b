# Two commands do everything: `make demo` runs a simulated GPU node, `make test` runs every test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch for the in-job library's tests: pinned, so pip takes the local build
	# instead of a multi-GB CUDA wheel (set TORCH_SPEC to override).
	$(BIN)/pip install --quiet '$(TORCH_SPEC)'
	$(BIN)/pip install --quiet -e '.[dev,bench,torch]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpulens agent --simulate demo --web.listen-address 127.0.0.1:10906

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python bench/agent_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
