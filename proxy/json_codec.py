"""JSON parsing on the data path: orjson where it can, the standard library where it cannot.

`loads` accepts exactly what `json.loads` accepts and returns equal values: orjson parses the
common case several times faster; a document orjson refuses (invalid UTF-8, nesting too deep for
it, ...) is handed to `json.loads`, which decides (and raises `ValueError` or `RecursionError`
as before). A document with a run of 19 or more digits goes to `json.loads` directly: orjson reads
an integer beyond 64 bits as a float, where the standard parser keeps it exact.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["loads"]

# Every digit becomes "0", every other byte " ": a run of 19 digits is then a plain substring.
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19


def loads(raw: bytes | bytearray | str) -> Any:
    """Parse one JSON document, as `json.loads` would.

    Raises:
        ValueError: not JSON (`json.JSONDecodeError`, bad UTF-8, an integer too long to read).
        RecursionError: nesting too deep for the standard parser.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _LONG_RUN in data.translate(_DIGITS):
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)
