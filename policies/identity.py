"""Who the caller is, when the configuration says so (`tenants.api_keys`).

Without API keys the tenant is what the caller says (a sidecar owned by one agent). With them the
caller's key alone decides: its `Authorization: Bearer …` or `x-api-key` must name a configured
key (else 401), and a tenant the caller names itself (header or `_meta`) must be the key's
(else 403 `tenant_mismatch`). Pure: callers pass the lower-cased headers.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.model import Config

__all__ = ["CallerRefused", "api_key", "key_tenant"]


class CallerRefused(ValueError):
    """The caller may not be served as it presents itself: `status` 401 or 403, `reason`
    `missing_api_key`, `unknown_api_key` or `tenant_mismatch`."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def api_key(headers: Mapping[str, str]) -> str | None:
    """The caller's key: `Authorization: Bearer <key>`, else `x-api-key` (headers lower-cased)."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    key = headers.get("x-api-key", "").strip()
    return key or None


def key_tenant(config: Config, headers: Mapping[str, str]) -> str | None:
    """The tenant the caller's key names, or None when no API keys are configured.

    Raises:
        CallerRefused: API keys are configured and the caller sent none (401), one nobody
            configured (401), or an `X-Interlock-Tenant` other than its key's (403).
    """
    if not config.tenant_api_keys:
        return None
    key = api_key(headers)
    if key is None:
        raise CallerRefused(
            401, "missing_api_key", "An API key is required (Authorization: Bearer)."
        )
    tenant = config.tenant_api_keys.get(key)
    if tenant is None:
        raise CallerRefused(401, "unknown_api_key", "The API key is not known to this proxy.")
    claimed = headers.get("x-interlock-tenant", "").strip()
    if claimed and claimed != tenant:
        raise CallerRefused(403, "tenant_mismatch", mismatch_message(claimed))
    return tenant


def mismatch_message(claimed: str) -> str:
    return f"The tenant {claimed[:128]!r} is not the one the caller's API key names."
