"""What the caller is told when Interlock answers instead of the upstream.

One `Answer` value per situation of DESIGN.md's "Answers the caller gets" table, and three
renderings: a JSON-RPC error, an `isError` tool result (`reject_as: tool_error`), and an HTTP
error with the OpenAI-style envelope. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CODE_INVALID_PARAMS",
    "CODE_INVALID_REQUEST",
    "CODE_IN_PROGRESS",
    "CODE_LEDGER_UNAVAILABLE",
    "CODE_MISSING_CAPABILITY",
    "CODE_NEEDS_RECONCILIATION",
    "CODE_OUTCOME_NOT_RETAINED",
    "CODE_OUTCOME_UNKNOWN",
    "CODE_PARSE_ERROR",
    "CODE_REFUSED",
    "CODE_UPSTREAM_FAILED",
    "Answer",
    "bad_request",
    "in_progress",
    "key_mismatch",
    "ledger_unavailable",
    "needs_reconciliation",
    "outcome_not_retained",
    "outcome_unknown",
    "refused",
    "task_ended_unrun",
    "task_not_cancellable",
    "task_not_found",
    "tasks_not_declared",
    "too_large_to_defer",
    "upstream_failed",
]

CODE_REFUSED = -32050
CODE_IN_PROGRESS = -32051
CODE_NEEDS_RECONCILIATION = -32052
CODE_OUTCOME_UNKNOWN = -32053
CODE_LEDGER_UNAVAILABLE = -32054
CODE_UPSTREAM_FAILED = -32055
CODE_OUTCOME_NOT_RETAINED = -32056
CODE_MISSING_CAPABILITY = -32021
CODE_INVALID_PARAMS = -32602
CODE_INVALID_REQUEST = -32600
CODE_PARSE_ERROR = -32700

_ERROR_TYPES = {
    CODE_REFUSED: "rate_limit_error",
    CODE_IN_PROGRESS: "conflict_error",
    CODE_NEEDS_RECONCILIATION: "conflict_error",
    CODE_OUTCOME_UNKNOWN: "outcome_unknown_error",
    CODE_LEDGER_UNAVAILABLE: "service_unavailable_error",
    CODE_UPSTREAM_FAILED: "upstream_error",
    CODE_OUTCOME_NOT_RETAINED: "conflict_error",
    CODE_INVALID_PARAMS: "invalid_request_error",
    CODE_MISSING_CAPABILITY: "invalid_request_error",
    CODE_INVALID_REQUEST: "invalid_request_error",
    CODE_PARSE_ERROR: "invalid_request_error",
}


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer of the proxy's own: code, HTTP status, one-sentence message and the data object."""

    code: int
    http_status: int
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def retry_after_header(self) -> str | None:
        """`Retry-After` in whole seconds (rounded up, at least 1), if the answer carries one."""
        value = self.data.get("retry_after_s")
        if value is None:
            return None
        return str(max(1, math.ceil(float(value))))

    def jsonrpc_error(self, request_id: Any) -> dict[str, Any]:
        """The JSON-RPC error response message for request `request_id`."""
        return {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": self.code, "message": self.message, "data": dict(self.data)},
        }

    def tool_error_result(self, *, modern: bool) -> dict[str, Any]:
        """The same answer as an `isError` tool result, for LLM-facing setups."""
        result: dict[str, Any] = {
            "content": [{"type": "text", "text": self.message}],
            "structuredContent": {"code": self.code, **self.data},
            "isError": True,
        }
        if modern:
            result["resultType"] = "complete"
        return result

    def http_body(self) -> dict[str, Any]:
        """The OpenAI-style error envelope for HTTP callers."""
        return {
            "error": {
                "type": _ERROR_TYPES.get(self.code, "interlock_error"),
                "message": self.message,
                "code": self.code,
                **self.data,
            }
        }


