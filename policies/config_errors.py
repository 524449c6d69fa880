"""The one error of the configuration, on its own: a process that only reports it (`interlock
serve`, whose configuration a child validates) must not load what validates it."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """The configuration cannot be used; `str()` is the message for the operator."""

    def __init__(self, message: str, *, path: str = "", line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
