"""The test suites. A package so that their shared helpers import as ``tests.support``
(pytest puts the repository on the path: ``pythonpath`` in pyproject.toml)."""
