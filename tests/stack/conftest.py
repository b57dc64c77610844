"""The docker/ stack run as processes (tests/stack/stack_processes.py) needs both engine
environments: it runs from .venv-airflow and starts the Prefect services from
.venv-prefect (`make test-stack`)."""

from __future__ import annotations

import sys
from pathlib import Path

CORE_TESTS = str(Path(__file__).resolve().parents[1] / "core")
if CORE_TESTS not in sys.path:
    sys.path.append(CORE_TESTS)
