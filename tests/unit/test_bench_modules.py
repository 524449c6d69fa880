"""`make bench` is not run by the suite (performance is measured, never asserted), so the suite at
least checks that every benchmark module imports and offers `run` — a merge once left one importing
a helper that had moved, and `make bench` failed after the other tables."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bench

MODULES = sorted(info.name for info in pkgutil.iter_modules(bench.__path__))


@pytest.mark.parametrize("name", [m for m in MODULES if m.startswith("bench_")])
def test_every_benchmark_imports_and_has_run(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert callable(module.run)


@pytest.mark.parametrize("name", [m for m in MODULES if not m.startswith("bench_")])
def test_every_benchmark_helper_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")
