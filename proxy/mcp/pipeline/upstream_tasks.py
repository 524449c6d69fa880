"""A read-only call the upstream answered with a task of its own is recorded too.

Read-only calls are otherwise never ledgered. But the upstream's task id is the caller's handle to
work done for one tenant, and `tasks/*` for it are forwarded only for the tenant the ledger names
(`proxy.mcp.tasks.methods`): without a record, any tenant's `tasks/get` for that id would reach the
upstream, which cannot tell the proxy's callers apart (it sees the proxy's credentials). So the
call becomes a key-less `succeeded` entry holding the upstream's answer and naming its task. The
record is written before the caller hears of the task, so no other tenant can race it. If the
ledger cannot take it, the answer still goes out (a read-only call never waits on the ledger) and
the task stays unrecorded: forwarded for whoever asks, as before, and logged.
"""

from __future__ import annotations

import logging

from ledger import LedgerError
from policies.keys import KeyDecision, fingerprint
from proxy.mcp.pipeline.context import JsonObject, ToolCall
from proxy.mcp.pipeline.outcomes import encode_outcome
from proxy.state import LEDGER

__all__ = ["record_upstream_task"]

log = logging.getLogger("interlock.ledger")


async def record_upstream_task(call: ToolCall, response: JsonObject, task_id: str) -> None:
    """Record `response`, the upstream's own task `task_id` for this read-only call
    (`created_task_id` of the response)."""
    store = call.ctx.app[LEDGER].store
    if store is None:
        log.warning("the upstream's task %r is not recorded: the ledger is not open", task_id)
        return
    upstream = call.ctx.upstream.name
    request = call.claim_request(KeyDecision(None, "none", fingerprint(call.tool, call.arguments)))
    try:
        claimed = await store.claim(request)
        entry = claimed.entry
        await store.finish(
            entry.id, entry.fencing_token, state="succeeded", outcome=encode_outcome(response)
        )
        await store.deferred.note_upstream_task(entry.id, upstream, task_id)
    except LedgerError as exc:
        log.warning("the upstream's task %r is not recorded: %s", task_id, exc)
        return
    call.span.set_attribute("interlock.ledger.entry_id", entry.id)
