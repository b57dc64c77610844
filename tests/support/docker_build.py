"""docker/build_images.py (``make images``) as a module for the tests.

docker/ is a folder of build contexts, not a package, and it cannot go on the path: its
``airflow/`` and ``prefect/`` folders would import as namespace packages wherever the engine
is not installed. So the script is loaded from its file, once, under its own name.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.support import REPO

SCRIPT = REPO / "docker" / "build_images.py"


def _load() -> ModuleType:
    loaded = sys.modules.get("build_images")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("build_images", SCRIPT)
    assert spec is not None and spec.loader is not None, SCRIPT
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_images"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


build_images = _load()
