"""stdio upstreams: MCP servers the proxy spawns and talks to in JSON lines.

Lines are relayed byte-for-byte where the protocol allows it. A handshake-era client session gets a
process of its own (`StdioProcess(shared=False)`): its request ids are the client's, nothing is
rewritten, and the proxy mints the `Mcp-Session-Id`. Modern-era (2026-07-28) requests of all
clients share one process per upstream (`shared=True`): each request gets a proxy-minted id (and
progress token) so answers and progress find their way back, and the original id is put back into
the response's bytes. Each line is read once, to its envelope: a result's tool output (`content`,
`structuredContent`) stays `RawJson`, the server's own JSON text.

Messages the process sends that belong to no request (server→client requests, log messages,
list-changed notifications) go to the `tools/call` most recently in flight (else any request in
flight), else to the session's GET stream, else wait in a small queue for one. A process ends on
DELETE, when idle for `idle_s`, on shutdown, or when it exits by itself (its calls then fail with
`UpstreamLost`, its session is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from policies.model import UpstreamSpec
from proxy.errors import UpstreamAnswerTooLarge, UpstreamLost, UpstreamNotReached, UpstreamTimeout
from proxy.mcp.upstreams.delivery import Backlog, Delivery
from proxy.mcp.upstreams.relay import Relay
from proxy.mcp.upstreams.stdio_ids import WireIds, restore
from proxy.mcp.wire.jsonrpc import (
    JsonObject,
    WireMessage,
    dumps,
    error_response,
    id_key,
    progress_token,
    read_upstream_message,
)
from proxy.runtime.client_gone import cancelled_when

__all__ = ["INHERITED_ENV", "StdioProcess", "inherited_environment"]

log = logging.getLogger("interlock.mcp.stdio")

_STDERR_LINE_MAX = 2000
INHERITED_ENV = (
    (
        "APPDATA",
        "HOMEDRIVE",
        "HOMEPATH",
        "LOCALAPPDATA",
        "PATH",
        "PATHEXT",
        "PROCESSOR_ARCHITECTURE",
        "SYSTEMDRIVE",
        "SYSTEMROOT",
        "TEMP",
        "USERNAME",
        "USERPROFILE",
    )
    if sys.platform == "win32"
    else ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
)
"""The proxy's environment variables a stdio server is started with (before its own `env`): the
set MCP stdio clients pass on by default (the Python SDK's, on Windows and elsewhere), so that no
credential in the proxy's environment reaches a server that was not given it."""


def inherited_environment() -> dict[str, str]:
    """`INHERITED_ENV` as set in this process, except a value that is a shell function (`()…`)."""
    return {
        name: value
        for name in INHERITED_ENV
        if (value := os.environ.get(name)) is not None and not value.startswith("()")
    }


@dataclass(eq=False)
class _Pending:
    """One request sent to the process and not answered yet."""

    future: asyncio.Future[WireMessage]
    delivery: Delivery
    """Its progress and related messages, written to its caller without holding the reader."""
    original_id: Any
    wire_id: Any
    original_token: Any = None
    wire_token: Any = None
    method: str | None = None
    started: float = field(default_factory=time.monotonic)


REQUEST_CANCELLED = -32800


def _cancelled_answer(request_id: Any) -> WireMessage:
    answer = error_response(request_id, REQUEST_CANCELLED, "Request cancelled")
    return WireMessage(answer, dumps(answer))


class StdioProcess:
    """One spawned stdio MCP server."""

    def __init__(self, spec: UpstreamSpec, *, shared: bool, max_line_bytes: int) -> None:
        self.spec = spec
        self.shared = shared
        self.session_id: str | None = None
        self.get_stream_open = False
        self.last_active = time.monotonic()
        self.exited = asyncio.Event()
        self._max_line = max_line_bytes
        self._too_large = False  # a line over `_max_line` ended the process
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[str, _Pending] = {}
        self._tokens: dict[str, _Pending] = {}
        self._wire_ids = WireIds()
        self._unsolicited = Backlog()
        self._unsolicited_ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self.exited.is_set()

    @property
    def ended(self) -> bool:
        """The process has exited and been reaped (not merely closed its pipes)."""
        return self._proc is not None and self._proc.returncode is not None

    @property
    def busy(self) -> bool:
        return bool(self._pending) or self.get_stream_open

    async def start(self) -> None:
        """Spawn the process.

        Raises:
            UpstreamNotReached: the command could not be started.
        """
        env = {**inherited_environment(), **self.spec.env}
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.spec.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=self.spec.cwd,
                limit=self._max_line,
                start_new_session=True,  # a Ctrl-C to the proxy is not delivered to its children
            )
        except (OSError, ValueError) as exc:
            raise UpstreamNotReached(
                f"{self.spec.name}: cannot start {self.spec.command!r}: {exc}"
            ) from exc
        name = f"stdio-{self.spec.name}-{self._proc.pid}"
        self._tasks = [
            asyncio.create_task(self._read_stdout(), name=f"{name}-stdout"),
            asyncio.create_task(self._read_stderr(), name=f"{name}-stderr"),
        ]

    # --- sending ---

    async def exchange(
        self,
        message: JsonObject,
        *,
        raw: bytes | None,
        relay: Relay,
        timeout_s: float,
        cancel: asyncio.Event | None = None,
    ) -> WireMessage:
        """Send one request; return its response, relaying its progress and related messages.

        `raw` (the client's bytes for `message`) is written as-is when nothing needs rewriting.

        Raises:
            UpstreamNotReached: the process is not running, or `cancel` is already set (nothing
                was sent).
            UpstreamLost: the process died, or `cancel` was set, before the response.
            UpstreamTimeout: no response within `timeout_s` (the process is told to cancel).
        """
        if cancel is not None and cancel.is_set():
            raise UpstreamNotReached(f"{self.spec.name}: the client went away before sending")
        pending, line = self._prepare(message, raw, relay)
        pending.method = message.get("method")
        key = id_key(pending.wire_id)
        self._pending[key] = pending
        if pending.wire_token is not None:
            self._tokens[id_key(pending.wire_token)] = pending
        try:
            await self._write(line)
            answer = await self._await_answer(pending, timeout_s, cancel)
        except BaseException:
            pending.delivery.close()  # nothing of this call goes out after its error
            raise
        finally:
            if self._pending.get(key) is pending:
                del self._pending[key]
            if pending.wire_token is not None:
                self._tokens.pop(id_key(pending.wire_token), None)
            self.last_active = time.monotonic()
        await pending.delivery.flush()  # what came before the answer goes out before it
        return answer

    def _prepare(
        self, message: JsonObject, raw: bytes | None, relay: Relay
    ) -> tuple[_Pending, bytes]:
        future = asyncio.get_running_loop().create_future()
        delivery = Delivery(relay, self.spec.name)
        original_id = message.get("id")
        token = progress_token(message)
        if not self.shared:
            line = (
                raw if raw is not None and b"\n" not in raw and b"\r" not in raw else dumps(message)
            )
            pending = _Pending(future, delivery, original_id, original_id, token, token)
            return pending, line
        wire_id, wire_token, rewritten = self._wire_ids.mint(message, token)
        pending = _Pending(future, delivery, original_id, wire_id, token, wire_token)
        return pending, dumps(rewritten)

    async def _await_answer(
        self, pending: _Pending, timeout_s: float, cancel: asyncio.Event | None
    ) -> WireMessage:
        try:
            with cancelled_when(cancel) as trip:
                async with asyncio.timeout(timeout_s):
                    return await pending.future
        except TimeoutError:
            await self._cancel_upstream(pending.wire_id, "timeout")
            raise UpstreamTimeout(f"{self.spec.name}: no answer within {timeout_s:g} s") from None
        except asyncio.CancelledError:
            if trip is not None and trip.absorb():
                await self._cancel_upstream(pending.wire_id, "client went away")
                raise UpstreamLost(
                    f"{self.spec.name}: the client went away; the request was cancelled"
                ) from None
            raise

    async def _cancel_upstream(self, wire_id: Any, reason: str) -> None:
        note = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": wire_id, "reason": reason},
        }
        with contextlib.suppress(UpstreamNotReached):
            await self._write(dumps(note))

    async def send(self, message: JsonObject, raw: bytes | None = None) -> None:
        """Write a notification or a response (to a server→client request) as one line.

        A client's `notifications/cancelled` is forwarded to the process, and the named exchange
        ends with the answer the SDK's HTTP transport gives a cancelled request (-32800
        "Request cancelled"): a server stops and does not answer a cancelled request, and the
        call must end without being sent again.

        Raises:
            UpstreamNotReached: the process is not running.
        """
        line = raw if raw is not None and b"\n" not in raw and b"\r" not in raw else dumps(message)
        await self._write(line)
        self.last_active = time.monotonic()
        if message.get("method") == "notifications/cancelled" and not self.shared:
            params = message.get("params")
            request_id = params.get("requestId") if isinstance(params, dict) else None
            pending = self._pending.get(id_key(request_id))
            if pending is not None and not pending.future.done():
                pending.future.set_result(_cancelled_answer(pending.original_id))

    async def _write(self, line: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or self.exited.is_set():
            raise UpstreamNotReached(f"{self.spec.name}: the stdio process is not running")
        try:
            proc.stdin.write(line + b"\n")
            await proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise UpstreamNotReached(
                f"{self.spec.name}: the stdio process is gone ({exc!r})"
            ) from exc

    # --- receiving ---

    async def _read_stdout(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        stdout = self._proc.stdout
        try:
            while line := await self._next_line(stdout):
                line = line.rstrip(b"\r\n")
                if line:
                    await self._route(line)
        finally:
            await self._on_exit()

    async def _next_line(self, stdout: asyncio.StreamReader) -> bytes:
        """The next line; empty at the end of the stream, or after one over the limit (which
        cannot be resynchronised: the process is stopped and its calls fail as too large)."""
        try:
            return await stdout.readline()
        except ValueError as exc:  # readline's own: only the limit, never a line's content
            self._too_large = True
            log.error(
                "%s: stdio line over %d bytes (%s); stopping it",
                self.spec.name,
                self._max_line,
                exc,
            )
            if self._proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
            return b""

    async def _route(self, line: bytes) -> None:
        message = read_upstream_message(line, lazy_output=True)
        if message is None:
            log.warning(
                "%s: ignoring a stdout line that is not JSON-RPC: %.200r", self.spec.name, line
            )
            return
        if "method" not in message:
            self._resolve(message)
            return
        token = progress_token(message) if message["method"] == "notifications/progress" else None
        pending = self._tokens.get(id_key(token)) if token is not None else None
        if pending is not None:
            raw = restore(message.raw, pending.wire_token, pending.original_token)
            if raw is None:
                params = {**message["params"], "progressToken": pending.original_token}
                raw = dumps({**message, "params": params})
            pending.delivery.put(raw)
            return
        if self.shared:
            log.debug("%s: dropping an unrouted message %s", self.spec.name, message["method"])
            return
        target = self._request_owner()
        if target is not None:
            target.delivery.put(message.raw)
        else:
            self._unsolicited.append(message.raw)
            self._unsolicited_ready.set()

    def _request_owner(self) -> _Pending | None:
        """Where a message tied to no request goes: the latest tools/call, else the latest call.

        stdio frames carry no "related request", and elicitation or sampling come from a tool.
        """
        calls = [p for p in self._pending.values() if p.method == "tools/call"]
        return max(calls or self._pending.values(), key=lambda p: p.started, default=None)

    def _resolve(self, message: WireMessage) -> None:
        pending = self._pending.get(id_key(message.get("id")))
        if pending is None or pending.future.done():
            log.debug(
                "%s: response to no waiting request (id %r)", self.spec.name, message.get("id")
            )
            return
        if self.shared:
            answer = {**message, "id": pending.original_id}
            raw = restore(message.raw, pending.wire_id, pending.original_id)
            pending.future.set_result(
                WireMessage(answer, raw if raw is not None else dumps(answer))
            )
            return
        pending.future.set_result(message)

    async def _read_stderr(self) -> None:
        assert self._proc is not None
        assert self._proc.stderr is not None
        stderr = self._proc.stderr
        with contextlib.suppress(ValueError, ConnectionError):
            while line := await stderr.readline():
                text = line.decode(errors="replace").rstrip()[:_STDERR_LINE_MAX]
                log.info("%s[%s]: %s", self.spec.name, self.pid, text)

    async def _on_exit(self) -> None:
        self.exited.set()
        self._unsolicited_ready.set()
        lost: UpstreamLost = (
            UpstreamAnswerTooLarge(self.spec.name, self._max_line)
            if self._too_large
            else UpstreamLost(f"{self.spec.name}: the stdio process exited before answering")
        )
        for pending in list(self._pending.values()):
            if not pending.future.done():
                pending.future.set_exception(lost)
        if self._proc is not None:
            code = await self._proc.wait()
            log.info("%s: stdio process %s exited with %s", self.spec.name, self._proc.pid, code)

    async def next_unsolicited(self, timeout_s: float) -> bytes | None:
        """The next message for the GET stream (`None` after `timeout_s`, or once it ended)."""
        if not self._unsolicited and not self.exited.is_set():
            self._unsolicited_ready.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._unsolicited_ready.wait()
        return self._unsolicited.popleft() if self._unsolicited else None

    async def close(self, grace_s: float = 2.0) -> None:
        """End the process: close its stdin, then SIGTERM, then SIGKILL (each wait bounded)."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            if proc.stdin is not None:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    proc.stdin.close()
            for signal_step in (None, proc.terminate, proc.kill):
                if signal_step is not None:
                    with contextlib.suppress(ProcessLookupError):
                        signal_step()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace_s):
                        await proc.wait()
                        break
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
