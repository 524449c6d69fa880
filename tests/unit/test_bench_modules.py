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


def test_the_mcp_bench_reads_ledger_commits_from_prometheus_text() -> None:
    """The MCP table's writes-per-commit column comes from these two counters, as Interlock's
    /metrics writes them; a missing one gives no figure rather than a wrong one."""
    from bench.bench_mcp import parse_commits

    text = (
        "# HELP interlock_ledger_commits_total Ledger transactions committed\n"
        "# TYPE interlock_ledger_commits_total counter\n"
        "interlock_ledger_commits_total 12.0\n"
        "interlock_ledger_committed_operations_total 30.0\n"
        'interlock_ledger_entries{state="running"} 4.0\n'
    )
    assert parse_commits(text) == (12.0, 30.0)
    assert parse_commits(text.replace("interlock_ledger_commits_total 12.0\n", "")) is None


def test_the_mcp_bench_shows_ledger_writes_per_call_and_per_commit() -> None:
    """2,000 writes in 250 commits over 1,000 calls: 2 per call (claim, outcome), 8 per commit;
    a cell with no commit shows no figure."""
    from bench.bench_mcp import Result

    result = Result(1000, 0, 1.0, 1.0, [], 0, ledger=(250.0, 2000.0))
    assert result.ledger_cell == "2.00 · 8.0"
    assert Result(1000, 0, 1.0, 1.0, [], 0, ledger=(0.0, 0.0)).ledger_cell == "—"
    assert Result(1000, 0, 1.0, 1.0, [], 0).ledger_cell == "—"
