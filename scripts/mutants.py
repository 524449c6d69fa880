"""`make mutants`: each guard that matters most, removed on purpose, must be noticed by a test.

For every named mutant: copy the tree (the files git knows, committed or not) to a scratch
folder, apply the mutation there (an exact search/replace in one file — a search text that is no
longer found fails loudly, so a mutant cannot rot into a no-op), check that the mutated module is
the one Python imports from the scratch copy, and run the mutant's tests there. A mutant is
*killed* when a test fails, *survived* when they all pass (skips included: a guard proved only by
skipped tests is not proved). Before the mutants, the same tests run once on the unmutated copy:
tests that fail there would kill anything.

Prints a table (mutant, tests, killed/survived, seconds); exits 1 if any mutant survives or any
run is broken. Usage: `python scripts/mutants.py [--only NAME] [--no-baseline] [--list]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"]
_TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutant:
    """One dangerous mutation: `search` replaced by `replace` in `path` (each exactly once)."""

    name: str
    path: str
    module: str
    edits: tuple[tuple[str, str], ...]
    tests: tuple[str, ...]
    why: str


MUTANTS = (
    Mutant(
        name="drop FOR UPDATE",
        path="ledger/pg_sql.py",
        module="ledger.pg_sql",
        edits=(("    ORDER BY id FOR UPDATE\n", "    ORDER BY id\n"),),
        tests=(
            "tests/integration/test_ledger_concurrency.py::"
            "test_two_processes_racing_rejected_keys_start_each_once",
            "tests/integration/test_ledger_concurrency.py::"
            "test_two_processes_racing_operator_retried_keys_start_each_once",
            "tests/acceptance/test_replica_races.py",
        ),
        why="claim and finish decide on rows another replica may be changing",
    ),
    Mutant(
        name="claim deferred work without the row lock",
        path="ledger/deferred_queries.py",
        module="ledger.deferred_queries",
        edits=(
            (
                "result = conn.execute("
                "stmt.order_by(ENTRIES.c.id).with_for_update(skip_locked=True))",
                "result = conn.execute(stmt.order_by(ENTRIES.c.id))",
            ),
        ),
        tests=(
            "tests/integration/test_ledger_deferred.py::"
            "test_three_processes_racing_for_waiting_work_start_each_once",
        ),
        why="two replicas both start the same accepted work",
    ),
    Mutant(
        name="deferred work takes the interactive share",
        path="policies/admission.py",
        module="policies.admission",
        edits=(
            (
                "    unfilled = live_reserve(config, scope, band, load) if deferred else 0\n",
                "    unfilled = 0\n",
            ),
        ),
        tests=(
            "tests/unit/test_admission.py::"
            "test_deferred_work_leaves_the_share_of_bands_that_cannot_wait",
            "tests/integration/test_deferred_fairness.py",
        ),
        why="a flood of deferred bulk work refuses interactive calls within their share",
    ),
    Mutant(
        name="acknowledge before COMMIT",
        path="ledger/transactions.py",
        module="ledger.transactions",
        edits=(
            (
                "    try:\n"
                "        await commit()\n"
                "    except Exception as error:\n"
                "        with contextlib.suppress(Exception):\n"
                "            await rollback()\n"
                "        raise TransactionFailed(error, committing=True) from error\n",
                "    with contextlib.suppress(Exception):\n        await commit()\n",
            ),
            (
                "    try:\n"
                "        commit()\n"
                "    except Exception as error:\n"
                "        with contextlib.suppress(Exception):\n"
                "            rollback()\n"
                "        raise TransactionFailed(error, committing=True) from error\n",
                "    with contextlib.suppress(Exception):\n        commit()\n",
            ),
        ),
        tests=(
            "tests/integration/test_ledger_faults.py::"
            "test_a_commit_the_database_refuses_is_never_acknowledged",
        ),
        why="callers hear 'done' for a write whose COMMIT failed",
    ),
    Mutant(
        name="the SQLite sweep never finds an expired lease",
        path="ledger/sqlite_sql.py",
        module="ledger.sqlite_sql",
        edits=(
            (
                '"AND lease_expires_at < ? ORDER BY id LIMIT ?"',
                '"AND lease_expires_at < ? AND 0 ORDER BY id LIMIT ?"',
            ),
        ),
        tests=(
            "tests/integration/test_ledger_store.py::"
            "test_expired_lease_becomes_unknown_and_needs_reconciliation",
        ),
        why="a call whose proxy died stays running for good instead of becoming unknown",
    ),
    Mutant(
        name="skip the fencing-token check",
        path="ledger/operations.py",
        module="ledger.operations",
        edits=(
            (
                "        if self.token != row.fencing_token:\n"
                '            report = {"op": "finish", "state": self.state}\n',
                '        if False:\n            report = {"op": "finish", "state": self.state}\n',
            ),
        ),
        tests=(
            "tests/integration/test_ledger_store.py::"
            "test_stale_token_finish_is_refused_and_kept_as_evidence",
            "tests/unit/test_ledger_states.py::"
            "test_stale_finish_leaves_a_note_and_changes_nothing_else",
        ),
        why="a stale owner's finish overwrites a newer decision",
    ),
    Mutant(
        name="forward before the claim commits",
        path="proxy/mcp/pipeline/side_effects.py",
        module="proxy.mcp.pipeline.side_effects",
        edits=(
            (
                "    try:\n        claim = await _claim(call, store)\n",
                "    early = asyncio.ensure_future(forward_with_retries(plan))\n"
                "    try:\n        claim = await _claim(call, store)\n",
            ),
        ),
        tests=(
            "tests/integration/test_mcp_pipeline.py::test_duplicate_delivery_serially_executes_once",
        ),
        why="the upstream acts before the write-ahead record exists",
    ),
    Mutant(
        name="treat a timeout as not executed",
        path="proxy/runtime/upstream_pressure.py",
        module="proxy.runtime.upstream_pressure",
        edits=(
            (
                "    if isinstance(error, UpstreamTimeout):\n"
                '        return AttemptFailure("timeout")\n',
                "    if isinstance(error, UpstreamTimeout):\n"
                '        return AttemptFailure("not_sent")\n',
            ),
        ),
        tests=(
            "tests/integration/test_mcp_pipeline.py::"
            "test_timeout_becomes_unknown_and_blocks_the_key_until_resolved",
            "tests/integration/test_telemetry_http_spans.py::test_http_timeout_becomes_unknown",
        ),
        why="a call that may have acted is re-sent blindly",
    ),
    Mutant(
        name="close the ledger under a finish in flight",
        path="ledger/store.py",
        module="ledger.store",
        edits=(("        await self._finishing.drain(_FINISH_DRAIN_S)\n", "        pass\n"),),
        tests=(
            "tests/integration/test_mcp_upstream_answers.py::"
            "test_a_finish_interrupted_by_shutdown_still_lands",
            "tests/integration/test_http_upstream_answers.py::"
            "test_a_finish_interrupted_by_shutdown_still_lands",
        ),
        why="an answered side effect is left running at shutdown and expires into unknown",
    ),
    Mutant(
        name="fingerprint without the operation",
        path="policies/keys.py",
        module="policies.keys",
        edits=(
            (
                '    return _object_hash({"operation": _member_text(operation), '
                '"arguments": arguments})',
                '    return _object_hash({"arguments": arguments})',
            ),
        ),
        tests=(
            "tests/unit/test_keys.py::test_fingerprint_tells_operations_apart",
            "tests/integration/test_mcp_idempotency_keys.py::"
            "test_a_key_reused_for_another_tool_is_a_mismatch_not_a_replay",
            "tests/integration/test_http_idempotency.py::"
            "test_same_key_on_another_path_is_422_not_a_replay",
        ),
        why="a key reused for another operation replays the first one's outcome",
    ),
    Mutant(
        name="HTTP: forward before the claim commits",
        path="proxy/http/pipeline.py",
        module="proxy.http.pipeline",
        edits=(
            (
                '    try:\n        with tracing.child_span("interlock.ledger.claim") as span:\n',
                '    early = __import__("asyncio").ensure_future(forward(call))\n'
                '    try:\n        with tracing.child_span("interlock.ledger.claim") as span:\n',
            ),
        ),
        tests=(
            "tests/integration/test_http_idempotency.py::test_duplicate_delivery_executes_once",
        ),
        why="the model or JSON API acts before the write-ahead record exists",
    ),
    Mutant(
        name="a lost deferred job taken as not executed",
        path="proxy/http/deferred_run.py",
        module="proxy.http.deferred_run",
        edits=(
            (
                "reason: str) -> None:\n        if side_effect:\n",
                "reason: str) -> None:\n        if False:\n",
            ),
        ),
        tests=(
            "tests/integration/test_http_jobs.py::"
            "test_a_side_effect_job_that_may_have_run_ends_unknown_and_is_never_resent",
        ),
        why="deferred work that may have acted is put back in line and sent again",
    ),
    Mutant(
        name="a finish the ledger could not take is not retried",
        path="ledger/finishing.py",
        module="ledger.finishing",
        edits=(
            (
                "            if not isinstance(error, LedgerUnavailable):\n"
                "                settle(tried)",
                "            if True:\n                settle(tried)",
            ),
        ),
        tests=("tests/integration/test_ledger_finish.py::test_a_finish_that_fails_then_lands",),
        why="an answered side effect whose outcome met a locked ledger expires into unknown",
    ),
    Mutant(
        name="close the ledger under refusal records",
        path="proxy/app.py",
        module="proxy.app",
        edits=(("    await app[REJECTIONS].drain(_REJECTIONS_DRAIN_S)\n", ""),),
        tests=(
            "tests/integration/test_refusals_write_behind.py::"
            "test_graceful_shutdown_writes_the_pending_refusals",
        ),
        why="refusals answered before a graceful stop are never recorded as rejected",
    ),
    Mutant(
        name="the HTTP client picks one of two Content-Length values",
        path="proxy/runtime/http1/head.py",
        module="proxy.runtime.http1.head",
        edits=(("    if len(lengths) > 1 or not all(", "    if not all("),),
        tests=(
            "tests/integration/test_http1_client.py::"
            "test_a_malformed_or_cut_off_answer_is_lost_never_guessed",
        ),
        why="where one answer ends becomes a guess: the rest is read as another caller's answer",
    ),
    Mutant(
        name="the HTTP client reuses a connection whose answer was left unread",
        path="proxy/runtime/http1/connection.py",
        module="proxy.runtime.http1.connection",
        edits=(
            (
                "            and self._done\n            and self._head.keep_alive",
                "            and self._head.keep_alive",
            ),
        ),
        tests=(
            "tests/integration/test_http1_client.py::"
            "test_an_answer_released_before_its_end_closes_its_connection",
        ),
        why="the rest of one caller's answer would be read as the start of the next caller's",
    ),
    Mutant(
        name="the turn index misses a served tenant's new turn",
        path="policies/admission_book.py",
        module="policies.admission_book",
        edits=(("            self._index.new_turn(*key)\n", ""),),
        tests=(
            "tests/unit/test_admission_fairness.py::test_round_robin_between_tenants_inside_a_band",
            "tests/unit/test_admission_properties.py::"
            "test_the_book_starts_what_the_reference_engine_starts",
        ),
        why="a tenant served once is never served again while other tenants keep arriving",
    ),
    Mutant(
        name="the pipeline writes the trace context into the client's own message",
        path="proxy/mcp/pipeline/attempts.py",
        module="proxy.mcp.pipeline.attempts",
        edits=(
            (
                '        plan.request = {**plan.request, "params": {**params, "_meta": meta}}\n',
                '        params.setdefault("_meta", {}).update(carrier)\n',
            ),
        ),
        tests=("tests/integration/test_mcp_trace_passthrough.py",),
        why="the client's bytes, sent when the message compares equal, would go without the trace "
        "context (the suite's INTERLOCK_CHECK_WIRE re-read notices the in-place edit)",
    ),
    Mutant(
        name="the envelope reader leaves a tool error's flag unread",
        path="proxy/mcp/wire/jsonrpc.py",
        module="proxy.mcp.wire.jsonrpc",
        edits=(
            (
                '_TOOL_OUTPUT = frozenset({"content", "structuredContent"})\n',
                '_TOOL_OUTPUT = frozenset({"content", "structuredContent", "isError"})\n',
            ),
        ),
        tests=(
            "tests/integration/test_mcp_pipeline.py::"
            "test_a_tool_error_is_recorded_failed_and_replayed_as_itself",
        ),
        why="a side-effecting call whose tool failed (isError) would be recorded succeeded",
    ),
    Mutant(
        name="a write held by the commit delay is dropped when the writer dies",
        path="ledger/writer.py",
        module="ledger.writer",
        edits=(
            (
                "                if item is not None:\n"
                "                    _fail([item], LedgerUnavailable(_death(error)))\n",
                "",
            ),
        ),
        tests=(
            "tests/integration/test_ledger_commit_delay.py::"
            "test_a_write_held_by_a_writer_that_dies_fails_instead_of_waiting_forever",
        ),
        why="a side-effecting call waits for its claim forever: never forwarded, never answered",
    ),
    Mutant(
        name="a dead writer's clean-up fails the writes of the writer that replaced it",
        path="ledger/writer.py",
        module="ledger.writer",
        edits=(("        if task is not self._task:\n", "        if False:\n"),),
        tests=(
            "tests/integration/test_ledger_faults.py::"
            "test_a_write_made_as_soon_as_the_writer_died_runs_on_the_new_writer",
        ),
        why="a caller that writes again at once after the writer died is refused a second time",
    ),
    Mutant(
        name="shutdown calls an outcome lost while the closing writer still commits it",
        path="ledger/finishing.py",
        module="ledger.finishing",
        edits=(
            (
                "            if not late.done() and late not in self._with_writer:\n",
                "            if not late.done():\n",
            ),
        ),
        tests=(
            "tests/integration/test_ledger_faults.py::"
            "test_an_outcome_still_being_written_at_shutdown_lands_and_is_not_called_lost",
        ),
        why="an SRE reads ERROR 'outcome not recorded' for an entry that is succeeded",
    ),
    Mutant(
        name="PostgreSQL's plain read keeps the clock from before its later row locks",
        path="ledger/pg_sql.py",
        module="ledger.pg_sql",
        edits=(("else max(now, record[0])", "else min(now, record[0])"),),
        tests=(
            "tests/integration/test_ledger_faults.py::"
            "test_a_finish_that_waited_for_its_row_past_its_lease_is_decided_after_the_wait",
        ),
        why="a finish that waited for its row past its lease records succeeded, not unknown",
    ),
    Mutant(
        name="PostgreSQL's full batch reads its time before it locks the named rows",
        path="ledger/pg_transactions.py",
        module="ledger.pg_transactions",
        edits=(
            ("        queries.lock_named(conn, needs, ws)\n", ""),
            (
                "        queries.load_rest(conn, needs, ws, now=ctx.now)\n",
                "        queries.lock_named(conn, needs, ws)\n"
                "        queries.load_rest(conn, needs, ws, now=ctx.now)\n",
            ),
        ),
        tests=(
            "tests/integration/test_ledger_faults.py::"
            "test_a_finish_that_waited_for_its_row_past_its_lease_is_decided_after_the_wait",
        ),
        why="a finish batched with a sweep records succeeded after its lease ran out",
    ),
    Mutant(
        name="a batch takes writes past the bytes one statement may carry",
        path="ledger/writer.py",
        module="ledger.writer",
        edits=(
            (
                "                if carried + size > _MAX_BATCH_BYTES:\n",
                "                if False:\n",
            ),
        ),
        tests=(
            "tests/unit/test_writer_batches.py::"
            "test_batches_stop_growing_at_the_bytes_their_writes_may_carry",
        ),
        why="on PostgreSQL a burst of large deferred requests fails whole, rerun after rerun",
    ),
    Mutant(
        name="replicas count a tenant's accepted work without a shared lock",
        path="ledger/deferred_queries.py",
        module="ledger.deferred_queries",
        edits=(('        conn.execute(_ADVISORY_LOCKS, {"names": names})\n', "        pass\n"),),
        tests=(
            "tests/integration/test_ledger_concurrency.py::"
            "test_two_replicas_deferring_at_once_keep_a_tenants_bound_on_accepted_work",
        ),
        why="two replicas on PostgreSQL accept twice a tenant's bound of deferred work",
    ),
    Mutant(
        name="the admission fast path counts every running call as critical",
        path="policies/admission.py",
        module="policies.admission",
        edits=(
            (
                'running.get(name, 0), by_class.get((name, "critical"), 0)):',
                "running.get(name, 0), running.get(name, 0)):",
            ),
        ),
        tests=(
            "tests/unit/test_admission_properties.py::"
            "test_a_new_call_is_admitted_exactly_when_every_scope_has_room",
        ),
        why="calls of other bands take the slots critical keeps: a critical call finds none",
    ),
    Mutant(
        name="serve cancels the handler of a client that left",
        path="proxy/listener.py",
        module="proxy.listener",
        edits=(("        handler_cancellation=False,\n", "        handler_cancellation=True,\n"),),
        tests=("tests/acceptance/test_client_leaves.py",),
        why="an MCP call's pipeline runs in its handler: a handshake-era call whose client "
        "dropped its connection would be cut off and left unknown instead of running on",
    ),
    Mutant(
        name="a side effect cut off at shutdown is left running",
        path="proxy/mcp/pipeline/side_effects.py",
        module="proxy.mcp.pipeline.side_effects",
        edits=(
            (
                'await _mark_unknown(call, store, lease, "interrupted after write-ahead")\n',
                "pass\n",
            ),
        ),
        tests=(
            "tests/acceptance/test_proxy_crash.py::"
            "test_sigterm_records_a_call_still_running_after_the_grace_as_unknown",
        ),
        why="a call forwarded and then cancelled by shutdown would stay running until its lease "
        "lapses, instead of unknown before the ledger closes",
    ),
)


def _tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


def _copy_tree(files: list[str], scratch: Path) -> None:
    for name in files:
        target = scratch / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)


def _apply(mutant: Mutant, scratch: Path) -> None:
    path = scratch / mutant.path
    text = path.read_text()
    for search, replace in mutant.edits:
        found = text.count(search)
        if found != 1:
            raise SystemExit(
                f"mutant {mutant.name!r} has rotted: its search text occurs {found} times in "
                f"{mutant.path} (expected once); update it in scripts/mutants.py:\n{search}"
            )
        text = text.replace(search, replace)
    path.write_text(text)


def _env(scratch: Path) -> dict[str, str]:
    # The editable install points at the real tree: the scratch copy must come first.
    return {**os.environ, "PYTHONPATH": str(scratch), "PYTHONDONTWRITEBYTECODE": "1"}


def _imported_from(module: str, scratch: Path) -> Path:
    probe = f"import importlib; print(importlib.import_module({module!r}).__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=scratch,
        env=_env(scratch),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(out).resolve()


def _run_tests(tests: tuple[str, ...], scratch: Path, *, show: bool = False) -> int:
    done = subprocess.run(
        [*PYTEST, *tests],
        cwd=scratch,
        env=_env(scratch),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    if show or done.returncode not in (0, 1):
        print(done.stdout[-3000:], file=sys.stderr)
    return done.returncode


def _baseline(mutants: list[Mutant], files: list[str]) -> bool:
    tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
    with tempfile.TemporaryDirectory(prefix="interlock-baseline-") as folder:
        scratch = Path(folder)
        _copy_tree(files, scratch)
        started = time.monotonic()
        code = _run_tests(tests, scratch)
    print(
        f"baseline (unmutated, {len(tests)} tests): exit {code}, {time.monotonic() - started:.1f} s"
    )
    return code == 0


def _run_mutant(mutant: Mutant, files: list[str], *, show: bool) -> tuple[str, float]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="interlock-mutant-") as folder:
        scratch = Path(folder).resolve()
        _copy_tree(files, scratch)
        _apply(mutant, scratch)
        source = _imported_from(mutant.module, scratch)
        if source != scratch / mutant.path:
            raise SystemExit(f"mutant {mutant.name!r}: {mutant.module} imported from {source}")
        code = _run_tests(mutant.tests, scratch, show=show)
    verdict = {0: "SURVIVED", 1: "killed"}.get(code, f"broken (pytest exit {code})")
    return verdict, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only the mutant with this name")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--show", action="store_true", help="print the end of each test run")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list or not mutants:
        for m in MUTANTS:
            print(f"{m.name}: {m.path} — {m.why}")
        return 0 if args.list else 2
    files = _tracked_files()
    started = time.monotonic()
    if not args.no_baseline and not _baseline(mutants, files):
        print("the mutants' tests fail on the unmutated tree: fix them first", file=sys.stderr)
        return 1
    rows = []
    for mutant in mutants:
        verdict, seconds = _run_mutant(mutant, files, show=args.show)
        rows.append((mutant.name, len(mutant.tests), verdict, seconds))
        print(f"  {mutant.name}: {verdict} ({seconds:.1f} s)", flush=True)
    width = max(len(name) for name, *_ in rows)
    print(f"\n{'mutant':<{width}}  tests  {'result':<10}  seconds")
    for name, count, verdict, seconds in rows:
        print(f"{name:<{width}}  {count:>5}  {verdict:<10}  {seconds:7.1f}")
    print(f"total {time.monotonic() - started:.1f} s")
    return 0 if all(verdict == "killed" for _, _, verdict, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
