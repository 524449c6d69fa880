"""The effective configuration as frozen plain values.

`policies.config` validates the YAML file with pydantic and turns it into these values; the rest of
the code sees only these. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "WORK_CLASSES",
    "AdminSettings",
    "BudgetSettings",
    "ClassBand",
    "Config",
    "Defaults",
    "DeferredSettings",
    "EdgeSettings",
    "KeyRecipe",
    "LedgerSettings",
    "Limits",
    "Mode",
    "ProviderKind",
    "RejectAs",
    "RetrySettings",
    "TelemetrySettings",
    "ToolRule",
    "UpstreamKind",
    "UpstreamSpec",
    "WorkClass",
]

WorkClass = Literal["critical", "interactive", "background", "bulk"]
WORK_CLASSES: tuple[WorkClass, ...] = ("critical", "interactive", "background", "bulk")
Mode = Literal["enforce", "observe"]
RejectAs = Literal["error", "tool_error"]
UpstreamKind = Literal["mcp_http", "mcp_stdio", "http"]
ProviderKind = Literal["openai", "anthropic", "generic"]
KeyMode = Literal["explicit", "derived", "none", "fields"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits of one scope: capacity (running, pending, wait) and rate. `None` means unbounded."""

    max_running: int | None = None
    max_pending: int | None = None
    max_wait_s: float | None = None
    rate_per_s: float | None = None
    """How many calls may start per second (token bucket); None = no rate limit."""
    burst: int | None = None
    """Calls that may start at once after a quiet spell (default: ceil(rate_per_s), at least 1)."""


@dataclass(frozen=True, slots=True)
class ClassBand:
    """A priority band: its reserved share of capacity and how long its calls may queue."""

    name: WorkClass
    share: float
    max_wait_s: float
    defer: bool = False
    """A call of this band that cannot start now becomes deferred work (a task handle) when its
    caller can take one (an MCP client that declared task support)."""


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    url: str = "sqlite:///interlock.db"
    durability: Literal["full", "normal"] = "full"
    lease_s: float = 30.0
    retention_h: float = 24.0
    max_outcome_bytes: int = 65536
    max_argument_bytes: int = 8192
    group_commit: bool = True
    commit_delay_ms: float = 0.0
    """How long a write may wait for the writes of the other side-effecting calls in flight, so
    that they share one durable commit (0: never). A write waits only while another call is in
    flight, and no longer than until every call in flight has queued its write."""
    sweep_interval_s: float = 5.0


@dataclass(frozen=True, slots=True)
class DeferredSettings:
    """Deferred work: calls accepted now and run later (tasks, `/jobs`)."""

    max_request_bytes: int = 262144
    """A request to defer larger than this is refused (413 / -32600), never run live instead."""
    max_result_bytes: int = 1048576
    """A deferred call's result is kept up to this; beyond it only its sha256 (the poller is
    then told `outcome_not_retained`)."""
    max_accepted_per_tenant: int = 1000
    max_accepted_per_upstream: int = 10000
    """Deferred work waiting to start, at most, per tenant and per upstream (beyond: refused with
    `retry_after_s`)."""
    poll_interval_s: float = 1.0
    """The polling interval suggested to callers, and how often the dispatcher looks for
    waiting work accepted elsewhere (another replica, or before a restart)."""
    max_attempts: int = 5
    """Attempts of a deferred call that certainly did not run (429, not reached) before it is
    given up (rejected)."""


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    service_name: str = "interlock"
    otlp_endpoint: str | None = None
    enabled: bool = True
    max_queue_size: int = 2048
    export_timeout_s: float = 5.0
    sample_ratio: float = 1.0
    """The share of new traces recorded (head sampling); a caller's own decision is kept."""
    metrics_token_env: str = "INTERLOCK_METRICS_TOKEN"
    """When this environment variable is set, `/metrics` needs `Authorization: Bearer <it>`."""


@dataclass(frozen=True, slots=True)
class AdminSettings:
    token_env: str = "INTERLOCK_ADMIN_TOKEN"


@dataclass(frozen=True, slots=True)
class EdgeSettings:
    """What the edge accepts and how long it waits for slow clients (DESIGN "Edges")."""

    allowed_origins: tuple[str, ...] = ()
    """Browser origins allowed on /mcp, /http, /admin (lower case, no trailing slash)."""
    allowed_hosts: tuple[str, ...] = ()
    """Host values besides the listen address and loopback (`name` or `name:port`; `*` = any)."""
    max_batch: int = 64
    """JSON-RPC batch elements at most."""
    max_connections: int = 1024
    """Client connections open at once; beyond it a new connection gets 503 and is closed."""
    header_timeout_s: float = 10.0
    """A connection must send a complete request head within this (also the keep-alive idle)."""
    body_timeout_s: float = 30.0
    """A request body must arrive within this once its head is in."""


