"""Real MCP upstream servers for the integration tests, run as real subprocesses.

One `MCPServer` (`build_server()`) with the tools the proxy's tests need:

- `echo(text)` - returns the text;
- `slow_progress(steps, delay_s)` - reports `notifications/progress` at every step;
- `flood_progress(steps, size)` - reports progress as fast as it can, `size`-byte messages;
- `ask_name()` - elicits a name from the client (handshake era: a server→client request);
- `search_docs(query)` - read-only (`readOnlyHint: true`);
- `send_email(to, subject, body)` - side-effecting (`destructiveHint: true`); every execution is
  counted per idempotency key (`params._meta["interlock/idempotency-key"]`) and per arguments;
- `count()` - the counters as a tool result (the same data as `GET /stats`);
- `hold(seconds, tag)` - sleeps while measuring the server's concurrency (max in `/stats`) and
  records `started` / `cancelled` / `finished` tags (the cancellation tests read them);
- `die()` - the server process exits mid-call (an upstream that crashes after receiving a call);
- `charge(amount)` / `refund(amount)` - two side-effecting tools (no annotations) taking the same
  arguments, each counted in `calls`;
- `get_current_time()` - no arguments, no annotations; answers with how often it ran;
- `set_flag(value)` - `idempotentHint: true` (repeating it is harmless), counted in `calls`;
- `confirm_send(to)` - 2026-07-28 multi-round (MRTR): without `inputResponses` it answers
  `resultType: "input_required"` (an elicitation keyed `confirm`, `requestState` "confirm-1");
  re-sent with the answer and that state it completes, counted in `calls["confirm_send_done"]`
  (every round in `calls["confirm_send"]`).

HTTP mode adds plain routes: `GET /healthz`, `GET /stats` (the counters, plus `mcp_requests`: how
many HTTP requests reached `/mcp`, `http_methods`: those by HTTP method, and `last_headers`: the
headers of the latest one),
`POST /reset`, and `POST /control`
with `{"reject_next": N, "status": 429, "retry_after": "2", "methods": ["tools/call"]}` which makes
an ASGI wrapper in front of the SDK app answer the next N matching POSTs with that status and
`Retry-After` before the SDK sees them (the upstream-pressure mode); with `"fail_after": N`
instead, the next N matching POSTs reach the SDK (the tool runs) and are then answered with that
status, its own answer thrown away (a gateway whose backend acted and then reported 503);
`"list_delay_s": S` holds every `tools/list` POST for S seconds before the SDK sees it (an
upstream slow to list its tools).

Start one for a test with `running_upstream()`:

    with running_upstream(json_response=False) as upstream:
        url = upstream.url              # http://127.0.0.1:<port>/mcp
        stats = upstream.stats()        # GET /stats as a dict
        upstream.control(reject_next=2, status=429, retry_after="1")

It binds a free 127.0.0.1 port in the parent (no port race), hands the listening socket to the
child, waits (bounded) until `/healthz` answers, and kills the child on exit. The stdio version of
the same server is `tests/integration/mcp_stdio_server.py` (see `stdio_command()`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult
from pydantic import BaseModel

__all__ = [
    "REPO_ROOT",
    "RunningUpstream",
    "build_server",
    "running_upstream",
    "stdio_command",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
IDEMPOTENCY_META_KEY = "interlock/idempotency-key"


@dataclass
class _State:
    """Counters kept by one server process."""

    emails_by_key: Counter[str] = field(default_factory=Counter)
    emails_by_args: Counter[str] = field(default_factory=Counter)
    emails_total: int = 0
    running: int = 0
    max_running: int = 0
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "emails_by_key": dict(self.emails_by_key),
            "emails_by_args": dict(self.emails_by_args),
            "emails_total": self.emails_total,
            "max_running": self.max_running,
            "running": self.running,
            "started": list(self.started),
            "finished": list(self.finished),
            "cancelled": list(self.cancelled),
            "calls": dict(self.calls),
            "pid": os.getpid(),
        }


class _Name(BaseModel):
    name: str


_SENTENCE = "The quick brown fox jumps over the lazy dog; café ☃. "


def build_server(state: _State | None = None, name: str = "interlock-test-upstream") -> MCPServer:
    """The test upstream with all its tools (state is kept in `state`)."""
    st = state if state is not None else _State()
    server = MCPServer(name)

    @server.tool()
    async def echo(text: str) -> str:
        """Return the text unchanged."""
        st.calls["echo"] += 1
        return text

    @server.tool()
    async def slow_progress(
        ctx: Context, steps: int = 3, delay_s: float = 0.01, start: int = 1
    ) -> str:
        """Report progress at every step (from `start`), then finish."""
        st.calls["slow_progress"] += 1
        for i in range(steps):
            await asyncio.sleep(delay_s)
            await ctx.report_progress(start + i, steps, f"step {i + 1}")
        return f"done after {steps} steps"

    @server.tool()
    async def flood_progress(ctx: Context, steps: int = 1000, size: int = 4096) -> str:
        """Report progress `steps` times as fast as it can, each with a `size`-byte message."""
        st.calls["flood_progress"] += 1
        for i in range(steps):
            await ctx.report_progress(i + 1, steps, "x" * size)
        return f"flooded {steps} times"

    @server.tool()
    async def ask_name(ctx: Context) -> str:
        """Ask the client for a name (elicitation) and greet it."""
        st.calls["ask_name"] += 1
        answer = await ctx.elicit("What is your name?", _Name)
        if answer.action == "accept":
            return f"hello {answer.data.name}"
        return f"no name ({answer.action})"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def search_docs(query: str) -> str:
        """Search the documentation (read-only)."""
        st.calls["search_docs"] += 1
        return f"3 results for {query!r}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def big_text(kib: int = 1024) -> str:
        """A long text answer of `kib` KiB (read-only; the benchmarks relay it)."""
        return (_SENTENCE * (kib * 1024 // len(_SENTENCE) + 1))[: kib * 1024]

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def rows(count: int = 10_000) -> list[dict[str, Any]]:
        """`count` structured rows (read-only; sent as structuredContent and as its text)."""
        return [
            {"id": n, "name": f"row {n}", "score": n / 8, "active": n % 2 == 0}
            for n in range(count)
        ]

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
    async def send_email(ctx: Context, to: str, subject: str, body: str = "") -> str:
        """Send an email (side-effecting: every execution is counted)."""
        meta: dict[str, Any] = dict(ctx.request_context.meta or {})
        key = meta.get(IDEMPOTENCY_META_KEY)
        if isinstance(key, str):
            st.emails_by_key[key] += 1
        args = json.dumps({"to": to, "subject": subject, "body": body}, sort_keys=True)
        st.emails_by_args[args] += 1
        st.emails_total += 1
        st.calls["send_email"] += 1
        return f"sent email #{st.emails_total} to {to}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def count() -> dict[str, Any]:
        """The server's counters (emails by key and by arguments, concurrency, tags)."""
        return st.as_dict()

    @server.tool()
    async def hold(seconds: float = 0.05, tag: str = "") -> str:
        """Sleep while measuring concurrency; records the tag as started/finished/cancelled."""
        st.calls["hold"] += 1
        st.running += 1
        st.max_running = max(st.max_running, st.running)
        st.started.append(tag)
        try:
            await asyncio.sleep(seconds)
        except BaseException:
            st.cancelled.append(tag)
            raise
        finally:
            st.running -= 1
        st.finished.append(tag)
        return f"held {seconds} s"

    @server.tool()
    async def charge(amount: int) -> str:
        """Charge the card (side-effecting)."""
        st.calls["charge"] += 1
        return f"CHARGED {amount}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
    async def decline_charge(amount: int) -> str:
        """Try to charge the card, which is declined: a tool error (`isError`), counted."""
        st.calls["decline_charge"] += 1
        raise ToolError(f"card declined for {amount}")

    @server.tool()
    async def refund(amount: int) -> str:
        """Refund the card (side-effecting)."""
        st.calls["refund"] += 1
        return f"REFUNDED {amount}"

    @server.tool()
    async def get_current_time() -> str:
        """The time, as a counter of how often it was asked (no annotations)."""
        st.calls["get_current_time"] += 1
        return f"tick {st.calls['get_current_time']}"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    async def set_flag(value: str) -> str:
        """Set a flag (idempotent: setting it twice is setting it once)."""
        st.calls["set_flag"] += 1
        return f"flag = {value}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
    async def confirm_send(ctx: Context, to: str) -> str | InputRequiredResult:
        """Send after the user confirms (asks for it with `input_required`)."""
        st.calls["confirm_send"] += 1
        responses = ctx.input_responses
        if not responses or ctx.request_state != "confirm-1":
            schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
            ask = ElicitRequest(
                params=ElicitRequestFormParams(message=f"Send to {to}?", requested_schema=schema)
            )
            return InputRequiredResult(input_requests={"confirm": ask}, request_state="confirm-1")
        answer = responses.get("confirm")
        action = getattr(answer, "action", None) or (
            answer.get("action") if isinstance(answer, dict) else None
        )
        st.calls["confirm_send_done"] += 1
        return f"confirmed send to {to} ({action})"

    @server.tool()
    async def die() -> str:
        """Exit the whole server process in the middle of the call."""
        sys.stdout.flush()
        os._exit(3)

    return server


