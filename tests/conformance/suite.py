"""Running the official MCP conformance suite (`@modelcontextprotocol/conformance`) and reading it.

The suite is a Node.js program installed by `tests/conformance/install.sh` into `.tools/`. It has
no stdio mode: it tests a Streamable HTTP URL, one scenario after another, each with a fresh
session. With `-o DIR` it writes one `checks.json` per scenario, which is what is read here (its
console summary hides warnings and counts checks, not scenarios). Its console output is kept in a
file, never printed: its last line, `Total: N passed, N failed`, counts *checks* and has the shape
of a test runner's closing line.

A scenario's status: `fail` if any check is a FAILURE, else `warn` if any is a WARNING, else
`pass` (INFO and SKIPPED are traces).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.integration.mcp_servers import REPO_ROOT

__all__ = [
    "ScenarioResult",
    "SuiteTools",
    "find_tools",
    "format_table",
    "run_suite",
]

TOOLS = REPO_ROOT / ".tools"
SUITE_TIMEOUT_S = 300  # the suite's raw fetches have no timeout of their own


@dataclass(frozen=True, slots=True)
class SuiteTools:
    """Where Node.js 22 and the installed suite are."""

    node_dir: Path
    packages: Path

    @property
    def conformance(self) -> Path:
        return self.packages / "node_modules" / ".bin" / "conformance"

    def env(self) -> dict[str, str]:
        """The environment to run the suite's scripts in (Node.js 22 first on PATH)."""
        return {**os.environ, "PATH": f"{self.node_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _node_major(node: Path) -> int:
    try:
        done = subprocess.run(
            [str(node), "-p", "process.versions.node.split('.')[0]"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return 0
    return int(done.stdout.strip()) if done.stdout.strip().isdigit() else 0


def find_tools() -> SuiteTools | str:
    """The installed tools, or why they cannot be used (install with `make conformance-tools`)."""
    packages = TOOLS / "conformance"
    lock = REPO_ROOT / "tests" / "conformance" / "package-lock.json"
    installed = packages / ".installed-lock"
    if not installed.exists() or installed.read_bytes() != lock.read_bytes():
        return "the conformance suite is not installed (or is stale): run make conformance-tools"
    candidates = [TOOLS / "node22" / "node_modules" / "node" / "bin" / "node"]
    if (system := shutil.which("node")) is not None:
        candidates.insert(0, Path(system))
    for node in candidates:
        if node.exists() and _node_major(node) >= 22:
            return SuiteTools(node_dir=node.parent, packages=packages)
    return "no Node.js >= 22 found: run make conformance-tools"


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    """One scenario's checks, counted by status."""

    success: int = 0
    failure: int = 0
    warning: int = 0
    detail: str = ""

    @property
    def status(self) -> str:
        if self.failure:
            return "fail"
        return "warn" if self.warning else "pass"

    def cell(self) -> str:
        counts = f"{self.success}/{self.failure}/{self.warning}"
        return f"{self.status} {counts}"


def _read_checks(path: Path) -> ScenarioResult:
    checks = json.loads(path.read_text())
    counts = Counter(check.get("status") for check in checks)
    problems = [
        f"{check.get('id')}: {check.get('errorMessage') or check.get('description')}"
        for check in checks
        if check.get("status") in ("FAILURE", "WARNING")
    ]
    return ScenarioResult(
        success=counts["SUCCESS"],
        failure=counts["FAILURE"],
        warning=counts["WARNING"],
        detail="; ".join(problems)[:500],
    )


def run_suite(tools: SuiteTools, url: str, out_dir: Path) -> dict[str, ScenarioResult]:
    """Run every server scenario (`--suite all`, pending ones included) against `url`.

    Returns the result per scenario name. The console output is in `out_dir/console.txt`.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "console.txt").open("w") as console:
        subprocess.run(
            [str(tools.conformance), "server", "--url", url, "--suite", "all", "-o", str(out_dir)],
            cwd=out_dir,
            env=tools.env(),
            stdout=console,
            stderr=subprocess.STDOUT,
            timeout=SUITE_TIMEOUT_S,
            check=False,  # exit 1 means "some check failed"; the checks say which
        )
    results: dict[str, ScenarioResult] = {}
    for checks in sorted(out_dir.glob("server-*/checks.json")):
        name = checks.parent.name.removeprefix("server-").rsplit("-", 6)[0]
        results[name] = _read_checks(checks)
    return results


def format_table(columns: Mapping[str, Mapping[str, ScenarioResult]], order: Sequence[str]) -> str:
    """A plain-text table: one row per scenario, one column per run (status and S/F/W counts)."""
    names = [*order, *sorted(set().union(*columns.values()) - set(order))]
    width = max(len(n) for n in names)
    heads = list(columns)
    lines = [
        "scenario".ljust(width) + "".join(f"  {h:<14}" for h in heads),
        "-" * width + "".join("  " + "-" * 14 for _ in heads),
    ]
    for name in names:
        cells = [columns[h][name].cell() if name in columns[h] else "missing" for h in heads]
        lines.append(name.ljust(width) + "".join(f"  {c:<14}" for c in cells))
    lines.append("(cells: status success/failure/warning checks)")
    return "\n".join(lines)
