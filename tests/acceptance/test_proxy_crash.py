"""The proxy killed with SIGKILL mid-call: the record survives and nothing is re-sent blindly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.integration.mcp_proxy_harness import RawAnswer, RawMcp
from tests.integration.mcp_servers import REPO_ROOT, running_upstream
from tests.integration.waiting import wait_until

KEY = "interlock/idempotency-key"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(process: subprocess.Popen[str], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "listening on" in line:
            return
        if not line and process.poll() is not None:
            raise AssertionError(f"proxy exited with {process.returncode}")
    raise AssertionError("proxy did not start listening in time")


@contextlib.contextmanager
def proxy_process(
    config: Path, launcher: Sequence[str] = ("-m", "proxy")
) -> Iterator[subprocess.Popen[str]]:
    """`interlock serve` until it listens; `launcher`: what runs the CLI (after the interpreter)."""
    env = {**os.environ, "INTERLOCK_LOG_LEVEL": "WARNING"}
    process = subprocess.Popen(
        [sys.executable, *launcher, "serve", "--config", str(config)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        _wait_listening(process)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def write_config(folder: Path, port: int, upstreams: str, more: str = "") -> Path:
    """`folder/interlock.yaml`: listening on `port`, a SQLite ledger, the `upstreams:` entries
    given (indented YAML lines), then `more` (further top-level YAML)."""
    config = folder / "interlock.yaml"
    head = f'listen: "127.0.0.1:{port}"\nledger: {{url: "sqlite:///ledger.db"}}\nupstreams:\n'
    config.write_text(head + upstreams + more)
    return config


def interlock(config: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", *args, "--config", str(config)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def unknown_entries(config: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(
        interlock(config, "ledger", "list", "--state", "unknown", "--json")
    )
    return entries


@pytest.mark.slow
async def test_sigkill_mid_call_leaves_unknown_and_refuses_until_resolved(tmp_path: Path):
    """SIGKILL during a side-effecting call → unknown after the lease; resend refused; retry = 2."""
    port = _free_port()
    with running_upstream() as upstream:
        config = tmp_path / "interlock.yaml"
        config.write_text(
            f"""
listen: "127.0.0.1:{port}"
ledger: {{url: "sqlite:///ledger.db", lease_s: 1, sweep_interval_s: 0.2}}
upstreams:
  up: {{mcp: "{upstream.url}"}}
"""
        )
        url = f"http://127.0.0.1:{port}/mcp/up"
        args = {"seconds": 1.0, "tag": "crash"}
        with proxy_process(config) as first:

            async def in_flight() -> None:
                async with Client(url, mode="legacy") as client:
                    await client.call_tool("hold", args, meta={KEY: "crash-key"})

            task = asyncio.create_task(in_flight())
            deadline = time.monotonic() + 10
            while "crash" not in upstream.stats()["started"]:
                assert time.monotonic() < deadline, "the call never reached the upstream"
                await asyncio.sleep(0.02)
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            task.cancel()  # the client's own reconnect attempts are not under test
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5)

        with proxy_process(config) as second:
            deadline = time.monotonic() + 15
            while not (entries := unknown_entries(config)):
                assert time.monotonic() < deadline, "the expired lease never became unknown"
                await asyncio.sleep(0.2)
            entry_id = entries[0]["id"]
            assert entries[0]["attempt"] == 1

            async with Client(url, mode="legacy") as client:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("hold", args, meta={KEY: "crash-key"})
            assert refused.value.error.code == -32052
            assert upstream.stats()["started"].count("crash") == 1

            interlock(config, "ledger", "resolve", entry_id, "--as", "retry", "--note", "PSP: none")
            async with Client(url, mode="legacy") as client:
                result = await client.call_tool("hold", args, meta={KEY: "crash-key"})
            assert not result.is_error
            assert upstream.stats()["started"].count("crash") == 2
            shown = json.loads(interlock(config, "ledger", "show", entry_id, "--json"))
            assert shown["attempt"] == 2
            assert shown["state"] == "succeeded"

            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=20) == 0


@contextlib.contextmanager
def _serve_with_upstream(
    folder: Path, grace_s: float
) -> Iterator[tuple[Any, Path, subprocess.Popen[str], str]]:
    """A test MCP upstream and `interlock serve` in front of it with `shutdown_grace_s`; yields
    (upstream, config path, proxy process, the upstream's MCP URL through the proxy)."""
    port = _free_port()
    with running_upstream() as upstream:
        up = f'  up: {{mcp: "{upstream.url}", timeout_s: 60}}\n'
        config = write_config(folder, port, up, f"shutdown_grace_s: {grace_s}\n")
        with proxy_process(config) as proxy:
            yield upstream, config, proxy, f"http://127.0.0.1:{port}/mcp/up"


async def _hold_until_started(
    http: aiohttp.ClientSession, url: str, upstream: Any, key: str, seconds: float
) -> asyncio.Task[RawAnswer]:
    """Send a side-effecting `hold` (tagged and keyed `key`) and return once the upstream runs it.

    A plain modern-era (stateless) POST: the SDK client also keeps background requests that fail
    once the listener closes, which is not what the SIGTERM tests are about."""
    arguments = {"seconds": seconds, "tag": key}
    call = asyncio.create_task(RawMcp(http, url).call_modern(1, "hold", arguments, {KEY: key}))
    await wait_until(
        lambda: key in upstream.stats()["started"], what="the call never reached the upstream"
    )
    return call


@pytest.mark.slow
async def test_sigterm_lets_in_flight_calls_finish_and_exits_zero(tmp_path: Path):
    """SIGTERM: the call in flight completes within the grace period and the process exits 0."""
    with _serve_with_upstream(tmp_path, grace_s=10) as (upstream, config, proxy, url):
        async with aiohttp.ClientSession() as http:
            call = await _hold_until_started(http, url, upstream, "drain", 1.0)
            proxy.send_signal(signal.SIGTERM)
            answer = await asyncio.wait_for(call, 15)
        assert answer.status == 200
        assert '"held 1.0 s"' in answer.body.decode()
        assert proxy.wait(timeout=20) == 0
    shown = json.loads(interlock(config, "ledger", "show", "drain", "--json"))
    assert shown["state"] == "succeeded"


@pytest.mark.slow
async def test_sigterm_records_a_call_still_running_after_the_grace_as_unknown(tmp_path: Path):
    """SIGTERM with a side-effecting call that outlasts `shutdown_grace_s`: the proxy does not
    wait for it, records it `unknown` before the ledger closes (never left `running`), and exits
    0; the upstream saw the call once."""
    with _serve_with_upstream(tmp_path, grace_s=0.5) as (upstream, config, proxy, url):
        async with aiohttp.ClientSession() as http:
            call = await _hold_until_started(http, url, upstream, "outlasts-grace", 60.0)
            proxy.send_signal(signal.SIGTERM)
            # Far less than the 60 s the tool holds: shutdown did not wait for the call.
            exit_code = await asyncio.to_thread(proxy.wait, 30)
            with contextlib.suppress(aiohttp.ClientError):
                await asyncio.wait_for(call, 5)
        assert exit_code == 0
        assert upstream.stats()["started"].count("outlasts-grace") == 1
    shown = json.loads(interlock(config, "ledger", "show", "outlasts-grace", "--json"))
    assert shown["state"] == "unknown"
