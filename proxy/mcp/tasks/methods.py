"""The `tasks/*` requests of MCP clients, for the proxy's own tasks, served from the ledger.

2025-11-25 (core): `tasks/get` (the task), `tasks/result` (waits until the task is done, then
what the call would have answered, marked with the related task), `tasks/list` (this tenant's
tasks, newest first, by cursor) and `tasks/cancel` (a task that has not started is cancelled
and never runs; one that started or finished is refused with -32602).
2026-07-28 (the tasks extension, for a request that declares it; otherwise -32021): `tasks/get`
with the result inline (or, for a task whose tool asked for input, `input_required` with the
upstream's `inputRequests`), `tasks/cancel`, and `tasks/update`, whose `inputResponses` answer a
task in `input_required`: it goes back in line and runs again with them (`proxy.mcp.tasks.input`);
any other task is refused with -32602. `tasks/result` and `tasks/list` do not exist there (-32601).

Tasks are read and cancelled only by the tenant that created them, at the upstream they were
created for: any other caller is told the task does not exist. A task id the ledger does not know
is the upstream's own when the upstream runs tasks itself (the request is forwarded unchanged);
otherwise it is not found.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from ledger import EntryView, LedgerError, LedgerStore
from ledger.deferred_ops import CANCELLED
from policies import answers
from policies.answers import Answer
from policies.attributes import BadAttribute, read_attributes
from proxy.mcp.catalog import runs_tasks
from proxy.mcp.pipeline.deferral import task_view
from proxy.mcp.pipeline.outcomes import stored_answer
from proxy.mcp.tasks.input import answered_request, input_requests, waits_for_input
from proxy.mcp.transport.context import PostContext
from proxy.mcp.wire.jsonrpc import JsonObject, Message
from proxy.mcp.wire.tasks import (
    RELATED_TASK_META,
    TaskLine,
    core_task,
    declares_extension,
    extension_task,
    related_task_result,
)
from proxy.runtime.client_gone import ClientGone
from proxy.state import CONFIG, LEDGER

__all__ = ["TASK_METHODS", "handle_task_request"]

TASK_METHODS = frozenset(
    {"tasks/get", "tasks/result", "tasks/list", "tasks/cancel", "tasks/update"}
)
_CORE_ONLY = frozenset({"tasks/result", "tasks/list"})
_PAGE = 50
_RESULT_POLL_S = 0.5


class _Refused(Exception):
    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.message)
        self.answer = answer


def _method_not_found(method: str) -> Answer:
    return Answer(
        code=-32601,
        http_status=404,
        message=f"Method not found: {method}",
        data={"reason": "method_not_found"},
    )


async def handle_task_request(pc: PostContext, message: Message) -> web.StreamResponse | None:
    """Answer a `tasks/*` request for one of the proxy's tasks; None to forward it unchanged
    (the upstream's own task)."""
    method = message.method or ""
    line: TaskLine = "extension" if pc.modern else "core"
    meta = message.params.get("_meta")
    meta = meta if isinstance(meta, dict) else {}
    try:
        if pc.modern and not declares_extension(meta):
            raise _Refused(answers.tasks_not_declared())
        core_only = method in _CORE_ONLY
        if (pc.modern and core_only) or (method == "tasks/update" and not pc.modern):
            raise _Refused(_method_not_found(method))
        store, tenant = _ledger_and_tenant(pc, meta)
        if method == "tasks/list":
            return await _reply(pc, message, await _list(pc, store, tenant, message.params))
        entry = await _find(pc, store, tenant, message.params)
        if entry is None:
            return None
        result = await _answer(pc, store, entry, method, line, tenant, message.params)
    except _Refused as refused:
        return await _reply(pc, message, error=refused.answer)
    return await _reply(pc, message, result)


def _ledger_and_tenant(pc: PostContext, meta: dict[str, Any]) -> tuple[LedgerStore, str]:
    try:
        tenant = read_attributes(pc.app[CONFIG], pc.request.headers, meta).tenant
    except BadAttribute as exc:
        raise _Refused(
            answers.bad_request(answers.CODE_INVALID_PARAMS, exc.reason, str(exc))
        ) from exc
    handle = pc.app[LEDGER]
    if handle.store is None:
        raise _Refused(answers.ledger_unavailable(handle.error or "not open"))
    return handle.store, tenant


async def _find(
    pc: PostContext, store: LedgerStore, tenant: str, params: dict[str, Any]
) -> EntryView | None:
    """This caller's task; None when the request belongs to the upstream."""
    task_id = params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise _Refused(
            answers.bad_request(answers.CODE_INVALID_PARAMS, "invalid_params", "taskId required")
        )
    try:
        entry = await store.deferred.task(task_id, tenant)
    except LedgerError as exc:
        raise _Refused(answers.ledger_unavailable(str(exc))) from exc
    if entry is not None and entry.upstream == pc.spec.name:
        return entry
    if entry is None:
        try:
            owner = await store.deferred.upstream_task_owner(pc.spec.name, task_id)
            theirs = owner is None and await store.deferred.task_owner(task_id) is not None
        except LedgerError as exc:
            raise _Refused(answers.ledger_unavailable(str(exc))) from exc
        if theirs:  # the proxy's own task, another tenant's: not forwarded, not found
            raise _Refused(answers.task_not_found(task_id))
        if owner == tenant:
            return None  # the upstream's own task, created for this tenant's call
        if owner is None and (pc.modern or runs_tasks(pc.app, pc.spec.name)):
            return None  # not recorded (a read-only call's): the upstream's to answer
    raise _Refused(answers.task_not_found(task_id))


async def _answer(
    pc: PostContext,
    store: LedgerStore,
    entry: EntryView,
    method: str,
    line: TaskLine,
    tenant: str,
    params: dict[str, Any],
) -> JsonObject:
    config = pc.app[CONFIG]
    task_id = entry.task_id or ""
    if method == "tasks/cancel":
        entry = await _cancel(store, entry, tenant, finished_is_error=line == "core")
        return core_task(task_view(config, entry, line)) if line == "core" else _ack()
    if method == "tasks/update":
        await _update(store, entry, tenant, params)
        return _ack()
    if method == "tasks/result":
        entry = await _until_done(pc, store, entry, tenant)
        return _payload(entry, task_id, modern=False)
    view = task_view(config, entry, line)
    if line == "core":
        return core_task(view)
    detailed: JsonObject = {"resultType": "complete", **extension_task(view)}
    if view.status in ("completed", "failed"):
        detailed.update(_inline(entry))
    elif view.status == "input_required":
        detailed["inputRequests"] = input_requests(entry)
    return detailed


def _ack() -> JsonObject:
    return {"resultType": "complete"}


async def _update(
    store: LedgerStore, entry: EntryView, tenant: str, params: dict[str, Any]
) -> None:
    """`tasks/update`: the caller's answers to a task waiting for input put it back in line."""
    task_id = entry.task_id or ""
    responses = params.get("inputResponses")
    if not isinstance(responses, dict):
        raise _Refused(
            answers.bad_request(
                answers.CODE_INVALID_PARAMS, "invalid_params", "inputResponses (an object) required"
            )
        )
    if not waits_for_input(entry):
        raise _Refused(_not_waiting(task_id, str(entry.state)))
    try:
        request = answered_request(entry, responses)
        result = await store.deferred.provide_input(
            entry.id, entry.fencing_token, request=request, actor=f"tenant:{tenant}"
        )
    except ValueError as exc:
        raise _Refused(_not_waiting(task_id, str(entry.state))) from exc
    except LedgerError as exc:
        raise _Refused(answers.ledger_unavailable(str(exc))) from exc
    if result.kind != "accepted":
        raise _Refused(_not_waiting(task_id, str(result.entry.state)))


def _not_waiting(task_id: str, state: str) -> Answer:
    return Answer(
        code=answers.CODE_INVALID_PARAMS,
        http_status=409,
        message="The task is not waiting for input; only a task in input_required takes "
        "inputResponses.",
        data={"reason": "task_not_waiting_for_input", "task_id": task_id, "state": state},
    )


async def _cancel(
    store: LedgerStore, entry: EntryView, tenant: str, *, finished_is_error: bool
) -> EntryView:
    try:
        result = await store.deferred.cancel(entry.id, actor=f"tenant:{tenant}", reason=CANCELLED)
    except LedgerError as exc:
        raise _Refused(answers.ledger_unavailable(str(exc))) from exc
    if result.kind == "cancelled":
        return result.entry
    finished = result.kind == "finished"
    if finished_is_error or not finished:
        raise _Refused(
            answers.task_not_cancellable(
                entry.task_id or "", str(result.entry.state), finished=finished
            )
        )
    return result.entry


async def _until_done(
    pc: PostContext, store: LedgerStore, entry: EntryView, tenant: str
) -> EntryView:
    """`tasks/result` waits for the task to end (polling the ledger), or for its caller to go."""
    config = pc.app[CONFIG]
    poll_s = min(config.deferred.poll_interval_s, _RESULT_POLL_S)
    gone = ClientGone()
    with pc.transport.watcher.watch(pc.request, gone):
        while str(entry.state) in ("accepted", "running"):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_s):
                    await gone.wait()
            if gone.is_set():
                raise _Refused(answers.task_not_found(entry.task_id))  # nobody reads it
            try:
                found = await store.deferred.task(entry.task_id or "", tenant)
            except LedgerError as exc:
                raise _Refused(answers.ledger_unavailable(str(exc))) from exc
            if found is None:
                raise _Refused(answers.task_not_found(entry.task_id))
            entry = found
    return entry


