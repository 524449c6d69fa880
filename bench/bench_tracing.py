"""What tracing costs one MCP call on the event loop, in-process: off, on but not sampled, sampled.

Each call is what the transport does around every proxied message: its SERVER span
(`proxy.mcp.transport.spans.traced`, with the call's duration metric) and the trace context
written for the upstream (`inject_headers`). The provider is the proxy's own
(`configure_telemetry`), exporting to a closed port so no span leaves the machine;
`sample_ratio` 0 and 1 give the unsampled and sampled rows. CPU is the calling thread's (the
event loop's, in the proxy): encoding and sending sampled spans costs the exporter's thread more,
which `bench_telemetry` counts.
An unsampled call should cost little over tracing off: it makes no child span, builds none of
its span's attributes, and still passes its trace context on. `bench_telemetry` measures the
same through `interlock serve`, where these differences sit inside the machine's noise.
"""

from __future__ import annotations

import logging
import time

from multidict import CIMultiDict

from bench.common import Table
from policies.model import TelemetrySettings, UpstreamSpec
from proxy.mcp.transport.spans import traced
from proxy.mcp.wire.jsonrpc import parse_body
from proxy.telemetry import tracing
from proxy.telemetry.sdk import configure_telemetry

__all__ = ["run"]

_CLOSED = "http://127.0.0.1:9/v1/traces"  # the discard port: nothing listens
_BODY = (
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
    b'"params":{"name":"search_docs","arguments":{"query":"x"}}}'
)
_SETTINGS = {
    "off": None,
    "on, not sampled (sample_ratio 0)": 0.0,
    "on, sampled (sample_ratio 1)": 1.0,
}


def _per_call_us(calls: int, rounds: int) -> float:
    message = parse_body(_BODY).single
    spec = UpstreamSpec(name="up", kind="mcp_http", url="http://127.0.0.1:8000/mcp")
    headers = CIMultiDict({"content-type": "application/json", "mcp-session-id": "s-1"})

    def one() -> None:
        with traced(message, spec, headers, session_id="s-1", protocol_version="2025-11-25"):
            tracing.inject_headers({})

    for _ in range(calls // 10):
        one()
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time()
        for _ in range(calls):
            one()
        best = min(best, (time.thread_time() - started) / calls * 1e6)
    return best


def run(quick: bool = False) -> list[Table]:
    """CPU per traced call, in-process, for each tracing setting."""
    calls, rounds = (2_000, 2) if quick else (20_000, 5)
    measured: dict[str, float] = {}
    # The exporter's failures to reach the closed port are expected here, not news.
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    for label, ratio in _SETTINGS.items():
        settings = TelemetrySettings(otlp_endpoint=_CLOSED, sample_ratio=ratio or 0.0)
        handle = configure_telemetry(settings, enabled=ratio is not None, set_global=False)
        try:
            measured[label] = _per_call_us(calls, rounds)
        finally:
            handle.shutdown()
    off = measured["off"]
    rows = [[label, f"{us:.1f}", f"{us - off:+.1f}"] for label, us in measured.items()]
    note = (
        f"{calls} calls per setting, best of {rounds} rounds, the calling thread's CPU (the "
        "exporter's thread, which encodes sampled spans, is not counted: see the telemetry "
        "table). One call = the transport's SERVER span "
        "around an MCP tools/call with its duration metric, plus the trace context written for "
        "the upstream. Telemetry should cost what it records: an unsampled call only passes its "
        "trace context on."
    )
    return [
        Table(
            title="Tracing per MCP call, in-process",
            columns=["tracing", "CPU µs/call", "over off"],
            rows=rows,
            note=note,
        )
    ]
