"""Token usage read from OpenAI- and Anthropic-style responses, whole JSON bodies or SSE streams.

Shapes understood (the `usage` object may sit at the top, under `message` or under `response`):
- OpenAI Chat Completions / Embeddings: `usage.prompt_tokens`, `usage.completion_tokens`; in a
  stream, the final chunk carries `usage` (if the caller asked for `stream_options.include_usage`).
- OpenAI Responses: `usage.input_tokens`, `usage.output_tokens`; streamed in `response.completed`.
- Anthropic Messages: `usage.input_tokens` (+ cache creation/read tokens), `usage.output_tokens`;
  streamed as `message_start` (input) and `message_delta` (cumulative output).

Fields present in a later usage object replace earlier ones, which matches both "one usage at the
end" and Anthropic's cumulative deltas. Nothing here raises on odd input: usage that cannot be
read is simply absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.json_codec import loads

__all__ = ["StreamUsage", "Usage", "usage_from_json"]

_INPUT_FIELDS = ("prompt_tokens", "input_tokens")
_CACHE_FIELDS = ("cache_creation_input_tokens", "cache_read_input_tokens")
_OUTPUT_FIELDS = ("completion_tokens", "output_tokens")
_MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one model call consumed, and the model that answered."""

    input_tokens: int = 0
    output_tokens: int = 0
    model: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _first_int(usage: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = _int(usage.get(name))
        if value is not None:
            return value
    return None


def _containers(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message itself and the nested objects that may carry `usage` / `model`."""
    found = [message]
    for key in ("message", "response"):
        inner = message.get(key)
        if isinstance(inner, dict):
            found.append(inner)
    return found


class _UsageAccumulator:
    """Merges usage objects as they are found: later fields replace earlier ones."""

    def __init__(self) -> None:
        self.input: int | None = None
        self.cache: dict[str, int] = {}
        self.output: int | None = None
        self.model: str | None = None

    @property
    def seen(self) -> bool:
        return self.input is not None or self.output is not None

    def merge(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        for container in _containers(message):
            if self.model is None and isinstance(container.get("model"), str):
                self.model = container["model"]
            usage = container.get("usage")
            if not isinstance(usage, dict):
                continue
            if (value := _first_int(usage, _INPUT_FIELDS)) is not None:
                self.input = value
            for name in _CACHE_FIELDS:
                if (value := _int(usage.get(name))) is not None:
                    self.cache[name] = value
            if (value := _first_int(usage, _OUTPUT_FIELDS)) is not None:
                self.output = value

    def result(self) -> Usage | None:
        if not self.seen:
            return None
        return Usage(
            input_tokens=(self.input or 0) + sum(self.cache.values()),
            output_tokens=self.output or 0,
            model=self.model,
        )


def usage_from_json(body: bytes) -> Usage | None:
    """Usage in a complete (uncompressed) JSON response body, or None if it has none."""
    try:
        message = loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    acc = _UsageAccumulator()
    acc.merge(message)
    return acc.result()


class StreamUsage:
    """Reads usage from an SSE response as its chunks are relayed (the bytes are not changed).

    Only `data:` lines are looked at, and only those that can hold usage are parsed as JSON
    (plus the first one, for the model name), so relaying a long stream stays cheap.
    """

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the unfinished last line, in pieces
        self._pending_bytes = 0
        self._acc = _UsageAccumulator()
        self._skip_line = False

    def feed(self, chunk: bytes) -> None:
        """Consume the next chunk of the stream, in order.

        Linear in the bytes fed: an unfinished line is kept as pieces and joined once, when its
        end arrives, and a line too long to hold usage is skipped without being kept.
        """
        last = chunk.rfind(b"\n")  # the lines before it are complete
        if last < 0:
            self._grow(chunk)
            return
        start = 0
        if self._skip_line:
            self._skip_line = False
            start = chunk.find(b"\n") + 1  # the rest of an overlong line
            data = chunk
        elif self._pending:
            self._pending.append(chunk)
            data = b"".join(self._pending)
            last += len(data) - len(chunk)
            self._pending, self._pending_bytes = [], 0
        else:
            data = chunk
        while start <= last:
            if self._acc.model is None:  # every line, until one names the model
                end = data.find(b"\n", start)
                self._line(data[start:end])
                start = end + 1
                continue
            # then only the lines that can hold usage: most chunks are not split into lines
            hit = data.find(b'"usage"', start, last)
            if hit < 0:
                break
            begins = data.rfind(b"\n", start, hit) + 1 or start
            end = data.find(b"\n", hit)
            self._line(data[begins:end])
            start = end + 1
        self._grow(data[last + 1 :])

    def _grow(self, piece: bytes) -> None:
        """Add `piece` to the unfinished line (or drop it, if that line is being skipped)."""
        if self._skip_line or not piece:
            return
        self._pending.append(piece)
        self._pending_bytes += len(piece)
        if self._pending_bytes > _MAX_LINE_BYTES:
            # a line this long is not a usage event; drop it rather than hold it in memory
            self._pending, self._pending_bytes = [], 0
            self._skip_line = True

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        if self._acc.model is not None and b'"usage"' not in line:
            return
        payload = line[5:].strip()
        if not payload.startswith(b"{"):
            return  # e.g. "[DONE]"
        try:
            self._acc.merge(loads(payload))
        except (ValueError, UnicodeDecodeError):
            return

    def result(self) -> Usage | None:
        """Usage seen so far (the final value once the stream has ended)."""
        if self._pending and not self._skip_line:
            self._line(b"".join(self._pending).rstrip(b"\r"))
            self._pending, self._pending_bytes = [], 0
        return self._acc.result()

    @property
    def model(self) -> str | None:
        return self._acc.model