@dataclass(frozen=True, slots=True)
class Defaults:
    work_class: WorkClass = "interactive"
    timeout_s: float = 30.0
    deadline_s: float = 60.0
    dedup_window_s: float = 300.0
    """How long a derived key recognises a repeat as a retry (explicit keys: `retention_h`)."""


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """Retry policy of one upstream."""

    max_attempts: int = 3
    budget_ratio: float = 0.2
    budget_min_retries: int = 3
    budget_window_s: float = 10.0
    base_delay_s: float = 0.25
    max_delay_s: float = 30.0


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """A cost budget: tokens per tenant per window (0 or None tokens = no budget)."""

    tokens: int | None = None
    window_s: float = 60.0


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """One configured upstream. Exactly one of `url` (mcp_http, http) or `command` (mcp_stdio)."""

    name: str
    kind: UpstreamKind
    url: str | None = None
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = Limits()
    timeout_s: float | None = None
    retry: RetrySettings = RetrySettings()
    max_sessions: int = 32
    max_connections: int = 64
    """HTTP transports: connections to the upstream at once (every request holds one)."""
    """stdio upstreams: live handshake-era sessions (one process each) at most."""
    session_idle_s: float = 300.0
    """stdio upstreams: a session's process with nothing in flight this long is ended."""
    provider: ProviderKind = "generic"
    """The config key `kind`: which model API an HTTP upstream speaks. Only `openai` and
    `anthropic` upstreams have inference endpoints (and 503/529 that prove "not executed")."""
    not_executed_statuses: frozenset[int] = frozenset()
    allowed_methods: frozenset[str] = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
    """HTTP upstreams: the methods forwarded (others are 405 at the proxy)."""
    """Statuses by which this upstream says a request was not executed, besides 429 (and the
    providers' 503/529)."""

    @property
    def is_mcp(self) -> bool:
        return self.kind != "http"


@dataclass(frozen=True, slots=True)
class KeyRecipe:
    """How a call's idempotency key is made when the caller gives none.

    `explicit`: only the caller's key (none given → no dedupe); `derived`: hash of all arguments;
    `fields`: hash of the named argument fields only; `none`: no key, the call is still recorded.
    `window_s`: how long a derived (or fields) key dedupes; None = `defaults.dedup_window_s`.
    """

    mode: KeyMode = "derived"
    fields: tuple[str, ...] = ()
    window_s: float | None = None


@dataclass(frozen=True, slots=True)
class ToolRule:
    """A policy rule; the first whose glob matches wins.

    `match` is a glob on "upstream/tool" for MCP, or "METHOD /path" (optionally
    "upstream:METHOD /path") for HTTP upstreams. `None` fields defer to the next source
    (tool annotations, then the built-in defaults).
    """

    match: str
    index: int
    side_effect: bool | None = None
    key: KeyRecipe | None = None
    cost_class: str | None = None
    retry_budget: int | None = None
    reject_as: RejectAs = "error"
    timeout_s: float | None = None
    work_class: WorkClass | None = None
    redact: tuple[str, ...] = ()
    """Argument fields (dotted paths, e.g. `card.number`) the ledger keeps only as a sha256."""


@dataclass(frozen=True, slots=True)
class Config:
    """The whole effective configuration."""

    upstreams: Mapping[str, UpstreamSpec]
    listen: str = "127.0.0.1:8787"
    mode: Mode = "enforce"
    admin: AdminSettings = AdminSettings()
    ledger: LedgerSettings = LedgerSettings()
    deferred: DeferredSettings = DeferredSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    defaults: Defaults = Defaults()
    classes: Mapping[WorkClass, ClassBand] = field(default_factory=dict)
    limits: Mapping[str, Limits] = field(default_factory=dict)
    cost_classes: Mapping[str, Limits] = field(default_factory=dict)
    tools: tuple[ToolRule, ...] = ()
    budgets: BudgetSettings = BudgetSettings()
    tenant_api_keys: Mapping[str, str] = field(default_factory=dict)
    edge: EdgeSettings = EdgeSettings()
    max_body_bytes: int = 4 * 1024 * 1024
    max_response_bytes: int = 16 * 1024 * 1024
    """The largest MCP answer the proxy holds to answer a call (larger: a clear error)."""
    retry_after_cap_s: float = 300.0
    shutdown_grace_s: float = 10.0
    source_path: str | None = None

    @property
    def listen_host(self) -> str:
        host, _, _port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1"

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def scope_limits(self, scope: str) -> Limits:
        """Limits of a generic scope name ("global", "tenant", "run"); unbounded if absent."""
        return self.limits.get(scope, Limits())
