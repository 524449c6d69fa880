"""Test-wide settings, read before the proxy's modules are imported.

`INTERLOCK_CHECK_WIRE=1`: every message the proxy relays as the bytes it came as is re-read and
compared with its parsed value, so a change made in place (which would send stale bytes) fails
the test that makes it (production skips that second parse; see `proxy.mcp.wire.jsonrpc`). The
`interlock serve` processes the tests start inherit it.
"""

import os

os.environ["INTERLOCK_CHECK_WIRE"] = "1"
