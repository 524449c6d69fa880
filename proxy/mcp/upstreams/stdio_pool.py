"""All stdio processes of the proxy: one per handshake-era session, one shared per upstream.

`StdioUpstreams` spawns them (`spawn_session_process`, `shared_process`), mints session ids for
processes whose `initialize` succeeded, finds a session's live process, ends a session on DELETE,
reaps processes idle (no call in flight, no GET stream open) for their upstream's
`session_idle_s` or found dead, and ends them all on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

from policies.model import UpstreamSpec
from proxy.mcp.upstreams.stdio import StdioProcess

__all__ = ["SessionCapReached", "StdioUpstreams", "default_max_line_bytes"]

log = logging.getLogger("interlock.mcp.stdio")


class SessionCapReached(Exception):
    """The upstream already has `max_sessions` live stdio sessions (one process each)."""


class StdioUpstreams:
    """All stdio processes of the proxy: per-session ones and one shared (modern) per upstream."""

    def __init__(
        self, *, idle_s: float | None = None, max_line_bytes: int = 16 * 1024 * 1024
    ) -> None:
        self.idle_s = idle_s
        """Overrides every upstream's `session_idle_s` when set."""
        self._max_line = max_line_bytes
        self._sessions: dict[str, StdioProcess] = {}
        self._shared: dict[str, StdioProcess] = {}
        self._shared_lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._spawned: dict[str, set[StdioProcess]] = {}
        """Session processes per upstream from spawn until they exit (what `max_sessions` caps:
        a process answering its `initialize`, or being closed, still counts)."""

    async def spawn_session_process(self, spec: UpstreamSpec) -> StdioProcess:
        """A new process for a handshake-era session (register it once `initialize` succeeded).

        Raises:
            SessionCapReached: `spec.max_sessions` sessions are live (or starting) already.
            UpstreamNotReached: the process could not be started.
        """
        spawned = self._spawned.setdefault(spec.name, set())
        spawned.difference_update([p for p in spawned if p.ended])
        if len(spawned) >= spec.max_sessions:
            raise SessionCapReached(f"{spec.name}: {spec.max_sessions} stdio sessions are live")
        process = StdioProcess(spec, shared=False, max_line_bytes=self._max_line)
        spawned.add(process)
        try:
            await process.start()
        except BaseException:
            spawned.discard(process)
            raise
        return process

    def register_session(self, process: StdioProcess) -> str:
        """Mint the session id of a process whose `initialize` succeeded."""
        session_id = secrets.token_hex(16)
        process.session_id = session_id
        self._sessions[session_id] = process
        self._ensure_reaper()
        return session_id

    def session(self, spec: UpstreamSpec, session_id: str) -> StdioProcess | None:
        """The live process of a session of `spec` (`None`: unknown, ended, other upstream's)."""
        process = self._sessions.get(session_id)
        if process is None or process.spec.name != spec.name:
            return None
        if not process.alive:
            self._sessions.pop(session_id, None)
            return None
        process.last_active = time.monotonic()
        return process

    async def shared_process(self, spec: UpstreamSpec) -> StdioProcess:
        """The modern-era process of `spec`, (re)started when needed.

        Raises:
            UpstreamNotReached: it could not be started.
        """
        async with self._shared_lock:
            process = self._shared.get(spec.name)
            if process is None or not process.alive:
                process = StdioProcess(spec, shared=True, max_line_bytes=self._max_line)
                await process.start()
                self._shared[spec.name] = process
                self._ensure_reaper()
            process.last_active = time.monotonic()
            return process

    async def end_session(self, session_id: str) -> bool:
        """End a session's process (DELETE); False if there was no such session."""
        process = self._sessions.pop(session_id, None)
        if process is None:
            return False
        await process.close()
        return True

    def processes(self) -> list[StdioProcess]:
        return [*self._sessions.values(), *self._shared.values()]

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_idle(), name="stdio-reaper")

    def _idle_s(self, process: StdioProcess) -> float:
        return self.idle_s if self.idle_s is not None else process.spec.session_idle_s

    async def _reap_idle(self) -> None:
        while self._sessions or self._shared:
            shortest = min(map(self._idle_s, self.processes()), default=1.0)
            await asyncio.sleep(min(max(shortest / 4, 0.05), 5.0))
            now = time.monotonic()
            for table in (self._sessions, self._shared):
                for key, process in list(table.items()):
                    dead = not process.alive
                    idle = not process.busy and now - process.last_active > self._idle_s(process)
                    if dead or idle:
                        del table[key]
                        if idle:
                            log.info(
                                "%s: ending idle stdio process %s", process.spec.name, process.pid
                            )
                        task = asyncio.create_task(process.close())
                        self._closing.add(task)
                        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Shutdown: end every process."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        processes = self.processes()
        self._sessions.clear()
        self._shared.clear()
        await asyncio.gather(*(p.close() for p in processes), *self._closing)


def default_max_line_bytes(max_body_bytes: int, max_response_bytes: int = 16 * 1024 * 1024) -> int:
    """The longest line a stdio process may write: its largest answer (`max_response_bytes`), or
    a request of the client's that it echoes, whichever is larger."""
    return max(max_response_bytes, max_body_bytes) + 64 * 1024