# --- HTTP mode: the SDK app behind a small ASGI wrapper (pressure mode, stats routes) ---


@dataclass
class _Pressure:
    reject_next: int = 0
    status: int = 429
    retry_after: str | None = "1"
    methods: tuple[str, ...] = ("tools/call",)
    rejected: int = 0
    fail_after: int = 0
    list_delay_s: float = 0.0  # how long a tools/list POST waits before the SDK sees it
    mcp_requests: int = 0  # every HTTP request that reached /mcp (the "nothing forwarded" checks)
    last_headers: dict[str, str] = field(default_factory=dict)  # of the latest /mcp request
    http_methods: Counter[str] = field(default_factory=Counter)  # /mcp requests by HTTP method


class _PressureWrapper:
    """ASGI middleware: serve /stats, /control, /reset, /healthz; shed POSTs when told to."""

    def __init__(self, app: Any, state: _State, pressure: _Pressure) -> None:
        self.app = app
        self.state = state
        self.pressure = pressure

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if path == "/healthz":
            await _send_json(send, 200, {"ok": True})
            return
        if path == "/stats":
            extra = {
                "rejected": self.pressure.rejected,
                "mcp_requests": self.pressure.mcp_requests,
                "last_headers": self.pressure.last_headers,
                "http_methods": dict(self.pressure.http_methods),
            }
            await _send_json(send, 200, {**self.state.as_dict(), **extra})
            return
        if path in ("/control", "/reset") and method == "POST":
            body = await _read_body(receive)
            if path == "/reset":
                fresh = _State()
                for name in self.state.__dataclass_fields__:
                    setattr(self.state, name, getattr(fresh, name))
                self.pressure.rejected = 0
                self.pressure.mcp_requests = 0
                self.pressure.http_methods.clear()
            else:
                self._configure(json.loads(body or b"{}"))
            await _send_json(send, 200, {"ok": True})
            return
        if path == "/mcp":
            self.pressure.mcp_requests += 1
            self.pressure.http_methods[method] += 1
            self.pressure.last_headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        if method == "POST" and self.pressure.list_delay_s > 0:
            body = await _read_body(receive)
            if _method_of(body) == "tools/list":
                await asyncio.sleep(self.pressure.list_delay_s)
            receive = _replay(body)
        if method == "POST" and self.pressure.fail_after > 0:
            body = await _read_body(receive)
            if _method_of(body) in self.pressure.methods:
                self.pressure.fail_after -= 1
                self.pressure.rejected += 1
                await self.app(scope, _replay(body), _discard)
                await _send_json(send, self.pressure.status, {"error": "bad gateway state"})
                return
            receive = _replay(body)
        if method == "POST" and self.pressure.reject_next > 0:
            body = await _read_body(receive)
            if _method_of(body) in self.pressure.methods:
                self.pressure.reject_next -= 1
                self.pressure.rejected += 1
                headers = (
                    {"retry-after": self.pressure.retry_after} if self.pressure.retry_after else {}
                )
                await _send_json(send, self.pressure.status, {"error": "overloaded"}, headers)
                return
            receive = _replay(body)
        await self.app(scope, receive, send)

    def _configure(self, values: dict[str, Any]) -> None:
        self.pressure.reject_next = int(values.get("reject_next", 0))
        self.pressure.fail_after = int(values.get("fail_after", 0))
        self.pressure.status = int(values.get("status", 429))
        self.pressure.retry_after = values.get("retry_after", "1")
        self.pressure.methods = tuple(values.get("methods", ["tools/call"]))
        self.pressure.list_delay_s = float(values.get("list_delay_s", 0.0))


