"""Shared shapes for the benchmarks: every `bench/bench_*.py` returns a list of tables."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Table"]


@dataclass
class Table:
    """One printed table of a benchmark."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""
