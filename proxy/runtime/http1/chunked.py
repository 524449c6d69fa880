"""Decoding a chunked body (RFC 9112 section 7.1) as its bytes arrive (pure)."""

from __future__ import annotations

import re

from proxy.runtime.http1.head import BadAnswer

__all__ = ["ChunkedDecoder"]

_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_MAX_LINE = 4096  # a longer chunk-size line (with extensions) or trailer line is refused


class ChunkedDecoder:
    """Takes what it can from a buffer: `decode(buffer)` removes the bytes it consumed from it and
    returns the body data they carried (maybe `b""`: a size line split across reads, say).

    `done` turns true once the last chunk and the trailer section have been read; trailers are
    dropped (the proxy relays the body, and the downstream writes its own framing)."""

    __slots__ = ("_left", "_state", "done")

    def __init__(self) -> None:
        self._left = 0  # data bytes left in the current chunk
        self._state = "size"  # size | data | data_end | trailer
        self.done = False

    def decode(self, buffer: bytearray) -> bytes:
        out: list[bytes] = []
        while buffer and not self.done:
            if self._state == "data":
                take = min(self._left, len(buffer))
                out.append(bytes(buffer[:take]))
                del buffer[:take]
                self._left -= take
                if self._left == 0:
                    self._state = "data_end"
                continue
            line = self._line(buffer)
            if line is None:
                break
            if self._state == "size":
                self._size(line)
            elif self._state == "data_end":
                if line:
                    raise BadAnswer("a chunk of the answer is longer than its size says")
                self._state = "size"
            elif not line:  # trailer section ends with an empty line
                self.done = True
        return b"".join(out)

    def _size(self, line: bytes) -> None:
        digits = line.split(b";", 1)[0].strip(b" \t")
        if not _HEX.fullmatch(digits):  # int() alone would take "0x1f", "+1f" and "1_f"
            raise BadAnswer("a chunk size in the answer is not a hexadecimal number")
        size = int(digits, 16)
        self._left = size
        self._state = "data" if size else "trailer"

    @staticmethod
    def _line(buffer: bytearray) -> bytes | None:
        end = buffer.find(b"\r\n", 0, _MAX_LINE + 2)
        if end < 0:
            if len(buffer) > _MAX_LINE:
                raise BadAnswer("a line of the answer's chunked framing is too long")
            return None
        line = bytes(buffer[:end])
        del buffer[: end + 2]
        return line
