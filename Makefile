# Two commands do everything: `make demo` runs a simulated fleet and its dashboard, `make test` runs every test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test check lint format bench clean

# Python writes its bytecode cache (__pycache__, which git ignores) even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE): the tests start hundreds of Python processes, each of which would otherwise
# compile the package's modules and rewrite the tests' assertions anew.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch for the in-job library's tests: pinned, so pip takes the local build
	# instead of a multi-GB CUDA wheel (set TORCH_SPEC to override).
	$(BIN)/pip install --quiet '$(TORCH_SPEC)'
	$(BIN)/pip install --quiet -e '.[dev,bench,torch,report,dashboard,referees]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpulens demo

# The house's checks: ruff's layout (`ruff format`) and rules (pyproject.toml [tool.ruff]) and strict mypy
# over every module (tests/typecheck.py); `make test` runs them first.
lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python tests/typecheck.py

# Lay the code out (`ruff format`), then fix what ruff's rules can: import order, old syntax.
format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The agent's tests run again on Python 3.10 with the lowest release of each dependency admitted and on
# Python 3.13 with the newest, the dashboard's and reports' tests with their extras' lowest releases
# (tests/matrix.py). The matrix's virtual environments are made beside the house's checks, so that no
# install writes into the checkout while the suite builds the wheel. The full suite runs in two pytest-xdist
# workers and the matrix beside it: the suite waits on its servers and browser often enough that three
# processes keep two cores busier than two (docs/benchmarks.md). Each worker takes whole modules (`--dist
# loadfile`), so that a module's costly fixture (a demo and its browser, a Prometheus, a simulated run) is
# made once. The Slurm tests (tests/slurm: three modules, each its own real Slurm node, mostly waiting on
# Slurm's clock) run last, a worker per module, and alone: their training job's CPU share is part of what
# they check. The matrix's output follows the suite's.
test: $(STAMP)
	mkdir -p .venv-matrix
	$(BIN)/python tests/matrix.py --install-only > .venv-matrix/install.log 2>&1 & installs=$$!; \
	$(MAKE) --no-print-directory lint; lint=$$?; \
	wait $$installs; made=$$?; \
	cat .venv-matrix/install.log; \
	[ $$lint -eq 0 ] && [ $$made -eq 0 ]
	$(BIN)/python tests/matrix.py > .venv-matrix/run.log 2>&1 & beside=$$!; \
	$(BIN)/pytest -q -n 2 --dist loadfile --ignore=tests/slurm; suite=$$?; \
	wait $$beside; versions=$$?; \
	cat .venv-matrix/run.log; \
	$(BIN)/pytest -q -n 3 --dist loadfile tests/slurm; slurm=$$?; \
	[ $$suite -eq 0 ] && [ $$versions -eq 0 ] && [ $$slurm -eq 0 ]

# The fast loop while working: the house's checks, then every test of the agent, the simulator, the
# diagnosis, the in-job library, attribution, the reports and the tips that starts no server and takes no
# browser (`slow` ones are left to `make test`: marked by hand, or by a server fixture in tests/conftest.py),
# whole modules to a worker as in `make test`. Three workers on two cores: many of these tests wait on a real
# training loop's clock or a socket, and a third worker fills those waits (1 min 42 s against 2 min 5 s with
# two, docs/benchmarks.md).
CHECKED := tests/test_layers.py tests/agent tests/simulator tests/diagnosis tests/jobs tests/attribution tests/report tests/reclaim tests/notify \
	tests/test_slurmctld.py tests/test_checks.py tests/test_units.py tests/test_words.py tests/test_yamltext.py tests/test_tips.py tests/test_tip_table.py
check: lint
	$(BIN)/pytest -q -p no:cacheprovider -n 3 --dist loadfile -m "not slow" $(CHECKED)

bench: $(STAMP)
	$(BIN)/python bench/agent_bench.py

clean:
	rm -rf $(VENV) .venv-matrix build *.egg-info .pytest_cache .ruff_cache
