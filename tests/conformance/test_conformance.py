"""The official MCP conformance suite gives the same results through Interlock as directly.

Four runs of `@modelcontextprotocol/conformance` (all server scenarios, pending ones included):
against the reference upstream directly; through `interlock serve` (a real process, SQLite ledger,
default policy) to that upstream over Streamable HTTP; through it to the same server over stdio
(the proxy spawns it); and through it over HTTP once more on the same ledger after
`dedup_window_s`, when derived keys no longer recognise the first run's calls as retries.
The table of all four is printed at the end of the pytest run (see conftest.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance import processes
from tests.conformance.suite import ScenarioResult, SuiteTools, find_tools
from tests.conformance.suite import run_suite as _run_suite
from tests.integration.mcp_servers import REPO_ROOT

pytestmark = pytest.mark.slow

RESULTS: dict[str, dict[str, ScenarioResult]] = {}
"""Per run, per scenario; read by conftest.py to print the table."""
SECONDS: dict[str, float] = {}
"""How long each run of the suite took (printed under the table)."""
HTTP_DONE_AT: list[float] = []
"""When the first run through the proxy ended (monotonic)."""
DEDUP_WINDOW_S = 1.0
KNOWN_DIFFERENCES: dict[str, str] = {}
"""Scenarios that still differ through the proxy for reasons other changes fix. An entry that no
longer differs fails the test: delete it then, so that the scenario is guarded again."""


@pytest.fixture(scope="module")
def tools() -> SuiteTools:
    found = find_tools()
    if isinstance(found, str):
        if os.environ.get("CI") == "true":
            pytest.fail(f"the conformance suite must run in CI: {found}")
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conformance")


@pytest.fixture(scope="module")
def upstream_url(folder: Path) -> Iterator[str]:
    with processes.reference_http(folder / "reference.log") as url:
        yield url


@pytest.fixture(scope="module")
def proxy_base(folder: Path, upstream_url: str) -> Iterator[str]:
    lines = [
        'listen: "{listen}"',
        'ledger: {{url: "sqlite:///ledger.db"}}',
        f"defaults: {{{{dedup_window_s: {DEDUP_WINDOW_S}}}}}",
        "upstreams:",
        f"  ref_http: {{{{mcp: {json.dumps(upstream_url)}}}}}",
        "  ref_stdio:",
        f"    command: {json.dumps(processes.reference_stdio_command())}",
        f"    cwd: {json.dumps(str(REPO_ROOT))}",
    ]
    template = "\n".join(lines) + "\n"
    with processes.interlock_serve(template, folder) as base:
        yield base


def run_suite(tools: SuiteTools, url: str, out_dir: Path) -> dict[str, ScenarioResult]:
    started = time.monotonic()
    try:
        return _run_suite(tools, url, out_dir)
    finally:
        SECONDS[out_dir.name] = time.monotonic() - started


def _differences(run: str) -> list[str]:
    """What differs from the direct run, besides the known differences (and stale entries)."""
    direct, other = RESULTS["direct"], RESULTS[run]
    differing = {
        name: f"direct {direct[name].status}, {run} "
        + (f"{other[name].status} ({other[name].detail})" if name in other else "missing")
        for name in sorted(direct)
        if name not in other or other[name].status != direct[name].status
    }
    stale = [
        f"{name}: now the same as directly; remove it from KNOWN_DIFFERENCES"
        for name in KNOWN_DIFFERENCES
        if name not in differing
    ]
    return [f"{n}: {d}" for n, d in differing.items() if n not in KNOWN_DIFFERENCES] + stale


def test_the_reference_upstream_passes_every_scenario_directly(
    tools: SuiteTools, folder: Path, upstream_url: str
) -> None:
    """The reference upstream passes all server scenarios (the baseline the proxy must keep)."""
    RESULTS["direct"] = run_suite(tools, upstream_url, folder / "direct")
    failing = {n: r.detail for n, r in RESULTS["direct"].items() if r.status != "pass"}
    assert len(RESULTS["direct"]) >= 32
    assert failing == {}


def test_through_the_proxy_over_http_the_same_scenarios_pass(
    tools: SuiteTools, folder: Path, proxy_base: str
) -> None:
    """Through Interlock to the HTTP upstream, every scenario has the direct run's status."""
    if "direct" not in RESULTS:
        pytest.fail("the direct run did not happen")
    RESULTS["http"] = run_suite(tools, f"{proxy_base}/mcp/ref_http", folder / "http")
    HTTP_DONE_AT.append(time.monotonic())
    assert _differences("http") == []


def test_through_the_proxy_over_stdio_the_same_scenarios_pass(
    tools: SuiteTools, folder: Path, proxy_base: str
) -> None:
    """Through Interlock to the same server over stdio, every scenario has the direct status."""
    if "direct" not in RESULTS:
        pytest.fail("the direct run did not happen")
    RESULTS["stdio"] = run_suite(tools, f"{proxy_base}/mcp/ref_stdio", folder / "stdio")
    assert _differences("stdio") == []


def test_a_second_run_on_the_same_ledger_after_the_dedup_window_passes_too(
    tools: SuiteTools, folder: Path, proxy_base: str
) -> None:
    """Run again over HTTP after dedup_window_s: the same calls run again, nothing is refused."""
    if "direct" not in RESULTS:
        pytest.fail("the direct run did not happen")
    if HTTP_DONE_AT:
        # The window is what this run is about: the first run's entries must be older than it.
        time.sleep(max(0.0, HTTP_DONE_AT[0] + DEDUP_WINDOW_S + 1 - time.monotonic()))
    RESULTS["rerun"] = run_suite(tools, f"{proxy_base}/mcp/ref_http", folder / "rerun")
    assert _differences("rerun") == []
