"""Pure helpers of the ledger: URLs, size caps, ids and the JSON shape of entries."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from ledger import EntryState, LedgerError, entry_json
from ledger.batch import (
    EntryRow,
    archived_key,
    cap_text,
    internal_key,
    new_entry_id,
    stored_outcome,
)
from ledger.db import async_url
from ledger.migrate import HEAD_REVISION, head_revision
from ledger.operations import Claim
from ledger.sqlite_connect import is_sqlite_url, sqlite_path
from ledger.views import EntryView, positional_builder
from tests.ledger_fixtures import claim_request
from tests.unit.test_ledger_states import MemoryLedger


@pytest.mark.parametrize(
    ("configured", "expected"),
    [
        ("sqlite:///interlock.db", "sqlite+aiosqlite:///interlock.db"),
        ("sqlite:////var/lib/ledger.db", "sqlite+aiosqlite:////var/lib/ledger.db"),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("postgresql://u@db:5432/ledger", "postgresql+asyncpg://u@db:5432/ledger"),
        ("postgres://u@db/ledger", "postgresql+asyncpg://u@db/ledger"),
        ("postgresql+asyncpg://u@db/ledger", "postgresql+asyncpg://u@db/ledger"),
    ],
)
def test_config_urls_map_to_async_drivers(configured: str, expected: str) -> None:
    """Config URLs name the async drivers; already-qualified URLs pass through."""
    assert async_url(configured).render_as_string() == expected


@pytest.mark.parametrize(
    "bad",
    ["mysql://db/x", "postgresql+psycopg://db/x", "sqlite://", "sqlite:///:memory:", "nonsense"],
)
def test_unusable_urls_are_refused_clearly(bad: str) -> None:
    """Other databases, other drivers and in-memory SQLite are refused with a LedgerError."""
    with pytest.raises(LedgerError, match="ledger url"):
        async_url(bad)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///ledger.db",
        "sqlite:////var/lib/interlock/ledger.db",
        "sqlite:///./relative/ledger.db",
        "sqlite:///with%20space%3F.db",
        "sqlite+aiosqlite:///ledger.db",
        "sqlite+pysqlite:////tmp/a.db",
    ],
)
def test_the_sqlite_file_is_read_from_the_url_as_the_toolkit_reads_it(url: str) -> None:
    """`ledger.sqlite_connect` finds the file without SQLAlchemy; SQLAlchemy agrees on it."""
    assert is_sqlite_url(url)
    assert str(sqlite_path(url)) == str(Path(make_url(url).database or ""))


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("sqlite://", "has no host"),
        ("sqlite://host/x.db", "has no host"),
        ("sqlite:///", "needs a file path"),
        ("sqlite:///:memory:", "needs a file path"),
        ("sqlite:///x.db?timeout=1", "options after '\\?' are not supported"),
    ],
)
def test_a_sqlite_url_the_ledger_cannot_use_is_refused_clearly(url: str, why: str) -> None:
    with pytest.raises(LedgerError, match=why):
        sqlite_path(url)
    with pytest.raises(LedgerError, match=why):
        async_url(url)  # the toolkit's engines refuse it the same way


def test_only_sqlite_urls_are_sqlite() -> None:
    assert not is_sqlite_url("postgresql://db/x")
    assert not is_sqlite_url("sqlitefoo:///x.db")
    with pytest.raises(LedgerError, match="use sqlite:///PATH"):
        sqlite_path("postgresql://db/x")


def test_cap_text_respects_utf8_byte_limit() -> None:
    """Capped text never exceeds the byte budget, never splits a character, and says it was cut."""
    assert cap_text("short", 64) == "short"
    assert cap_text(None, 64) is None
    capped = cap_text("ü" * 50, 40)
    assert capped is not None
    assert len(capped.encode()) <= 40
    assert capped.endswith("…[truncated, 100 bytes]")
    assert capped.startswith("ü")


def test_stored_outcome_keeps_bytes_up_to_cap_then_hash_only() -> None:
    """At the cap the bytes are kept; one byte over, only the sha256 is."""
    assert stored_outcome(b"1234", 4) == (b"1234", hashlib.sha256(b"1234").hexdigest(), True)
    assert stored_outcome(b"12345", 4) == (None, hashlib.sha256(b"12345").hexdigest(), False)
    assert stored_outcome(None, 4) == (None, None, True)


def test_entry_ids_sort_by_creation_time() -> None:
    """Ids are 32 hex digits whose order follows their creation time."""
    early = new_entry_id(datetime(2030, 1, 1, tzinfo=UTC))
    late = new_entry_id(datetime(2030, 1, 1, 0, 0, 1, tzinfo=UTC))
    assert len(early) == 32
    int(early, 16)
    assert early < late
    assert internal_key(early) != early


def test_entry_json_is_lossless_for_binary_outcomes() -> None:
    """JSON keeps the exact outcome bytes in base64, and text only when it is UTF-8."""
    ledger = MemoryLedger()
    entry = ledger.run(Claim(claim_request("k"))).entry
    row = ledger.ws.rows[entry.id]
    row.outcome = b"\xff\x00"
    data = entry_json(row.view())
    assert base64.b64decode(data["outcome_b64"]) == b"\xff\x00"
    assert data["outcome"] is None
    assert data["state"] == EntryState.RUNNING
    assert data["created_at"].endswith("+00:00")
    row.outcome = b'{"id": 7}'
    assert entry_json(row.view())["outcome"] == '{"id": 7}'
    json.dumps(data)


def test_head_revision_constant_matches_the_migration_scripts() -> None:
    """HEAD_REVISION (used to skip Alembic at start-up) is the newest migration script."""
    assert head_revision() == HEAD_REVISION


def _distinct_row(row_id: str, key: str) -> EntryRow:
    """A row whose every column holds a value no other column holds, so a view that took a
    value from the wrong column, or left one out, cannot equal the expected one."""
    times = [datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC) for second in range(5)]
    return EntryRow(
        id=row_id,
        tenant="tenant",
        upstream="upstream",
        tool="tool",
        idempotency_key=key,
        key_source="explicit",
        fingerprint="f" * 64,
        arguments='{"a": 1}',
        state="succeeded",
        attempt=3,
        owner="owner",
        lease_expires_at=times[0],
        fencing_token=4,
        work_class="background",
        run_id="run",
        trace_id="trace",
        created_at=times[1],
        updated_at=times[2],
        started_at=times[3],
        finished_at=times[4],
        outcome=b"outcome",
        outcome_hash="h" * 64,
        outcome_retained=False,
        error="error",
        retry_after_s=1.5,
        note="note",
        operator_retries=5,
        task_id="task",
        request=b"request",
    )


@pytest.mark.parametrize(
    ("stored", "key", "superseded"),
    [
        ("a-key", "a-key", False),
        (internal_key("0" * 32), None, False),
        (archived_key("0" * 32, "old-key"), "old-key", True),
    ],
)
def test_an_entry_view_carries_every_column_of_its_row(
    stored: str, key: str | None, superseded: bool
) -> None:
    """The view the ledger hands out is the row, field by field (keys as callers know them),
    and as frozen and hashable as one built by its dataclass constructor."""
    row = _distinct_row("0" * 32, stored)
    expected = EntryView(
        **{
            f.name: getattr(row, f.name)
            for f in dataclasses.fields(EntryView)
            if f.name not in {"idempotency_key", "state", "superseded"}
        },
        idempotency_key=key,
        state=EntryState.SUCCEEDED,
        superseded=superseded,
    )
    view = row.view()
    assert view == expected
    assert type(view.state) is EntryState
    assert hash(view) == hash(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.state = EntryState.RUNNING  # type: ignore[misc]


def test_the_positional_builder_sets_every_field_in_order() -> None:
    """`positional_builder` gives what the dataclass's own constructor gives for the same
    values, for every field, and refuses a wrong count instead of leaving a slot unset."""
    values = [f"value-{f.name}" for f in dataclasses.fields(EntryView)]
    build = positional_builder(EntryView)
    assert build(*values) == EntryView(*values)
    with pytest.raises(TypeError):
        build(*values[:-1])


def test_entry_ids_made_in_one_millisecond_sort_in_the_order_they_were_made() -> None:
    """Entries created within one millisecond (a batch shares its time) list in creation order:
    after the first id of a millisecond, the next ones count up from it; an id of an earlier
    millisecond made later still sorts by its time."""
    now = datetime(2030, 1, 1, 0, 0, 0, 5000, tzinfo=UTC)
    made = [new_entry_id(now) for _ in range(200)]
    assert made == sorted(made)
    assert len({entry[:20] for entry in made}) == 200  # a 20-digit prefix still names one
    assert {entry[:12] for entry in made} == {f"{int(now.timestamp() * 1000):012x}"}
    earlier = new_entry_id(datetime(2030, 1, 1, tzinfo=UTC))
    assert earlier < made[0]
    next_one = new_entry_id(now)  # the millisecond again, after another one: still after them
    assert next_one > made[-1]


def test_a_forked_process_never_makes_the_random_part_its_parent_makes() -> None:
    """Ids take their random bits from bytes drawn a few thousand at a time: a process forked
    with some of them left draws its own, so parent and child never make the same random part
    (nor, in the same millisecond, the same id)."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    new_entry_id(now)  # the parent holds drawn bytes not used yet
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        os.write(write_end, new_entry_id(now).encode())
        os._exit(0)
    os.close(write_end)
    parent_made = new_entry_id(now)
    _, status = os.waitpid(child, 0)
    child_made = os.read(read_end, 64).decode()
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(child_made) == 32
    assert child_made[-16:] != parent_made[-16:]
