"""JSON parsing on the data path: msgspec where it can, the standard library where it cannot.

`loads` accepts exactly what `json.loads` accepts and returns equal values: msgspec parses the
common case several times faster (integers of any size stay exact, as the standard parser keeps
them); a document msgspec refuses (invalid UTF-8, `NaN` or `Infinity`, a float beyond a double,
a lone surrogate escape, nesting too deep for it, ...) is handed to `json.loads`, which decides
(and raises `ValueError` or `RecursionError` as before).

`RawJson` is a value left as its JSON text (part of a message the proxy only relays): it is
parsed when something asks for its value, and the encoders write it as that value
(`encode_default` for the standard library, `orjson_default` for orjson, which copies the text).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson

__all__ = ["RawJson", "compact_text", "encode_default", "loads", "orjson_default"]

_decode = msgspec.json.Decoder().decode


def loads(raw: bytes | bytearray | str) -> Any:
    """Parse one JSON document, as `json.loads` would.

    Raises:
        ValueError: not JSON (`json.JSONDecodeError`, bad UTF-8, an integer too long to read).
        RecursionError: nesting too deep for the standard parser.
    """
    try:
        return _decode(raw)
    except (msgspec.DecodeError, UnicodeEncodeError):  # DecodeError: its ValidationError too
        return json.loads(raw)  # (UnicodeEncodeError: a text holding a lone surrogate)


def compact_text(value: Any) -> str:
    """`value` as compact JSON text (no spaces, UTF-8 characters as they are), with orjson: a
    large argument is written about ten times faster than by `json.dumps`. What orjson refuses
    (an integer beyond 64 bits, a value JSON cannot carry) goes to the standard library, which
    writes such a value as its `str()`.
    """
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


class RawJson:
    """A JSON value kept as its text (valid JSON, UTF-8); `value()` parses it.

    Compared with anything, it compares its value. Like a list or a dict, it is not hashable.
    """

    __slots__ = ("text",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, text: bytes) -> None:
        self.text = text

    def value(self) -> Any:
        """The value, parsed now (each call parses it again)."""
        return loads(self.text)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RawJson):
            other = other.value()
        result: bool = self.value() == other
        return result

    def __repr__(self) -> str:
        return f"RawJson({self.text[:60]!r}{'...' if len(self.text) > 60 else ''})"


def encode_default(value: object) -> Any:
    """`json.dumps(..., default=encode_default)`: a `RawJson` is written as its value."""
    if isinstance(value, RawJson):
        return value.value()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def orjson_default(value: object) -> Any:
    """`orjson.dumps(..., default=orjson_default)`: a `RawJson` is written as its own text."""
    if isinstance(value, RawJson):
        return orjson.Fragment(value.text)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")