def _ended(entry: EntryView) -> Answer:
    """Why a finished task has no result to give."""
    state, key, task_id = str(entry.state), entry.idempotency_key, entry.task_id or ""
    if state in ("succeeded", "failed"):
        return answers.outcome_not_retained(key, entry.id, state)
    if state == "unknown":
        return answers.outcome_unknown(key, entry.id, entry.error or "lost")
    if state == "blocked":
        return answers.needs_reconciliation(key, entry.id, state)
    return answers.task_ended_unrun(task_id, entry.error)


def _payload(entry: EntryView, task_id: str, *, modern: bool) -> JsonObject:
    """`tasks/result`: what the call would have answered, marked with its task."""
    if entry.outcome is None:
        raise _Refused(_with_task(_ended(entry), task_id))
    stored = stored_answer(entry.outcome, modern=modern)
    if isinstance(stored.get("result"), dict):
        return related_task_result(stored["result"], task_id)
    error = stored.get("error") or {}
    raise _Refused(_upstream_error(error, task_id))


def _upstream_error(error: dict[str, Any], task_id: str) -> Answer:
    data = error.get("data")
    related = {RELATED_TASK_META: {"taskId": task_id}}
    return Answer(
        code=int(error.get("code", -32603)),
        http_status=200,
        message=str(error.get("message", "")),
        data={**data, **related} if isinstance(data, dict) else {"upstream": data, **related},
    )


