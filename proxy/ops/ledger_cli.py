"""`interlock ledger …`: the ledger, read and reconciled straight on its database.

The commands work while the proxy is down: they open the database named by `--ledger-url`,
`INTERLOCK_LEDGER_URL` or the config file's `ledger.url`. Tables for people (rich), `--json` for
scripts. Exit status: 0 done, 1 refused (unknown entry, ambiguous reference, illegal resolve),
2 bad usage, 3 the ledger database cannot be reached or is not migrated.

Until the `interlock` command exists everywhere, `python -m proxy.ops.ledger_cli …` runs the same
commands (`main` below).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ledger import (
    DEFAULT_MAX_ATTEMPTS,
    EntryState,
    EntryView,
    LedgerError,
    LedgerStore,
    LedgerUnavailable,
    TransitionView,
    entry_json,
    migrate_ledger,
    transition_json,
)
from policies.model import LedgerSettings

if TYPE_CHECKING:  # rich is imported only when a ledger command runs (`serve` never needs it)
    from rich.console import Console
    from rich.table import Table

__all__ = ["EXIT_REFUSED", "EXIT_UNAVAILABLE", "add_ledger_parser", "main", "run_ledger_command"]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_Handler = Callable[[argparse.Namespace, LedgerSettings, "Console"], Coroutine[Any, Any, int]]


def add_ledger_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `ledger` and its subcommands to an `interlock` parser's subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", dest="config", default=None, help="configuration file")
    common.add_argument(
        "--ledger-url",
        dest="ledger_url",
        default=None,
        help="ledger database URL, instead of a config (or INTERLOCK_LEDGER_URL)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    ledger = subparsers.add_parser("ledger", help="inspect and reconcile the side-effect ledger")
    commands = ledger.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", parents=[common], help="entries, newest first")
    listing.add_argument(
        "--state",
        action="append",
        type=_states,
        default=[],
        help="e.g. unknown or running,accepted",
    )
    listing.add_argument("--upstream", default=None)
    listing.add_argument("--tenant", default=None)
    listing.add_argument("--since", type=_since, default=None, help="30m, 24h, 7d or ISO time")
    listing.add_argument("--limit", type=_positive_int, default=100)

    show = commands.add_parser("show", parents=[common], help="one entry and its history")
    show.add_argument("reference", metavar="ID|KEY", help="entry id, unique id prefix, or key")

    resolve = commands.add_parser("resolve", parents=[common], help="reconcile an entry")
    resolve.add_argument("reference", metavar="ID|KEY")
    resolve.add_argument(
        "--as", dest="as_", required=True, choices=("succeeded", "failed", "retry")
    )
    resolve.add_argument("--note", default=None, help="why: what you checked")
    resolve.add_argument("--actor", default=None, help="who (default: operator:$USER)")
    resolve.add_argument(
        "--max-attempts",
        type=_positive_int,
        default=DEFAULT_MAX_ATTEMPTS,
        help=f"retry budget; past it retry blocks the entry (default {DEFAULT_MAX_ATTEMPTS})",
    )

    commands.add_parser("stats", parents=[common], help="counts by state and upstream")
    commands.add_parser("migrate", parents=[common], help="create or upgrade the schema")
    purge = commands.add_parser("purge", parents=[common], help="delete old closed entries")
    purge.add_argument(
        "--older-than", type=_duration, default=None, help="default: ledger.retention_h"
    )
    commands.add_parser("sweep", parents=[common], help="expired leases → unknown, now")


def run_ledger_command(args: argparse.Namespace, settings: LedgerSettings) -> int:
    """Run the parsed `ledger` subcommand against `settings.url`; return the exit status."""
    # Piped output is read by people later (logs, tickets): do not cut it to 80 columns.
    from rich.console import Console

    out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    handler = _HANDLERS[args.ledger_command]
    try:
        return asyncio.run(handler(args, settings, out))
    except LedgerUnavailable as error:
        _complain(f"ledger unavailable: {error}")
        return EXIT_UNAVAILABLE
    except LedgerError as error:
        _complain(str(error))
        return EXIT_REFUSED


def _complain(message: str) -> None:
    print(f"interlock ledger: {message}", file=sys.stderr)


@contextlib.asynccontextmanager
async def _opened(settings: LedgerSettings) -> AsyncIterator[LedgerStore]:
    """The ledger, never migrated or created by a read or an operator command; closed after."""
    owner = f"cli:{socket.gethostname()}:{os.getpid()}"
    store = await LedgerStore.open(settings, owner=owner, migrate=False)
    try:
        yield store
    finally:
        await store.close()


async def _cmd_list(args: argparse.Namespace, settings: LedgerSettings, out: Console) -> int:
    async with _opened(settings) as store:
        entries = await store.list_entries(
            state=[s for group in args.state for s in group] or None,
            upstream=args.upstream,
            tenant=args.tenant,
            since=args.since,
            limit=args.limit,
        )
    if args.json:
        _print_json([entry_json(e) for e in entries])
        return EXIT_OK
    from rich.table import Table

    table = Table("id", "state", "attempt", "tenant", "upstream", "tool", "key", "updated", "why")
    for e in entries:
        table.add_row(
            e.id,
            _state(e.state),
            str(e.attempt),
            e.tenant,
            e.upstream,
            e.tool,
            e.idempotency_key or "-",
            _when(e.updated_at),
            e.note or e.error or "",
        )
    out.print(table)
    out.print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    return EXIT_OK


async def _cmd_show(args: argparse.Namespace, settings: LedgerSettings, out: Console) -> int:
    async with _opened(settings) as store:
        entry, history = await store.get(args.reference)
    if args.json:
        _print_json(entry_json(entry) | {"history": [transition_json(t) for t in history]})
        return EXIT_OK
    out.print(_entry_table(entry))
    out.print(_history_table(history))
    return EXIT_OK


async def _cmd_resolve(args: argparse.Namespace, settings: LedgerSettings, out: Console) -> int:
    async with _opened(settings) as store:
        entry = await store.resolve(
            args.reference,
            as_=args.as_,
            note=args.note,
            actor=args.actor or _operator(),
            max_attempts=args.max_attempts,
        )
    if args.json:
        _print_json(entry_json(entry))
        return EXIT_OK
    out.print(f"entry {entry.id} (key {entry.idempotency_key or '-'}) is now {_state(entry.state)}")
    if entry.state is EntryState.ACCEPTED:
        out.print(f"the next send with this key runs attempt {entry.attempt + 1}")
    elif entry.state is EntryState.BLOCKED:
        used = entry.operator_retries + 1
        out.print(f"retry budget spent ({used} of {args.max_attempts} attempts): blocked")
    return EXIT_OK


async def _cmd_stats(args: argparse.Namespace, settings: LedgerSettings, out: Console) -> int:
    async with _opened(settings) as store:
        counts = await store.stats()
        waiting_since = await store.oldest_in_state(EntryState.ACCEPTED)
    if args.json:
        rows = [{"state": s, "upstream": u, "count": n} for (s, u), n in sorted(counts.items())]
        _print_json(rows)
        return EXIT_OK
    states = [s.value for s in EntryState]
    from rich.table import Table

    table = Table("upstream", *states, "total")
    for upstream in sorted({u for _, u in counts}):
        row = [counts.get((s, upstream), 0) for s in states]
        table.add_row(upstream, *map(str, row), str(sum(row)))
    totals = [sum(n for (s, _), n in counts.items() if s == state) for state in states]
    table.add_row("all", *map(str, totals), str(sum(totals)), style="bold")
    out.print(table)
    if waiting_since is not None:
        waiting = sum(n for (s, _), n in counts.items() if s == EntryState.ACCEPTED)
        age = max(0.0, (datetime.now(UTC) - waiting_since).total_seconds())
        out.print(
            f"accepted (deferred work waiting to start): {waiting}; "
            f"the oldest waits since {_when(waiting_since)} ({age:.0f} s)"
        )
    return EXIT_OK


async def _cmd_migrate(args: argparse.Namespace, settings: LedgerSettings, out: Console) -> int:
    before, after = await migrate_ledger(settings)
    if args.json:
        _print_json({"from": before, "to": after})
    elif before == after:
        out.print(f"ledger schema is current (revision {after})")
    else:
        out.print(f"ledger schema migrated: {before or '(empty)'} → {after}")
    return EXIT_OK


async def _cmd_purge(args: argparse.Namespace, settings: LedgerSettings, out: Console) -> int:
    async with _opened(settings) as store:
        purged = await store.purge(older_than=args.older_than)
    if args.json:
        _print_json({"purged": purged})
    else:
        out.print(f"purged {purged} closed entr{'y' if purged == 1 else 'ies'}")
    return EXIT_OK


async def _cmd_sweep(args: argparse.Namespace, settings: LedgerSettings, out: Console) -> int:
    async with _opened(settings) as store:
        swept = await store.sweep_expired()
    if args.json:
        _print_json({"swept": swept})
    else:
        out.print(f"{swept} expired lease{'' if swept == 1 else 's'} → unknown")
    return EXIT_OK


_HANDLERS: dict[str, _Handler] = {
    "list": _cmd_list,
    "show": _cmd_show,
    "resolve": _cmd_resolve,
    "stats": _cmd_stats,
    "migrate": _cmd_migrate,
    "purge": _cmd_purge,
    "sweep": _cmd_sweep,
}


def _entry_table(entry: EntryView) -> Table:
    data = entry_json(entry)
    from rich.table import Table

    table = Table("field", "value", title=f"entry {entry.id}")
    for name in (
        "state", "attempt", "tenant", "upstream", "tool", "idempotency_key", "key_source",
        "fingerprint", "owner", "fencing_token", "lease_expires_at", "work_class", "run_id",
        "trace_id", "created_at", "started_at", "finished_at", "updated_at", "error",
        "retry_after_s", "note", "outcome_hash", "outcome_retained", "outcome", "arguments",
        "task_id", "request_bytes",
    ):  # fmt: skip
        value = data[name]
        if value is not None:
            table.add_row(name, _state(entry.state) if name == "state" else str(value))
    return table


def _history_table(history: Sequence[TransitionView]) -> Table:
    from rich.table import Table

    table = Table("at", "from", "to", "attempt", "token", "actor", "reason", "evidence")
    for t in history:
        evidence = "" if t.evidence is None else json.dumps(t.evidence, sort_keys=True)
        table.add_row(
            _when(t.at),
            t.from_state or "(new)",
            t.to_state,
            str(t.attempt),
            str(t.fencing_token),
            t.actor,
            t.reason,
            evidence,
        )
    table.title = "history"
    return table


_STATE_STYLE = {
    EntryState.SUCCEEDED: "green",
    EntryState.FAILED: "red",
    EntryState.UNKNOWN: "bold yellow",
    EntryState.BLOCKED: "bold red",
    EntryState.RUNNING: "cyan",
}


def _state(state: EntryState) -> str:
    style = _STATE_STYLE.get(state)
    return f"[{style}]{state.value}[/]" if style else state.value


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _operator() -> str:
    try:
        return f"operator:{getpass.getuser()}"
    except (OSError, KeyError):  # no login name in some containers
        return "operator"


def _states(text: str) -> list[str]:
    states = [part.strip() for part in text.split(",") if part.strip()]
    known = {s.value for s in EntryState}
    unknown = [s for s in states if s not in known]
    if unknown or not states:
        raise argparse.ArgumentTypeError(
            f"unknown state {', '.join(unknown) or text!r}; states: {', '.join(sorted(known))}"
        )
    return states


def _duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 30m, 24h or 7d")
    return timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])


def _since(text: str) -> datetime:
    if _DURATION.match(text.strip()):
        return datetime.now(UTC) - _duration(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (30m, 24h) nor an ISO 8601 time"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _settings_from(args: argparse.Namespace) -> LedgerSettings:
    url = args.ledger_url or os.environ.get("INTERLOCK_LEDGER_URL")
    if url:
        return LedgerSettings(url=url)
    from policies.config import load_config  # only when a config file is the source

    return load_config(args.config or os.environ.get("INTERLOCK_CONFIG", "interlock.yaml")).ledger


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m proxy.ops.ledger_cli ledger …`: the ledger commands alone."""
    parser = argparse.ArgumentParser(prog="python -m proxy.ops.ledger_cli")
    add_ledger_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    try:
        settings = _settings_from(args)
    except (ValueError, LedgerError) as error:  # policies.config.ConfigError is a ValueError
        _complain(str(error))
        return EXIT_USAGE
    return run_ledger_command(args, settings)


if __name__ == "__main__":
    sys.exit(main())
