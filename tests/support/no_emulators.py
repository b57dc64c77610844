"""An environment in which ``spot_emulators`` cannot be imported, for a child process: as
if spot-pipelines were installed without the ``[emulators]`` extra (the emulators are the
separate distribution spot-pipelines-emulators).

A ``sitecustomize`` on the child's PYTHONPATH runs at its start-up, before anything is
imported, and puts a finder first on ``sys.meta_path`` that refuses the package the way a
missing one is refused (``ModuleNotFoundError`` naming it).
"""

from __future__ import annotations

import os
from pathlib import Path

SITECUSTOMIZE = '''\
import sys


class _NoEmulators:
    """spot_emulators is not installed (tests/support/no_emulators.py)."""

    def find_spec(self, name, path=None, target=None):
        if name == "spot_emulators" or name.startswith("spot_emulators."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoEmulators())
'''


def env_without_emulators(folder: Path) -> dict[str, str]:
    """os.environ for a child that cannot import spot_emulators (its sitecustomize goes
    in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}
