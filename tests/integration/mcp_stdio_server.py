"""The test upstream of `tests/integration/mcp_servers.py`, served over stdio.

Run as `python -m tests.integration.mcp_stdio_server` from the repository root (the proxy spawns
it for `mcp_stdio` upstreams; see `mcp_servers.stdio_command()`). Its counters are read with the
`count` tool, which also reports the process id (the crash and reaping tests use it).
"""

from __future__ import annotations

from tests.integration.mcp_servers import build_server


def main() -> None:
    build_server(name="interlock-test-stdio-upstream").run("stdio")


if __name__ == "__main__":
    main()
