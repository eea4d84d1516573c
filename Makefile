# Two entry points: `make run` (the main job) and `make test` (the whole suite).
# Both create .venv on first use and are safe to repeat.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.elasticbench-installed

.PHONY: run test selftest verify lint lock clean native

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	# torch is pinned to 2.13.0: on a CPU-only machine pip takes the CPU build; see docs/guide/install.md for CUDA.
	# --no-compile: pip's own compile of every file of torch, sympy and scipy took half the
	# install's time on 2 cores; see compileall below
	$(BIN)/python -m pip install --quiet --no-compile -r requirements.lock
	# kernels/ and cases/ install under elasticbench (package-dir), so setuptools installs this
	# through an import finder and says so in an "Editable installation" notice on every install
	# (information, not a warning about this project): filtered by its text, nothing else
	PYTHONWARNINGS="ignore:Editable installation" \
		$(BIN)/python -m pip install --quiet --no-compile --no-deps --no-build-isolation -e .
	# Bytecode: --no-compile leaves it to the first import, which keeps it, except where
	# PYTHONDONTWRITEBYTECODE is set (CI runners, containers): there every process compiled
	# torch's compiler stack from source again (1462 modules, ~2.5 s of CPU a process). So
	# compile every installed module once, with writing on (12 s on 2 cores); a file that does
	# not compile (a Python 2 relic in a package) fails at its import, as it would anyway
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m compileall -qq -j 0 \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
		elasticbench kernels || true
	touch $(STAMP)

# The native C++ kernels, compiled once into a cache keyed by their sources (docs/native.md).
# A compile error fails here, loudly; a machine with no compiler skips them and says so.
native: $(STAMP)
	$(BIN)/python -m elasticbench.native

run: native
	$(BIN)/elasticbench run

CI_OUT := .cache/ci

test: native
	$(BIN)/ruff check .
	# two workers: the suite is mostly single-threaded mpmath and interpreter work; the
	# slowest tests are listed at the end (make test must stay under 5 minutes on 2 cores)
	# (tests marked `ci` run in .ci/run instead: see pyproject.toml's markers)
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=15 -m "not ci"
	# CI gate (docs/gates.md): the quick case against the committed baseline. Numerics are
	# strict (exit 1); timing is reported but advisory, since separate runs on a shared
	# 2-core machine are not comparable at 10%; `elasticbench ab` judges timing changes.
	mkdir -p $(CI_OUT)
	$(BIN)/elasticbench run --quick --json $(CI_OUT)/quick.json > $(CI_OUT)/run.log 2>&1 \
		|| { cat $(CI_OUT)/run.log; exit 1; }
	$(BIN)/elasticbench gate results/baselines/quick.json $(CI_OUT)/quick.json \
		--metric bandwidth-fraction --timing advisory --markdown $(CI_OUT)/gate.md

# Every mutant caught and every built-in kernel passing the quick matrices, torch.compile's
# variants included (compiling them for every dtype and layout takes minutes on a fresh
# machine, so `make test` checks the numpy and cpp kernels this way and CI runs this too).
selftest: native
	$(BIN)/elasticbench selftest

# The whole default verification matrix, forward and backward, every built-in kernel and
# dtype (CI runs it after selftest, whose torch.compile variants warm inductor's cache).
verify: native
	mkdir -p $(CI_OUT)
	$(BIN)/elasticbench verify --mode both --failures 5 --json $(CI_OUT)/verify.json

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

lock: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/+cpu$$//' > requirements.lock

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
