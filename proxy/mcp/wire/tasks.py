"""MCP task shapes on the wire, for both protocol lines (plain values in, JSON objects out).

- 2025-11-25 (core tasks): a `Task` is `{taskId, status, statusMessage?, createdAt,
  lastUpdatedAt, ttl, pollInterval?}`; `tools/call` with `params.task` answers
  `CreateTaskResult` = `{task: Task}`; `tasks/get` and `tasks/cancel` answer a `Task`;
  `tasks/result` answers what the call would have, with `_meta["io.modelcontextprotocol/
  related-task"] = {taskId}`.
- 2026-07-28 (the `io.modelcontextprotocol/tasks` extension, SEP-2663): flat, `ttlMs` and
  `pollIntervalMs`; `tools/call` answers `{resultType: "task", …task}`; `tasks/get` answers
  `{resultType: "complete", …task, result | error}` with the result inline; `tasks/cancel` and
  `tasks/update` answer `{resultType: "complete"}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "CLIENT_CAPABILITIES_META",
    "RELATED_TASK_META",
    "TASKS_EXTENSION",
    "TaskLine",
    "TaskView",
    "core_create_result",
    "core_task",
    "created_task_id",
    "declares_core_tasks",
    "declares_extension",
    "extension_create_result",
    "extension_task",
    "related_task_result",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK_META = "io.modelcontextprotocol/related-task"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"

TaskLine = Literal["core", "extension"]
"""Which protocol line a client speaks tasks in: 2025-11-25 core, or the 2026-07-28 extension."""

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class TaskView:
    """One task as the wire shows it."""

    task_id: str
    status: str
    message: str
    created_at: datetime
    updated_at: datetime
    ttl_ms: int | None
    poll_interval_ms: int


def _time(moment: datetime) -> str:
    """ISO 8601 in UTC with a `Z`, as the specification's examples write it."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def core_task(task: TaskView) -> JsonObject:
    """A 2025-11-25 `Task`."""
    return {
        "taskId": task.task_id,
        "status": task.status,
        "statusMessage": task.message,
        "createdAt": _time(task.created_at),
        "lastUpdatedAt": _time(task.updated_at),
        "ttl": task.ttl_ms,
        "pollInterval": task.poll_interval_ms,
    }


def core_create_result(task: TaskView) -> JsonObject:
    """The 2025-11-25 `CreateTaskResult` of a task-augmented `tools/call`."""
    return {"task": core_task(task)}


def extension_task(task: TaskView) -> JsonObject:
    """A 2026-07-28 extension `Task` (flat, `…Ms` fields)."""
    return {
        "taskId": task.task_id,
        "status": task.status,
        "statusMessage": task.message,
        "createdAt": _time(task.created_at),
        "lastUpdatedAt": _time(task.updated_at),
        "ttlMs": task.ttl_ms,
        "pollIntervalMs": task.poll_interval_ms,
    }


def extension_create_result(task: TaskView) -> JsonObject:
    """The 2026-07-28 `CreateTaskResult` standing in for a `tools/call` result."""
    return {"resultType": "task", **extension_task(task)}


def related_task_result(result: Mapping[str, Any], task_id: str) -> JsonObject:
    """A stored result as `tasks/result` gives it: with the related-task `_meta`."""
    meta = dict(result.get("_meta") or {})
    meta[RELATED_TASK_META] = {"taskId": task_id}
    return {**result, "_meta": meta}


def declares_extension(meta: Mapping[str, Any]) -> bool:
    """Whether a 2026-07-28 request's `_meta` declares the tasks extension."""
    capabilities = meta.get(CLIENT_CAPABILITIES_META)
    if not isinstance(capabilities, dict):
        return False
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def declares_core_tasks(initialize_params: Mapping[str, Any]) -> bool:
    """Whether a 2025-11-25 `initialize` declares the client's `tasks` capability."""
    capabilities = initialize_params.get("capabilities")
    return isinstance(capabilities, dict) and isinstance(capabilities.get("tasks"), dict)


def created_task_id(response: Mapping[str, Any]) -> str | None:
    """The task id when a `tools/call` response is a `CreateTaskResult` of either line (the
    upstream runs the call as a task of its own), else None."""
    result = response.get("result")
    if not isinstance(result, dict):
        return None
    if result.get("resultType") == "task" and isinstance(result.get("taskId"), str):
        return str(result["taskId"])
    task = result.get("task")
    if isinstance(task, dict) and isinstance(task.get("taskId"), str) and "content" not in result:
        return str(task["taskId"])
    return None
