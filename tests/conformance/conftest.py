"""Print the conformance table (direct vs through the proxy) at the end of the pytest run."""

from __future__ import annotations

from typing import Any

from tests.conformance.suite import format_table


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.conformance.test_conformance import RESULTS, SECONDS

    if "direct" not in RESULTS:
        return
    order = list(RESULTS["direct"])
    terminalreporter.section("MCP conformance suite 0.1.16: direct vs through Interlock")
    terminalreporter.write_line(format_table(RESULTS, order))
    took = ", ".join(f"{run} {seconds:.1f} s" for run, seconds in SECONDS.items())
    terminalreporter.write_line(f"suite run times: {took}")
