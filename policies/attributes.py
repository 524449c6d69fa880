"""Request attributes: who is calling, in which class, with which key and deadline.

Each attribute comes from an HTTP header or, for MCP, from `params._meta` under the `interlock/`
prefix (the `_meta` value wins: it travels with the JSON-RPC message itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.model import WORK_CLASSES, Config, WorkClass

__all__ = [
    "META_PREFIX",
    "BadAttribute",
    "RequestAttributes",
    "read_attributes",
]

META_PREFIX = "interlock/"
DEFAULT_TENANT = "default"

# attribute -> (HTTP header, _meta key)
_SOURCES = {
    "tenant": ("x-interlock-tenant", "interlock/tenant"),
    "work_class": ("x-interlock-class", "interlock/class"),
    "run_id": ("x-interlock-run", "interlock/run"),
    "idempotency_key": ("idempotency-key", "interlock/idempotency-key"),
    "deadline_ms": ("x-interlock-deadline-ms", "interlock/deadline-ms"),
}
_MAX_KEY_LENGTH = 255


class BadAttribute(ValueError):
    """A request attribute has a value the proxy cannot use; the message names it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


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
    return text or None


def _tenant_from_api_key(headers: Mapping[str, str], config: Config) -> str | None:
    if not config.tenant_api_keys:
        return None
    auth = headers.get("authorization", "")
    token = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key")
    return config.tenant_api_keys.get(token) if token else None


def read_attributes(
    config: Config,
    headers: Mapping[str, str],
    meta: Mapping[str, Any] | None = None,
) -> RequestAttributes:
    """Read the request attributes from headers and `_meta`, applying the config's defaults.

    Raises:
        BadAttribute: a value is malformed (unknown class, non-numeric deadline, overlong key).
    """
    hdrs = _lower(headers)
    meta = meta or {}
    tenant = _pick("tenant", hdrs, meta) or _tenant_from_api_key(hdrs, config) or DEFAULT_TENANT
    work_class = _pick("work_class", hdrs, meta) or config.defaults.work_class
    if work_class not in WORK_CLASSES:
        raise BadAttribute(
            "work_class",
            f"unknown work class {work_class!r}; expected one of {', '.join(WORK_CLASSES)}",
        )
    key = _pick("idempotency_key", hdrs, meta)
    if key is not None and len(key) > _MAX_KEY_LENGTH:
        raise BadAttribute(
            "idempotency_key", f"idempotency key longer than {_MAX_KEY_LENGTH} characters"
        )
    deadline_s = config.defaults.deadline_s
    raw_deadline = _pick("deadline_ms", hdrs, meta)
    if raw_deadline is not None:
        try:
            deadline_ms = float(raw_deadline)
        except ValueError:
            raise BadAttribute(
                "deadline_ms", f"deadline must be a number of milliseconds, got {raw_deadline!r}"
            ) from None
        if not deadline_ms > 0:
            raise BadAttribute("deadline_ms", "deadline must be a positive number of ms")
        deadline_s = deadline_ms / 1000.0
    return RequestAttributes(
        tenant=tenant,
        work_class=work_class,
        run_id=_pick("run_id", hdrs, meta),
        idempotency_key=key,
        deadline_s=deadline_s,
    )
