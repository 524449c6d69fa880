"""The connections to Streamable HTTP upstreams: one pool per upstream (`HttpUpstreams`), one
request on it (`send`), and the client's errors named after the upstream (`named_errors`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from yarl import URL

from policies.model import UpstreamSpec
from proxy.errors import UpstreamLost, UpstreamNotReached
from proxy.runtime.http1 import Pool, Response

__all__ = ["HttpUpstreams", "named_errors", "send"]

_POOL_WAIT_S = 30.0  # the longest a request waits for a free connection to its upstream
_CONNECT_S = 10.0


class HttpUpstreams:
    """The pools of kept-alive connections, one per Streamable HTTP upstream, opened on first
    use. Every caller shares them; nothing is kept between requests but the connections (no
    cookie jar: a cookie one caller's answer set must never ride on another caller's request)."""

    def __init__(self) -> None:
        self._pools: dict[str, Pool] = {}

    def pool(self, spec: UpstreamSpec) -> Pool:
        pool = self._pools.get(spec.name)
        if pool is None:
            assert spec.url is not None
            pool = self._pools[spec.name] = Pool(URL(spec.url), limit=spec.max_connections)
        return pool

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()


class named_errors:
    """Put the upstream's name in front of the client's `UpstreamNotReached` / `UpstreamLost`
    (the messages reach callers and logs, and the proxy may front many upstreams).

    A plain class, not a generator-based context manager: it wraps every upstream exchange,
    several times each, and a generator costs a few microseconds to enter and leave.
    """

    __slots__ = ("_name",)

    def __init__(self, spec: UpstreamSpec) -> None:
        self._name = spec.name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or str(exc).startswith(f"{self._name}: "):
            return
        if type(exc) is UpstreamNotReached:
            raise UpstreamNotReached(f"{self._name}: cannot connect ({exc})") from exc
        if type(exc) is UpstreamLost:  # not its subclasses (a timeout, a too large answer)
            raise UpstreamLost(f"{self._name}: {exc}") from exc


async def send(
    pool: Pool,
    spec: UpstreamSpec,
    method: str,
    headers: Mapping[str, str],
    body: bytes | None = None,
) -> Response:
    """One request to the upstream's URL; the answer's head is in, its body is the caller's to
    read and `release()`. No read timeout here: SSE streams live as long as their call, and each
    exchange bounds itself.

    Raises:
        UpstreamNotReached: nothing was sent.
        UpstreamLost: sent, and the connection broke before an answer's head.
    """
    with named_errors(spec):
        return await pool.request(
            method,
            pool.base,
            headers.items(),
            body,
            connect_s=_CONNECT_S,
            wait_s=spec.timeout_s or _POOL_WAIT_S,
            read_s=None,
        )
