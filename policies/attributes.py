"""Request attributes: who is calling, in which class, with which key and deadline.

Each attribute comes from an HTTP header or, for MCP, from `params._meta` under the `interlock/`
prefix (the `_meta` value wins: it travels with the JSON-RPC message itself).

Values are checked here, at the edge, before anything is admitted, sent or recorded: tenant, run
and class at most 128 characters, the idempotency key at most 255, all printable (no control or
separator characters, no lone surrogates — which is how bytes that are not UTF-8 arrive in a
header). A bad value is a `BadAttribute` naming the attribute (`tenant`, `run`, `class`,
`idempotency_key`, `deadline`), which the paths answer as 400 / -32602 `bad_<attribute>`: one bad
value can only fail its own call, never a batch of ledger writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.identity import key_tenant, mismatch_message
from policies.model import WORK_CLASSES, Config, WorkClass

__all__ = [
    "META_PREFIX",
    "BadAttribute",
    "RequestAttributes",
    "TenantMismatch",
    "read_attributes",
]

META_PREFIX = "interlock/"
DEFAULT_TENANT = "default"

# attribute -> (HTTP header, _meta key)
_SOURCES = {
    "tenant": ("x-interlock-tenant", "interlock/tenant"),
    "class": ("x-interlock-class", "interlock/class"),
    "run": ("x-interlock-run", "interlock/run"),
    "idempotency_key": ("idempotency-key", "interlock/idempotency-key"),
    "deadline": ("x-interlock-deadline-ms", "interlock/deadline-ms"),
}
_MAX_LENGTH = {"tenant": 128, "class": 128, "run": 128, "idempotency_key": 255, "deadline": 32}
_HEADERS = frozenset(header for header, _ in _SOURCES.values())
_META_KEYS = frozenset(meta_key for _, meta_key in _SOURCES.values())


class BadAttribute(ValueError):
    """A request attribute has a value the proxy cannot use; `name` is the attribute (`tenant`,
    `run`, `class`, `idempotency_key`, `deadline`) and the message says what is wrong.
    `reason` is what the caller is told (`bad_<name>`); `status` the HTTP status (400)."""

    status = 400

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name

    @property
    def reason(self) -> str:
        return f"bad_{self.name}"


class TenantMismatch(BadAttribute):
    """The caller names a tenant (header or `_meta`) other than the one its API key names."""

    status = 403

    def __init__(self, claimed: str) -> None:
        super().__init__("tenant", mismatch_message(claimed))

    @property
    def reason(self) -> str:
        return "tenant_mismatch"


@dataclass(frozen=True, slots=True)
class RequestAttributes:
    tenant: str
    work_class: WorkClass
    run_id: str | None
    idempotency_key: str | None
    deadline_s: float
    """Relative deadline of the whole call in seconds (queueing and retries included)."""


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _pick(name: str, headers: Mapping[str, str], meta: Mapping[str, Any]) -> str | None:
    header, meta_key = _SOURCES[name]
    value = meta.get(meta_key)
    if value is None:
        value = headers.get(header)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise BadAttribute(name, f"{meta_key} must be a string, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        return None
    source = meta_key if meta.get(meta_key) is not None else header
    limit = _MAX_LENGTH[name]
    if len(text) > limit:
        raise BadAttribute(name, f"{source} is longer than {limit} characters")
    if not text.isprintable():
        why = "holds a control, separator or undecodable character; use printable text"
        raise BadAttribute(name, f"{source} {why}")
    return text


def read_attributes(
    config: Config,
    headers: Mapping[str, str],
    meta: Mapping[str, Any] | None = None,
) -> RequestAttributes:
    """Read the request attributes from headers and `_meta`, applying the config's defaults.

    With `tenants.api_keys` the tenant is the one the caller's key names; a tenant named in the
    header or `_meta` must be that one. A deadline longer than the configured one is cut to it.

    Raises:
        BadAttribute: a value is malformed (too long, unprintable, unknown class, a deadline
            that is no positive finite number); `TenantMismatch` for another tenant's name.
        CallerRefused: API keys are configured and the caller's key is missing or unknown.
    """
    meta = meta or {}
    if (
        not config.tenant_api_keys
        and _META_KEYS.isdisjoint(meta)
        and _HEADERS.isdisjoint(map(str.lower, headers))
    ):
        return _defaults(config)  # most calls name none: they all get the same values
    return _read(config, _lower(headers), meta)


_last_defaults: tuple[Config, RequestAttributes] | None = None


def _defaults(config: Config) -> RequestAttributes:
    """What a call that names no attribute gets under `config` (read once per configuration)."""
    global _last_defaults
    last = _last_defaults
    if last is None or last[0] is not config:
        last = _last_defaults = (config, _read(config, {}, {}))
    return last[1]


def _read(config: Config, hdrs: Mapping[str, str], meta: Mapping[str, Any]) -> RequestAttributes:
    claimed = _pick("tenant", hdrs, meta)
    keyed = key_tenant(config, hdrs) if config.tenant_api_keys else None
    if keyed is not None and claimed is not None and claimed != keyed:
        raise TenantMismatch(claimed)
    tenant = keyed or claimed or DEFAULT_TENANT
    work_class = _pick("class", hdrs, meta) or config.defaults.work_class
    if work_class not in WORK_CLASSES:
        raise BadAttribute(
            "class",
            f"unknown work class {work_class!r}; expected one of {', '.join(WORK_CLASSES)}",
        )
    key = _pick("idempotency_key", hdrs, meta)
    run_id = _pick("run", hdrs, meta)
    deadline_s = config.defaults.deadline_s
    raw_deadline = _pick("deadline", hdrs, meta)
    if raw_deadline is not None:
        try:
            deadline_ms = float(raw_deadline)
        except ValueError:
            raise BadAttribute(
                "deadline", f"deadline must be a number of milliseconds, got {raw_deadline!r}"
            ) from None
        if not (deadline_ms > 0 and math.isfinite(deadline_ms)):
            raise BadAttribute("deadline", "deadline must be a positive number of ms")
        deadline_s = min(deadline_ms / 1000.0, config.defaults.deadline_s)
    return RequestAttributes(
        tenant=tenant,
        work_class=work_class,
        run_id=run_id,
        idempotency_key=key,
        deadline_s=deadline_s,
    )
