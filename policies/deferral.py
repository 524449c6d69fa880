"""Deferred work as pure decisions: which calls may become a task, how big a request may be kept,
how full the accepted work may get, and what a task's state is called on each protocol line.

A call is deferred (accepted now, run later by the dispatcher, its result polled) when its caller
can take a task handle and either asked for one (MCP `params.task`, HTTP `Prefer: respond-async`)
or its band defers (`classes.<name>.defer`, on for bulk by default) — and, unless it asked for a
task, only when it cannot start now. A request over `deferred.max_request_bytes` is refused
rather than run live (its caller asked for a handle, not a wait).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from policies import answers
from policies.admission import DEFAULT_SERVICE_TIME_S, Refusal, band_of, bounded_retry_after
from policies.answers import Answer
from policies.model import Config, WorkClass

__all__ = [
    "CANCELLED_ERROR",
    "INPUT_REQUIRED_ERROR",
    "RELATED_TASK_META",
    "TASKS_EXTENSION",
    "OutcomeKind",
    "TaskState",
    "TaskStatus",
    "band_defers",
    "full_refusal",
    "poll_interval_ms",
    "prefers_async",
    "task_state",
    "too_large",
    "ttl_ms",
    "without_respond_async",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The 2026-07-28 tasks extension (SEP-2663)."""
RELATED_TASK_META = "io.modelcontextprotocol/related-task"
CANCELLED_ERROR = "cancelled"
"""The ledger `error` of deferred work its caller cancelled (`ledger.deferred_ops.CANCELLED`)."""
INPUT_REQUIRED_ERROR = "input_required"
"""The ledger `error` of deferred work waiting for its caller's input
(`ledger.deferred_ops.INPUT_REQUIRED`)."""

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
OutcomeKind = Literal["result", "error"]


@dataclass(frozen=True, slots=True)
class TaskState:
    """A task's status as MCP names it, and one sentence saying why."""

    status: TaskStatus
    message: str

    @property
    def terminal(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


def band_defers(config: Config, work_class: WorkClass) -> bool:
    """Whether calls of this band that cannot start now become deferred work."""
    return band_of(config, work_class).defer


def too_large(config: Config, size: int) -> Answer | None:
    """The refusal of a request too large to keep as deferred work (None: it fits)."""
    cap = config.deferred.max_request_bytes
    return None if size <= cap else answers.too_large_to_defer(size, cap)


def full_refusal(config: Config, scope: str, service_time_s: float | None) -> Refusal:
    """The refusal when the accepted work of `scope` ("tenant:<t>", "upstream:<u>") is at its
    bound: a place frees when one waiting call has run, so come back after one mean service time
    of the upstream (clamped like every `retry_after`)."""
    usable = service_time_s is not None and math.isfinite(service_time_s) and service_time_s > 0
    estimate = service_time_s if usable and service_time_s is not None else DEFAULT_SERVICE_TIME_S
    return Refusal("overloaded", f"accepted:{scope}", bounded_retry_after(config, estimate))


def prefers_async(values: Iterable[str]) -> bool:
    """Whether `Prefer` header values (RFC 7240) ask for `respond-async` (tokens are
    case-insensitive; parameters after `;` and values after `=` do not matter)."""
    return any(_is_respond_async(p) for value in values for p in value.split(","))


def without_respond_async(value: str) -> str:
    """A `Prefer` header value with `respond-async` taken out: the proxy honoured it, so the
    upstream must answer the deferred call itself, not with a job of its own."""
    kept = [p.strip() for p in value.split(",") if p.strip() and not _is_respond_async(p)]
    return ", ".join(kept)


def _is_respond_async(preference: str) -> bool:
    """Whether one preference of a `Prefer` value is `respond-async` (its token, without
    parameters or value, case-insensitive)."""
    return preference.split(";", 1)[0].split("=", 1)[0].strip().lower() == "respond-async"


def poll_interval_ms(config: Config) -> int:
    """How often a caller should poll a task (`pollInterval`, `pollIntervalMs`)."""
    return max(1, round(config.deferred.poll_interval_s * 1000))


def ttl_ms(config: Config) -> int:
    """How long a task's result is kept once it has one: the ledger's `retention_h`."""
    return round(config.ledger.retention_h * 3600 * 1000)


def task_state(
    state: str, error: str | None, outcome: OutcomeKind | None, *, modern: bool
) -> TaskState:
    """The MCP status of a task whose ledger entry is in `state`.

    `outcome` says what the stored answer is: a result (a tool result, `isError` or not) or a
    JSON-RPC error. The 2025-11-25 revision calls a task `failed` when its tool result has
    `isError: true`; the 2026-07-28 extension calls that `completed` (the result carries it) and
    keeps `failed` for a JSON-RPC error. An entry whose outcome is unknown (or blocked) is
    `failed`: it will not finish by itself; an operator's reconciliation decides it. Work
    parked because its tool asked for input (rejected, `INPUT_REQUIRED_ERROR`) is
    `input_required` until its caller answers.
    """
    if state == "accepted":
        return TaskState("working", "Accepted: waiting for its turn to start.")
    if state == "running":
        return TaskState("working", "Running.")
    if state == "succeeded":
        return TaskState("completed", "Completed.")
    if state == "failed":
        if modern and outcome == "result":
            return TaskState("completed", "Completed; the tool reported an error.")
        return TaskState("failed", "The call failed.")
    if state == "unknown":
        return TaskState(
            "failed",
            "The call was sent but its outcome is unknown; it needs reconciliation "
            "(interlock ledger resolve) and is not sent again.",
        )
    if state == "blocked":
        return TaskState("failed", "Blocked: it needs reconciliation by an operator.")
    if error == INPUT_REQUIRED_ERROR:
        return TaskState(
            "input_required",
            "The tool asked for input; answer its inputRequests with tasks/update.",
        )
    if error == CANCELLED_ERROR:
        return TaskState("cancelled", "Cancelled before it started; it never ran.")
    return TaskState("failed", f"Refused; it never ran ({error or 'refused'}).")
