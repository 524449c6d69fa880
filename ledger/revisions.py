"""The schema revision this code needs, and the child process that migrates a ledger behind it.

Opening a ledger compares the database's revision with `HEAD_REVISION` (a test keeps it equal to
the newest script under `ledger/migrations/versions`). `interlock serve` has a database that is
behind migrated by a child process (`migrate_in_child`: `ledger.migrate` run as a program), so the
migration tool, and on SQLite the whole query toolkit, never enter the proxy's memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys

from policies.model import LedgerSettings

__all__ = ["HEAD_REVISION", "VERSION_TABLE", "migrate_in_child"]

log = logging.getLogger("interlock.ledger")

HEAD_REVISION = "0004"
"""The newest revision under `ledger/migrations/versions` (a test checks they agree)."""

VERSION_TABLE = "interlock_ledger_version"
_CHILD_ERROR_CHARS = 2000  # of a failed child's stderr, in the log line that reports it


async def migrate_in_child(settings: LedgerSettings) -> bool:
    """Migrate the ledger of `settings` to head in a child process.

    True when the child did; False when it failed or could not start (logged): the caller then
    migrates in-process. The settings go to the child on its stdin, never on its command line
    (a PostgreSQL URL may hold a password).
    """
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ledger.migrate",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as error:  # no interpreter to start (an embedded or frozen Python)
        log.warning(
            "no child process for the ledger migration, migrating in this process: %s", error
        )
        return False
    try:
        _, errors = await child.communicate(json.dumps(dataclasses.asdict(settings)).encode())
    finally:
        if child.returncode is None:  # cancelled while it ran
            child.kill()
            await child.wait()
    if child.returncode != 0:
        detail = errors.decode(errors="replace").strip()[-_CHILD_ERROR_CHARS:]
        log.warning(
            "the ledger migration in a child process failed (exit %s), migrating in this "
            "process instead: %s",
            child.returncode,
            detail or "no message",
        )
        return False
    return True
