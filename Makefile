# Two commands on a fresh machine with Python 3.11, pip and make:
#   make demo    the main job (creates the environment it needs)
#   make test    creates the engine environments and runs every test (as root on Debian or
#                Ubuntu it installs the system packages it needs: tests/system-packages)
#
# Airflow 3.3 and Prefect 3.9 cannot share one environment (disjoint FastAPI pins), so
# there are three: core (engine-agnostic tests, the demo, PyTorch's CPU build), airflow and
# prefect. uv builds each from uv.lock in seconds.

PYTHON ?= python3
# Tests start many Python processes (steps, watchers, engine servers): let them keep their
# bytecode (some shells set PYTHONDONTWRITEBYTECODE) and compile the environments' packages
# once at install, instead of recompiling numpy or Airflow in every process.
unexport PYTHONDONTWRITEBYTECODE
UV_VERSION := 0.13.9
TOOLS := .venv-tools
UV := $(TOOLS)/bin/uv
CORE := .venv-core
AIRFLOW := .venv-airflow
PREFECT := .venv-prefect
ENGINE ?= none
PROVIDER ?= local
WORKLOAD ?= training
PYTEST_ARGS ?=

.PHONY: demo images machine lint format test test-core test-airflow test-prefect test-images test-stack test-chaos bench bench-policies bench-aws bench-interval bench-scale bench-cloud-server bench-batch bench-resume bench-checkpoint envs clean lock

# `make demo ENGINE=airflow|prefect` runs the same pipeline through that engine;
# `make demo WORKLOAD=batch-inference|sweep` the batch and sweep demos (docs/batch.md).
DEMO_ENV_none := $(CORE)
DEMO_ENV_airflow := $(AIRFLOW)
DEMO_ENV_prefect := $(PREFECT)
DEMO_ENV := $(DEMO_ENV_$(ENGINE))

demo: $(DEMO_ENV)/.synced
	$(DEMO_ENV)/bin/spot-pipelines demo --engine $(ENGINE) --provider $(PROVIDER) --workload $(WORKLOAD)

# The step, Airflow and Prefect images (localhost/spot-pipelines-*:dev) with the engine this
# machine has (docker, podman or buildah); stand-in bases where the official ones cannot
# be pulled. Skips every image whose inputs are unchanged (docker/build_images.py).
images: $(UV)
	$(PYTHON) docker/build_images.py --uv $(UV)

# The suites run side by side, SUITES_AT_ONCE at a time (make's own jobs; each suite's
# output printed whole when it ends), in this order: the longest lane (Prefect) starts
# with lint, then core (itself spread over CORE_WORKERS processes: tests/run_suite.py),
# Airflow and the images take the free slots. `make test SUITES_AT_ONCE=1 CORE_WORKERS=1`
# runs everything one test at a time, as before. docs/testing.md, "Test times".
SUITES_AT_ONCE ?= 2
CORE_WORKERS ?= 3
test:
	$(MAKE) -j$(SUITES_AT_ONCE) --output-sync=target lint test-prefect test-core test-airflow test-images

# Every suite writes a JUnit report, .ci/reports/<target>.xml (gitignored; a spread suite
# also <target>-serial.xml), and prints its 30 slowest tests; `.ci/run` prints the 20
# slowest of the whole run from those files (.ci/slowest.py). The suites of `make test` run
# through tests/run_suite.py NAME WORKERS PATH -- PYTEST_ARGS (WORKERS 1: one plain pytest
# run); the other targets pass the report through pytest's environment.
REPORTS := $(CURDIR)/.ci/reports
test-chaos test-stack: \
	export PYTEST_ADDOPTS += --junitxml=$(REPORTS)/$@.xml --durations=30
SUITE = bin/python tests/run_suite.py

# ruff (lint and format) over the tree; mypy strict on spot_core and the emulators (core
# environment), the engines' packages each in its own environment (they import their engine).
LINTED := spot_core airflow_spot prefect_spot emulators tests bench dags flows docker

lint: $(CORE)/.torch $(AIRFLOW)/.synced $(PREFECT)/.synced
	$(CORE)/bin/ruff check $(LINTED)
	$(CORE)/bin/ruff format --check $(LINTED)
	$(CORE)/bin/mypy spot_core emulators/spot_emulators
	$(AIRFLOW)/bin/mypy airflow_spot
	$(PREFECT)/bin/mypy prefect_spot

# What `make lint` then accepts: the formatter, then the fixable lint.
format: $(CORE)/.synced
	$(CORE)/bin/ruff format $(LINTED)
	$(CORE)/bin/ruff check --fix $(LINTED)

# The system packages no Python package gives (the container engine, docker-compose,
# Chromium): installed with apt-get as root on Debian/Ubuntu, else named in one line.
machine:
	@tests/system-packages

test-core: machine $(CORE)/.torch
	$(CORE)/$(SUITE) $@ $(CORE_WORKERS) tests/core -- $(PYTEST_ARGS)

# Chaos across many seeds (the `slow` marker; `make test` runs only a few). A failure names
# its seed: rerun one with PYTEST_ARGS='-k seed_117'.
test-chaos: machine $(CORE)/.torch
	$(CORE)/bin/python -m pytest tests/core/test_chaos.py -m slow $(PYTEST_ARGS)

test-airflow: machine $(AIRFLOW)/.synced
	$(AIRFLOW)/$(SUITE) $@ 1 tests/airflow -- $(PYTEST_ARGS)

test-prefect: machine $(PREFECT)/.synced
	$(PREFECT)/$(SUITE) $@ 1 tests/prefect -- $(PYTEST_ARGS)

