"""Run the proxy in-process (on the test's event loop) with a config written as YAML text."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from ledger import LedgerStore
from policies.config import parse_config_text
from policies.model import Config
from proxy.app import create_app
from proxy.state import LEDGER, SCHEDULER

__all__ = ["RunningProxy", "running_proxy", "serving"]


@dataclass
class RunningProxy:
    app: web.Application
    base: str
    config: Config

    def mcp_url(self, upstream: str) -> str:
        return f"{self.base}/mcp/{upstream}"

    @property
    def store(self) -> LedgerStore:
        store = self.app[LEDGER].store
        assert store is not None, self.app[LEDGER].error
        return store

    @property
    def scheduler(self) -> Any:
        return self.app[SCHEDULER]


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on a free loopback port until the block ends; yields its base URL."""
    runner = web.AppRunner(app, shutdown_timeout=2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running_proxy(config_text: str, folder: Path) -> AsyncIterator[RunningProxy]:
    """Start the proxy on a free loopback port; the ledger (if relative) lives in `folder`."""
    config = parse_config_text(
        textwrap.dedent(config_text), str(folder / "interlock.yaml"), environ={}, base_dir=folder
    )
    app = create_app(config)
    async with serving(app) as base:
        yield RunningProxy(app=app, base=base, config=config)
