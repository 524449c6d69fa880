"""`interlock demo`: the guided demo behind `make demo`.

It starts the bundled demo upstream (a real `MCPServer`) and the proxy (`interlock serve`, a real
process with a SQLite ledger in a temporary folder), then drives them with the SDK's `Client` the
way an agent would, and shows what Interlock does under pressure. Everything it starts, it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.table import Table

from proxy.ops import demo_tasks
from proxy.ops.demo_tasks import DemoRow as _Row

__all__ = ["run_demo"]

if TYPE_CHECKING:
    from mcp.types import RequestParamsMeta

_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
console = Console()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(upstream_port: int, proxy_port: int) -> str:
    return f"""\
listen: "127.0.0.1:{proxy_port}"
ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
defaults: {{timeout_s: 10, deadline_s: 20}}
cost_classes:
  payments: {{max_running: 2, max_pending: 1, max_wait_s: 10}}
upstreams:
  demo:
    mcp: "http://127.0.0.1:{upstream_port}/mcp"
tools:
  - match: "demo/send_email"
    side_effect: true
    key: {{fields: [to, subject]}}
  - match: "demo/charge_card"
    side_effect: true
    cost_class: payments
    timeout_s: 1.5
"""


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited early with status {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on port {port} within {timeout_s} s")


@contextlib.contextmanager
def _process(args: list[str], port: int, cwd: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_for_port(port, process)
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _cli(workdir: Path, *args: str) -> str:
    command = [sys.executable, "-m", "proxy", *args, "--config", str(workdir / "demo.yaml")]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"interlock {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _meta(**values: str) -> RequestParamsMeta:
    """`_meta` for a tools/call: our attributes use the `interlock/` prefix."""
    return cast(
        "RequestParamsMeta", {f"interlock/{k.replace('_', '-')}": v for k, v in values.items()}
    )


def _error_data(exc: BaseException) -> dict[str, Any]:
    error = getattr(exc, "error", None)
    data = getattr(error, "data", None)
    return data if isinstance(data, dict) else {}


async def _burst(url: str, rows: list[_Row]) -> None:
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    console.rule("1. A burst of 8 payments against max_running 2, max_pending 1")

    async def one(i: int) -> str:
        async with Client(url, mode="legacy") as client:
            try:
                await client.call_tool(
                    "charge_card",
                    {"card": f"4242-{i:04d}", "amount_cents": 100 + i, "seconds": 0.5},
                    meta=_meta(**{"class": "interactive"}),
                )
                return "ran"
            except MCPError as exc:
                data = _error_data(exc)
                return f"refused {data.get('reason')} retry_after_s={data.get('retry_after_s')}"

    outcomes = await asyncio.gather(*(one(i) for i in range(8)))
    for i, outcome in enumerate(outcomes):
        console.print(f"  call {i}: {outcome}")
    refused = [o for o in outcomes if o.startswith("refused")]
    rows.append(
        _Row(
            "burst",
            f"{len(outcomes) - len(refused)} ran, {len(refused)} refused at the boundary",
            refused[0] if refused else "no refusal (machine too fast?)",
        )
    )


async def _background(url: str, rows: list[_Row]) -> None:
    from mcp import Client

    console.rule("2. A background call waits in the queue while the payments slots are busy")
    states: list[str] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        states.append(message or "")
        console.print(f"  [dim]progress[/dim] {message}")

    async with Client(url, mode="legacy") as busy, Client(url, mode="legacy") as waiter:
        hold = [
            asyncio.create_task(
                busy.call_tool(
                    "charge_card", {"card": f"5555-{i}", "amount_cents": 1, "seconds": 1}
                )
            )
            for i in range(2)
        ]
        await asyncio.sleep(0.2)
        result = await waiter.call_tool(
            "charge_card",
            {"card": "6011-0001", "amount_cents": 999, "seconds": 0.1},
            progress_callback=progress,
            meta=_meta(**{"class": "background"}),
        )
        await asyncio.gather(*hold)
    text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
    console.print(f"  served: {text}")
    rows.append(_Row("background", "queued, then served when a slot freed", " → ".join(states)))


async def _duplicate(url: str, rows: list[_Row]) -> None:
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    console.rule("3. The same email delivered again (an agent retried after a lost answer)")
    args = {"to": "ops@example.com", "subject": "Deploy done", "body": "All green."}
    reworded = {**args, "body": "Everything is green now."}
    async with Client(url, mode="legacy") as client:
        first = await client.call_tool("send_email", args)
        second = await client.call_tool("send_email", args)
        try:
            await client.call_tool("send_email", reworded)
            third = "sent (unexpected)"
        except MCPError as exc:
            third = f"refused: {_error_data(exc).get('reason')} (code {exc.error.code})"
        stats = await client.call_tool("demo_stats", {})
    replayed = (second.meta or {}).get("interlock/replayed")
    counts = stats.structured_content or {}
    if "result" in counts and isinstance(counts["result"], dict):
        counts = counts["result"]
    console.print(f"  first:     {first.content[0].text}")  # type: ignore[union-attr]
    console.print(f"  again:     replayed from the ledger = {replayed}")
    console.print(f"  reworded:  {third} — the key is to+subject, so the rewording is caught")
    console.print(f"  upstream's own counter: send_email ran {counts.get('send_email')} time(s)")
    rows.append(
        _Row(
            "duplicate",
            "the retry was replayed, a reworded retry refused",
            f"upstream counted {counts.get('send_email')} execution(s)",
        )
    )


async def _unknown(url: str, workdir: Path, rows: list[_Row]) -> None:
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    console.rule("4. A payment times out after it was sent: its outcome is unknown")
    args = {"card": "3782-0001", "amount_cents": 5000, "seconds": 4}
    meta = _meta(idempotency_key="order-1234-payment")
    async with Client(url, mode="legacy") as client:
        try:
            await client.call_tool("charge_card", args, meta=meta)
        except MCPError as exc:
            data = _error_data(exc)
            console.print(f"  answer: code {exc.error.code}, state={data.get('state')}")
        try:
            await client.call_tool("charge_card", args, meta=meta)
        except MCPError as exc:
            data = _error_data(exc)
            console.print(f"  re-send with the same key: {data.get('reason')} (not sent again)")
    listing = json.loads(_cli(workdir, "ledger", "list", "--state", "unknown", "--json"))
    entry_id = listing[0]["id"]
    console.print(f"  interlock ledger list --state unknown → {entry_id}")
    _cli(workdir, "ledger", "resolve", entry_id, "--as", "succeeded", "--note", "seen in PSP log")
    shown = json.loads(_cli(workdir, "ledger", "show", entry_id, "--json"))
    console.print(f"  interlock ledger resolve {entry_id[:8]}… --as succeeded → {shown['state']}")
    rows.append(
        _Row("timeout", "unknown, refused on re-send, then resolved", f"state {shown['state']}")
    )


def run_demo(*, keep: bool = False) -> int:
    """Run the whole demo; returns the exit status."""
    workdir = Path(tempfile.mkdtemp(prefix="interlock-demo-"))
    upstream_port, proxy_port = _free_port(), _free_port()
    (workdir / "demo.yaml").write_text(_config(upstream_port, proxy_port))
    env_python = sys.executable
    rows: list[_Row] = []
    console.print(f"[bold]Interlock demo[/bold] (work folder {workdir})")
    serve = [env_python, "-m", "proxy", "serve", "--config", str(workdir / "demo.yaml")]
    try:
        with _process(
            [env_python, str(_EXAMPLES / "demo_upstreams.py"), str(upstream_port)],
            upstream_port,
            workdir,
            workdir / "upstream.log",
        ):
            url = f"http://127.0.0.1:{proxy_port}/mcp/demo"
            with _process(serve, proxy_port, workdir, workdir / "proxy.log") as first:
                console.print(f"agent → {url} → demo upstream on port {upstream_port}")
                asyncio.run(_scenarios(url, workdir, rows))
                handles = asyncio.run(demo_tasks.before_the_crash(url))
                first.send_signal(signal.SIGKILL)  # no shutdown: the process is simply gone
                first.wait(timeout=10)
            waiting = json.loads(_cli(workdir, "ledger", "list", "--state", "accepted", "--json"))
            console.print(
                f"  SIGKILL. While the proxy is down, the ledger holds {len(waiting)} accepted "
                "task(s): interlock ledger list --state accepted"
            )
            with _process(serve, proxy_port, workdir, workdir / "proxy-restarted.log"):
                rows.append(asyncio.run(demo_tasks.after_the_restart(url, handles)))
    finally:
        if keep:
            console.print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    table = Table(title="What Interlock did")
    for column in ("step", "what happened", "proof"):
        table.add_column(column)
    for row in rows:
        table.add_row(row.step, row.what_happened, row.proof)
    console.print(table)
    return 0 if len(rows) == 5 else 1


async def _scenarios(url: str, workdir: Path, rows: list[_Row]) -> None:
    os.environ.setdefault("INTERLOCK_LOG_LEVEL", "WARNING")
    await _burst(url, rows)
    await _background(url, rows)
    await _duplicate(url, rows)
    await _unknown(url, workdir, rows)