def _with_task(answer: Answer, task_id: str) -> Answer:
    return Answer(
        answer.code,
        answer.http_status,
        answer.message,
        {**answer.data, RELATED_TASK_META: {"taskId": task_id}},
    )


def _inline(entry: EntryView) -> JsonObject:
    """The 2026-07-28 `tasks/get` of a finished task: its `result` or its `error` inline."""
    if entry.outcome is None:
        answer = _ended(entry)
        return {"error": {"code": answer.code, "message": answer.message, "data": answer.data}}
    stored = stored_answer(entry.outcome, modern=True)
    if isinstance(stored.get("result"), dict):
        return {"result": stored["result"]}
    return {"error": stored.get("error") or {}}


async def _list(
    pc: PostContext, store: LedgerStore, tenant: str, params: dict[str, Any]
) -> JsonObject:
    cursor = params.get("cursor")
    try:
        page = await store.deferred.tasks(
            tenant,
            limit=_PAGE,
            cursor=cursor if isinstance(cursor, str) else None,
            upstream=pc.spec.name,
        )
    except ValueError as exc:
        raise _Refused(
            answers.bad_request(answers.CODE_INVALID_PARAMS, "invalid_cursor", str(exc))
        ) from exc
    except LedgerError as exc:
        raise _Refused(answers.ledger_unavailable(str(exc))) from exc
    config = pc.app[CONFIG]
    tasks = [core_task(task_view(config, entry, "core")) for entry in page.entries]
    listed: JsonObject = {"tasks": tasks}
    if page.next_cursor is not None:
        listed["nextCursor"] = page.next_cursor
    return listed


async def _reply(
    pc: PostContext,
    message: Message,
    result: JsonObject | None = None,
    *,
    error: Answer | None = None,
) -> web.StreamResponse:
    body: JsonObject
    if error is not None:
        body = error.jsonrpc_error(message.id)
    else:
        body = {"jsonrpc": "2.0", "id": message.id, "result": result}
    reply = pc.reply(ClientGone())
    return await reply.finish_message(body)
