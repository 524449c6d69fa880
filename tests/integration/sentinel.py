"""A listener on a port no upstream uses: any connection to it is the proxy going somewhere the
configuration did not send it (an environment proxy, a URL from a request, a redirect)."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

__all__ = ["Sentinel"]


@dataclass
class Sentinel:
    """Counts the connections made to it; `start()` it, read `connections`, `stop()` it."""

    port: int = 0
    connections: int = 0
    _socket: socket.socket | None = None

    def start(self) -> Sentinel:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self._socket.settimeout(0.2)
        self.port = self._socket.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        assert self._socket is not None
        while True:
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def stop(self) -> None:
        if self._socket is not None:
            self._socket.close()
