# Two commands on a fresh machine with Python 3.11, pip and make:
#   make demo    the main job (creates the environment it needs)
#   make test    creates the engine environments and runs every test
#
# Airflow 3.3 and Prefect 3.9 cannot share one environment (disjoint FastAPI pins), so
# there are three: core (engine-agnostic tests, the demo, PyTorch CPU build), airflow and
# prefect. uv builds each from uv.lock in seconds.

PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .venv-tools
UV := $(TOOLS)/bin/uv
CORE := .venv-core
AIRFLOW := .venv-airflow
PREFECT := .venv-prefect
ENGINE ?= none
PROVIDER ?= local
PYTEST_ARGS ?=

.PHONY: demo test test-core test-airflow test-prefect test-chaos bench bench-policies bench-aws envs clean lock

# `make demo ENGINE=airflow|prefect` runs the same pipeline through that engine.
DEMO_ENV_none := $(CORE)
DEMO_ENV_airflow := $(AIRFLOW)
DEMO_ENV_prefect := $(PREFECT)
DEMO_ENV := $(DEMO_ENV_$(ENGINE))

demo: $(DEMO_ENV)/.synced
	$(DEMO_ENV)/bin/spot-pipelines demo --engine $(ENGINE) --provider $(PROVIDER)

test: test-core test-airflow test-prefect

test-core: $(CORE)/.torch
	$(CORE)/bin/python -m pytest tests/core $(PYTEST_ARGS)

# Chaos across many seeds (the `slow` marker; `make test` runs only a few). A failure names
# its seed: rerun one with PYTEST_ARGS='-k seed_117'.
test-chaos: $(CORE)/.torch
	$(CORE)/bin/python -m pytest tests/core/test_chaos.py -m slow $(PYTEST_ARGS)

test-airflow: $(AIRFLOW)/.synced
	$(AIRFLOW)/bin/python -m pytest tests/airflow $(PYTEST_ARGS)

test-prefect: $(PREFECT)/.synced
	$(PREFECT)/bin/python -m pytest tests/prefect $(PYTEST_ARGS)

bench: $(CORE)/.synced
	$(CORE)/bin/python -m bench.foundation

# Deadline policies on the evaluation traces; writes bench/tables/policies.md (long: see bench/README.md).
bench-policies: $(CORE)/.synced
	$(CORE)/bin/python -m bench.policies

# S3 checkpoint save vs plain upload, and EC2 API calls when watching 1,000 leases (moto server).
bench-aws: $(CORE)/.synced
	$(CORE)/bin/python -m bench.aws

envs: $(CORE)/.torch $(AIRFLOW)/.synced $(PREFECT)/.synced

lock: $(UV)
	$(UV) lock

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet "uv==$(UV_VERSION)"

$(CORE)/.synced: $(UV) uv.lock pyproject.toml
	UV_PROJECT_ENVIRONMENT=$(CORE) $(UV) sync --frozen --python $(PYTHON) --group test --extra aws --extra kubernetes
	touch $@

# The pinned CPU build: pip takes it from this machine's disk; uv would fetch a CUDA build.
$(CORE)/.torch: $(CORE)/.synced
	$(PYTHON) -m pip --python $(CORE)/bin/python install --quiet torch==2.13.0
	touch $@

$(AIRFLOW)/.synced: $(UV) uv.lock pyproject.toml
	UV_PROJECT_ENVIRONMENT=$(AIRFLOW) $(UV) sync --frozen --python $(PYTHON) --group test --extra airflow --extra aws --extra kubernetes
	touch $@

$(PREFECT)/.synced: $(UV) uv.lock pyproject.toml
	UV_PROJECT_ENVIRONMENT=$(PREFECT) $(UV) sync --frozen --python $(PYTHON) --group test --extra prefect --extra aws --extra kubernetes
	touch $@

clean:
	rm -rf $(TOOLS) $(CORE) $(AIRFLOW) $(PREFECT) .pytest_cache