def _method_of(body: bytes) -> str | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message.get("method") if isinstance(message, dict) else None


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return b"".join(chunks)


async def _discard(message: Any) -> None:
    """An ASGI `send` that throws the app's answer away."""
    del message


def _replay(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # like a real receive: block until the request ends
        return {"type": "http.disconnect"}  # pragma: no cover

    return receive


async def _send_json(
    send: Any, status: int, value: Any, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps(value).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def _serve_http(fd: int, *, json_response: bool, stateless: bool) -> None:
    import uvicorn

    state = _State()
    server = build_server(state)
    sdk_app = server.streamable_http_app(json_response=json_response, stateless_http=stateless)
    app = _PressureWrapper(sdk_app, state, _Pressure())
    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


# --- the helper tests use ---


@dataclass
class RunningUpstream:
    """A test upstream running as a subprocess."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The MCP endpoint (Streamable HTTP)."""
        return f"{self.base}/mcp"

    def stats(self) -> dict[str, Any]:
        """The server's counters (`GET /stats`)."""
        with urllib.request.urlopen(f"{self.base}/stats", timeout=5) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    def control(self, **values: Any) -> None:
        """Configure the pressure mode (`POST /control`)."""
        self._post("/control", values)

    def reset(self) -> None:
        """Zero the counters (`POST /reset`)."""
        self._post("/reset", {})

    def _post(self, path: str, value: dict[str, Any]) -> None:
        request = urllib.request.Request(
            f"{self.base}{path}",
            data=json.dumps(value).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            answer.read()


@contextlib.contextmanager
def running_upstream(
    *,
    json_response: bool = False,
    stateless: bool = False,
    start_timeout_s: float = 20.0,
    quiet: bool = False,
) -> Iterator[RunningUpstream]:
    """Start the test upstream as a real subprocess on a free 127.0.0.1 port; kill it on exit.
    `quiet` sends its log lines to /dev/null (a benchmark prints tables meanwhile)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    args = [sys.executable, "-m", "tests.integration.mcp_servers", "--fd", str(listener.fileno())]
    if json_response:
        args.append("--json-response")
    if stateless:
        args.append("--stateless")
    stderr = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(args, cwd=REPO_ROOT, pass_fds=[listener.fileno()], stderr=stderr)
    listener.close()
    upstream = RunningUpstream(process=process, port=port)
    try:
        _wait_healthy(upstream, start_timeout_s)
        yield upstream
    finally:
        process.kill()
        process.wait(timeout=10)


def _wait_healthy(upstream: RunningUpstream, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if upstream.process.poll() is not None:
            raise RuntimeError(f"test upstream exited with {upstream.process.returncode}")
        try:
            with urllib.request.urlopen(f"{upstream.base}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"test upstream not healthy within {timeout_s} s")
        time.sleep(0.05)


def stdio_command() -> tuple[str, ...]:
    """The command line of the stdio version of the test upstream (run with cwd=REPO_ROOT)."""
    return (sys.executable, "-m", "tests.integration.mcp_stdio_server")


def main() -> None:
    parser = argparse.ArgumentParser(description="Interlock's MCP test upstream (HTTP)")
    parser.add_argument("--fd", type=int, required=True, help="listening socket inherited")
    parser.add_argument("--json-response", action="store_true")
    parser.add_argument("--stateless", action="store_true")
    args = parser.parse_args()
    _serve_http(args.fd, json_response=args.json_response, stateless=args.stateless)


if __name__ == "__main__":
    main()
