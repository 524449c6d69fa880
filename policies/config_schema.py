"""The YAML configuration's schema, as pydantic models: the file boundary only.

Every model forbids unknown keys so a typo is an error, not a silently ignored setting. Cross-field
rules (shares summing to 1, cost classes that exist, …) are checked in `policies.config`, where the
error can name the exact key and line.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ConfigIn"]

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
WorkClassName = Literal["critical", "interactive", "background", "bulk"]
HttpStatus = Annotated[int, Field(ge=400, le=599, strict=True)]
HttpMethod = Annotated[str, Field(pattern=r"^[A-Za-z]+$", min_length=1, max_length=16)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class LimitsIn(_Strict):
    max_running: PositiveInt | None = None
    max_pending: NonNegativeInt | None = None
    max_wait_s: NonNegativeFloat | None = None
    rate_per_s: PositiveFloat | None = None
    burst: PositiveInt | None = None


class ClassIn(_Strict):
    share: Fraction
    max_wait_s: NonNegativeFloat = 0.0
    defer: bool | None = None
    """None: on for bulk, off for the other bands."""


class DeferredIn(_Strict):
    max_request_bytes: PositiveInt = 262144
    max_result_bytes: PositiveInt = 1048576
    max_accepted_per_tenant: PositiveInt = 1000
    max_accepted_per_upstream: PositiveInt = 10000
    poll_interval_s: PositiveFloat = 1.0
    max_attempts: PositiveInt = 5


class AdminIn(_Strict):
    token_env: str = "INTERLOCK_ADMIN_TOKEN"


class LedgerIn(_Strict):
    url: str = "sqlite:///interlock.db"
    durability: Literal["full", "normal"] = "full"
    lease_s: PositiveFloat = 30.0
    retention_h: PositiveFloat = 24.0
    max_outcome_bytes: PositiveInt = 65536
    max_argument_bytes: PositiveInt = 8192
    group_commit: bool = True
    commit_delay_ms: Annotated[float, Field(ge=0, le=1000)] = 0.0
    sweep_interval_s: PositiveFloat = 5.0


class TelemetryIn(_Strict):
    service_name: str = "interlock"
    otlp_endpoint: str | None = None
    enabled: bool = True
    max_queue_size: PositiveInt = 2048
    export_timeout_s: PositiveFloat = 5.0
    sample_ratio: Fraction = 1.0
    metrics_token_env: str = "INTERLOCK_METRICS_TOKEN"


class DefaultsIn(_Strict):
    work_class: WorkClassName = Field("interactive", alias="class")
    timeout_s: PositiveFloat = 30.0
    deadline_s: PositiveFloat = 60.0
    dedup_window_s: NonNegativeFloat = 300.0


class RetryIn(_Strict):
    max_attempts: PositiveInt = 3
    budget_ratio: Fraction = 0.2
    budget_min_retries: NonNegativeInt = 3
    budget_window_s: PositiveFloat = 10.0
    base_delay_s: PositiveFloat = 0.25
    max_delay_s: PositiveFloat = 30.0


class UpstreamIn(_Strict):
    mcp: str | None = None
    http: str | None = None
    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    limits: LimitsIn = LimitsIn()
    timeout_s: PositiveFloat | None = None
    retry: RetryIn = RetryIn()
    max_sessions: PositiveInt = 32
    max_connections: PositiveInt = 64
    session_idle_s: PositiveFloat = 300.0
    kind: Literal["openai", "anthropic", "generic"] = "generic"
    not_executed_statuses: list[HttpStatus] = Field(default_factory=list)
    allowed_methods: list[HttpMethod] = Field(
        default_factory=lambda: ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    )


class KeyRecipeIn(_Strict):
    """`key: {fields: [...], window_s: N}`: a derived key, from the named fields if given."""

    fields: Annotated[list[str], Field(min_length=1)] | None = None
    window_s: NonNegativeFloat | None = None


class ToolRuleIn(_Strict):
    match: Annotated[str, Field(min_length=1)]
    side_effect: bool | None = None
    key: Literal["explicit", "derived", "none"] | KeyRecipeIn | None = None
    cost_class: str | None = None
    retry_budget: NonNegativeInt | None = None
    reject_as: Literal["error", "tool_error"] = "error"
    timeout_s: PositiveFloat | None = None
    work_class: WorkClassName | None = Field(None, alias="class")
    redact: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)


class BudgetsIn(_Strict):
    tokens: PositiveInt | None = None
    window_s: PositiveFloat = 60.0


class TenantsIn(_Strict):
    api_keys: dict[str, str] = Field(default_factory=dict)
    """API key (as sent in `Authorization: Bearer` or `x-api-key`) → tenant name."""


class ConfigIn(_Strict):
    listen: str = "127.0.0.1:8787"
    mode: Literal["enforce", "observe"] = "enforce"
    admin: AdminIn = AdminIn()
    ledger: LedgerIn = LedgerIn()
    deferred: DeferredIn = DeferredIn()
    telemetry: TelemetryIn = TelemetryIn()
    defaults: DefaultsIn = Field(default_factory=lambda: DefaultsIn.model_validate({}))
    classes: dict[WorkClassName, ClassIn] = Field(default_factory=dict)
    limits: dict[Literal["global", "tenant", "run"], LimitsIn] = Field(default_factory=dict)
    cost_classes: dict[str, LimitsIn] = Field(default_factory=dict)
    upstreams: dict[str, UpstreamIn]
    tools: list[ToolRuleIn] = Field(default_factory=list)
    budgets: BudgetsIn = BudgetsIn()
    tenants: TenantsIn = TenantsIn()
    max_body_bytes: PositiveInt = 4 * 1024 * 1024
    max_response_bytes: PositiveInt = 16 * 1024 * 1024
    retry_after_cap_s: PositiveFloat = 300.0
    shutdown_grace_s: NonNegativeFloat = 10.0
    allowed_origins: list[str] = Field(default_factory=list)
    allowed_hosts: list[str] = Field(default_factory=list)
    max_batch: PositiveInt = 64
    max_connections: PositiveInt = 1024
    client_header_timeout_s: PositiveFloat = 10.0
    client_body_timeout_s: PositiveFloat = 30.0
