"""How `serve` starts a short-lived Python child of its own (validating the configuration, listing
an upstream's tools): the same interpreter running a module of this very installation.

The child runs with `-P` (its working directory is not put first on its module path, so a
`proxy/` folder where serve happens to run cannot stand in for Interlock) and with the folder
holding this installation's packages first on `PYTHONPATH`, so it imports exactly the code the
parent runs, installed or not. A frozen build has no interpreter to start: callers do the work
in-process there (`children_possible`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["child_argv", "child_environment", "children_possible"]

_PACKAGES = str(Path(__file__).resolve().parent.parent)  # the folder holding proxy/, policies/


def children_possible() -> bool:
    """Whether this process can start a Python child of its own (not a frozen build)."""
    return not getattr(sys, "frozen", False)


def child_argv(module: str) -> list[str]:
    """The command line running `python -m module` for this installation."""
    return [sys.executable, "-P", "-m", module]


def child_environment() -> dict[str, str]:
    """This process's environment, with this installation's packages first on `PYTHONPATH`."""
    path = [_PACKAGES, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