# The images under a real engine (podman's Docker API for the docker CLI, or Docker): a
# step container reclaimed and resumed, the Airflow and Prefect images, and
# docker/compose.yaml as real containers (test-stack runs only that).
test-images: machine $(CORE)/.synced images
	$(CORE)/$(SUITE) $@ 1 tests/images -- $(PYTEST_ARGS)

test-stack: machine $(CORE)/.synced images
	$(CORE)/bin/python -m pytest tests/images/test_compose_stack.py $(PYTEST_ARGS)

bench: $(CORE)/.synced
	$(CORE)/bin/python -m bench.foundation

# Deadline policies on the evaluation traces; writes bench/tables/policies.md (long: see bench/README.md).
bench-policies: $(CORE)/.synced
	$(CORE)/bin/python -m bench.policies

# Young/Daly interval per attempt vs fixed intervals on the traces; writes bench/tables/checkpoint_interval.md.
bench-interval: $(CORE)/.synced
	$(CORE)/bin/python -m bench.checkpoint_interval

# Time to resume after a reclaim, handover off vs on_notice: local cloud, EC2 (moto), the
# Kubernetes emulator; restore time per GiB. Writes bench/tables/resume.md (bench/README.md).
bench-resume: $(CORE)/.synced
	$(CORE)/bin/python -m bench.resume

# S3 checkpoint save vs plain upload, and EC2 API calls when watching 1,000 leases (moto server).
bench-aws: $(CORE)/.synced
	$(CORE)/bin/python -m bench.aws

# 1,000 deferred SpotJobTriggers in one event loop (EC2 on moto, the local cloud), one real
# airflow triggerer with 1,000 deferred jobs on EC2 (moto) and 1,000 on the local cloud,
# then one Prefect spot worker with 200 flow runs on
# EC2 (moto): API calls per poll and CPU-seconds per job-hour (see bench/README.md). The
# EC2 triggerer and the Prefect worker run twice: each job's own heartbeat, then one
# heartbeat per process (heartbeat_uri, --driver-beat).
bench-scale: $(AIRFLOW)/.synced $(PREFECT)/.synced
	$(AIRFLOW)/bin/python -m bench.scale
	$(AIRFLOW)/bin/python -m bench.scale_triggerer
	$(AIRFLOW)/bin/python -m bench.scale_triggerer --driver-beat
	$(AIRFLOW)/bin/python -m bench.scale_triggerer --backend local --jobs 1000
	$(PREFECT)/bin/python -m bench.scale_prefect
	$(PREFECT)/bin/python -m bench.scale_prefect --driver-beat

# 200 clients at once against the local cloud server, its backlog and socketserver's 5 side by side.
bench-cloud-server: $(CORE)/.synced
	$(CORE)/bin/python -m bench.cloud_server

# Batch inference on the busiest trace: the work queue against plain mapped shards, side by
# side in one run (about a minute; see bench/README.md).
bench-batch: $(CORE)/.synced
	$(CORE)/bin/python -m bench.batch

# Large checkpoints (issue 47): the loop's stall per save, sync vs async, save and restore
# throughput against the raw transfer, 1 and 4 GiB on a file store and S3 (moto). Smaller:
# BENCH_CHECKPOINT_GIB=0.25 make bench-checkpoint. Writes bench/tables/checkpoint.md.
bench-checkpoint: $(CORE)/.torch
	$(CORE)/bin/python -m bench.checkpoint
	$(CORE)/bin/python -m bench.checkpoint_dcp

envs: $(CORE)/.torch $(AIRFLOW)/.synced $(PREFECT)/.synced

lock: $(UV)
	$(UV) lock

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet "uv==$(UV_VERSION)"

$(CORE)/.synced: $(UV) uv.lock pyproject.toml
	UV_PROJECT_ENVIRONMENT=$(CORE) $(UV) sync --frozen --compile-bytecode --python $(PYTHON) --group test --extra aws --extra kubernetes
	touch $@

# PyTorch's CPU build (no test needs a GPU), with pip: on Linux PyPI's torch wheel pulls
# the multi-GB CUDA libraries, so the CPU build `torch==X+cpu` comes from PyTorch's CPU
# index. A CPU build pip already reaches (a wheel in its find-links, a mirror) is taken
# first without asking that index; on macOS PyPI's wheels are the CPU build and the
# `+cpu` pin falls through to the plain one. README "PyTorch" has the details.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIP = $(PYTHON) -m pip --python $(CORE)/bin/python install --quiet

$(CORE)/.torch: $(CORE)/.synced
	$(TORCH_PIP) "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
		|| { echo "torch $(TORCH_VERSION)+cpu is not reachable as configured: from $(TORCH_INDEX)"; \
		     $(TORCH_PIP) --extra-index-url $(TORCH_INDEX) "torch==$(TORCH_VERSION)"; }
	touch $@

$(AIRFLOW)/.synced: $(UV) uv.lock pyproject.toml
	UV_PROJECT_ENVIRONMENT=$(AIRFLOW) $(UV) sync --frozen --compile-bytecode --python $(PYTHON) --group test --group airflow-test --extra airflow --extra aws --extra kubernetes
	touch $@

$(PREFECT)/.synced: $(UV) uv.lock pyproject.toml
	UV_PROJECT_ENVIRONMENT=$(PREFECT) $(UV) sync --frozen --compile-bytecode --python $(PYTHON) --group test --extra prefect --extra aws --extra kubernetes
	touch $@

clean:
	rm -rf $(TOOLS) $(CORE) $(AIRFLOW) $(PREFECT) .pytest_cache