def _data(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def refused(
    reason: str,
    scope: str,
    retry_after_s: float,
    *,
    idempotency_key: str | None = None,
    upstream_down: bool = False,
    entry_id: str | None = None,
) -> Answer:
    """Refused by admission (overloaded, paused, cooldown, budget, deadline, shutting_down)."""
    status = 503 if upstream_down or reason in {"shutting_down"} else 429
    return Answer(
        code=CODE_REFUSED,
        http_status=status,
        message=f"Refused by Interlock ({reason} at {scope}); retry after {retry_after_s:.1f} s.",
        data=_data(
            reason=reason,
            scope=scope,
            retry_after_s=max(round(retry_after_s, 3), 0.001),  # never 0: that invites a hot loop
            idempotency_key=idempotency_key,
            entry_id=entry_id,
        ),
    )


def in_progress(idempotency_key: str | None, entry_id: str, state: str) -> Answer:
    return Answer(
        code=CODE_IN_PROGRESS,
        http_status=409,
        message="A call with this idempotency key is already in progress; it was not sent again.",
        data=_data(
            reason="in_progress", idempotency_key=idempotency_key, state=state, entry_id=entry_id
        ),
    )


def needs_reconciliation(idempotency_key: str | None, entry_id: str, state: str) -> Answer:
    return Answer(
        code=CODE_NEEDS_RECONCILIATION,
        http_status=409,
        message=(
            f"The call with this idempotency key is {state}: it needs reconciliation "
            "(interlock ledger resolve) before it can be sent again."
        ),
        data=_data(
            reason="needs_reconciliation",
            idempotency_key=idempotency_key,
            state=state,
            entry_id=entry_id,
        ),
    )


def outcome_unknown(idempotency_key: str | None, entry_id: str | None, detail: str) -> Answer:
    return Answer(
        code=CODE_OUTCOME_UNKNOWN,
        http_status=504,
        message=(
            f"The call was sent but its outcome is unknown ({detail}); it will not be re-sent "
            "until it is reconciled."
        ),
        data=_data(
            reason="outcome_unknown",
            idempotency_key=idempotency_key,
            state="unknown",
            entry_id=entry_id,
            detail=detail,
        ),
    )


def outcome_not_retained(idempotency_key: str | None, entry_id: str, state: str) -> Answer:
    """A finished entry whose outcome was not kept (too large, or resolved by an operator): the
    caller learns the state, never a success it could take for the answer."""
    return Answer(
        code=CODE_OUTCOME_NOT_RETAINED,
        http_status=409,
        message=(
            f"The call with this idempotency key is {state}, but its outcome was not kept, so it "
            "cannot be replayed; it was not sent again."
        ),
        data=_data(
            reason="outcome_not_retained",
            idempotency_key=idempotency_key,
            state=state,
            entry_id=entry_id,
        ),
    )


def ledger_unavailable(detail: str, idempotency_key: str | None = None) -> Answer:
    return Answer(
        code=CODE_LEDGER_UNAVAILABLE,
        http_status=503,
        message=(
            "The side-effect ledger cannot be written, so this side-effecting call was refused "
            "(fail closed)."
        ),
        data=_data(
            reason="ledger_unavailable",
            idempotency_key=idempotency_key,
            detail=detail,
            retry_after_s=5.0,
        ),
    )


def key_mismatch(idempotency_key: str | None, entry_id: str | None = None) -> Answer:
    return Answer(
        code=CODE_INVALID_PARAMS,
        http_status=422,
        message=(
            "This idempotency key was used before for another operation or with other "
            "arguments; nothing was sent."
        ),
        data=_data(
            reason="idempotency_key_mismatch", idempotency_key=idempotency_key, entry_id=entry_id
        ),
    )


def bad_request(code: int, reason: str, message: str, *, http_status: int = 400) -> Answer:
    """Malformed input: parse error, invalid request, oversized body, unknown upstream."""
    return Answer(code=code, http_status=http_status, message=message, data={"reason": reason})


def upstream_failed(reason: str, detail: str, *, retry_after_s: float | None = None) -> Answer:
    """A read-only (safe to repeat) call whose upstream failed after the retries policy allowed."""
    return Answer(
        code=CODE_UPSTREAM_FAILED,
        http_status=502,
        message=f"The upstream failed ({detail}); the call is safe to repeat.",
        data=_data(reason=reason, detail=detail, retry_after_s=retry_after_s),
    )


def too_large_to_defer(size: int, cap: int) -> Answer:
    """A request to defer that is larger than `deferred.max_request_bytes`: refused, not run."""
    return Answer(
        code=CODE_INVALID_REQUEST,
        http_status=413,
        message=(
            f"The request is too large to be kept as deferred work ({size} bytes, the limit is "
            f"{cap}); it was not accepted and not sent."
        ),
        data={"reason": "too_large_to_defer", "size": size, "max_request_bytes": cap},
    )


def task_not_found(task_id: str | None) -> Answer:
    """No such task for this caller (another tenant's tasks are not found either)."""
    return Answer(
        code=CODE_INVALID_PARAMS,
        http_status=404,
        message="Failed to retrieve task: Task not found",
        data=_data(reason="task_not_found", task_id=task_id),
    )


def task_not_cancellable(task_id: str, state: str, *, finished: bool) -> Answer:
    """A cancel that comes too late: the work started (it may be acting) or finished."""
    reason = "task_finished" if finished else "task_already_started"
    what = "has finished" if finished else "has already started"
    return Answer(
        code=CODE_INVALID_PARAMS,
        http_status=409,
        message=f"The task {what}; only work that has not started can be cancelled.",
        data=_data(reason=reason, task_id=task_id, state=state),
    )


def tasks_not_declared() -> Answer:
    """A 2026-07-28 task request from a client whose request did not declare the extension."""
    return Answer(
        code=CODE_MISSING_CAPABILITY,
        http_status=400,
        message="Missing required client capability",
        data={
            "reason": "missing_capability",
            "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        },
    )


def task_ended_unrun(task_id: str, why: str | None) -> Answer:
    """A task that ended without running: cancelled by its caller, or refused for good."""
    cancelled = why == "cancelled"
    return Answer(
        code=CODE_REFUSED,
        http_status=409,
        message=(
            "The task was cancelled before it started; it never ran."
            if cancelled
            else f"The task ended without running ({why or 'refused'}); it was never sent."
        ),
        data=_data(
            reason="task_cancelled" if cancelled else "task_refused",
            task_id=task_id,
            state="cancelled" if cancelled else "rejected",
            detail=None if cancelled else why,
        ),
    )
