"""`make bench`: run every `bench/bench_*.py` module and print its tables.

`python -m bench [--quick] [NAME ...]` runs all benchmarks, or only those named (e.g. `ledger`).
Numbers are for comparison within one run: every table carries its own baseline.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import time

from rich.console import Console
from rich.table import Table as RichTable

import bench
from bench.common import Table


def _modules(names: list[str]) -> list[str]:
    found = sorted(
        info.name for info in pkgutil.iter_modules(bench.__path__) if info.name.startswith("bench_")
    )
    if not names:
        return found
    wanted = {f"bench_{name.removeprefix('bench_')}" for name in names}
    unknown = wanted - set(found)
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    return [name for name in found if name in wanted]


def _print(console: Console, table: Table) -> None:
    rich_table = RichTable(title=table.title, title_justify="left")
    for column in table.columns:
        rich_table.add_column(column)
    for row in table.rows:
        rich_table.add_row(*row)
    console.print(rich_table)
    if table.note:
        console.print(table.note)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    args = parser.parse_args()
    console = Console(width=max(Console().width, 140))
    console.print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    failed = 0
    for name in _modules(args.names):
        started = time.monotonic()
        module = importlib.import_module(f"bench.{name}")
        try:
            tables = module.run(quick=args.quick)
        except Exception as exc:
            failed += 1
            console.print(f"[red]{name} failed: {type(exc).__name__}: {exc}[/red]")
            continue
        for table in tables:
            _print(console, table)
        console.print(f"[dim]{name}: {time.monotonic() - started:.1f} s[/dim]\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
