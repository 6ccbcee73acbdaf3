"""Clients that connect and then send nothing, or only part of a request: what a slow or
hostile peer does to a server exposed on a network."""

from __future__ import annotations

import selectors
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

PARTIAL_HEADERS = b"POST /v1/rollouts/x/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty"
PARTIAL_BODY = (
    b"POST /v1/rollouts/x/chat/completions HTTP/1.1\r\nHost: x\r\n"
    b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"messages": ['
)


@dataclass
class IdleClients:
    """``count`` connections to ``url``, a third silent, a third with partial headers, a
    third with a partial body; ``closed_after`` says when the server closed each."""

    url: str
    count: int
    opened_at: dict[socket.socket, float] = field(default_factory=dict)
    closed_after: dict[socket.socket, float] = field(default_factory=dict)

    def __enter__(self) -> IdleClients:
        parts = urlsplit(self.url)
        for index in range(self.count):
            sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
            sock.sendall((b"", PARTIAL_HEADERS, PARTIAL_BODY)[index % 3])
            sock.setblocking(False)
            self.opened_at[sock] = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in self.opened_at:
            sock.close()

    def wait_closed(self, timeout: float) -> None:
        """Read each connection until the server closes it, for at most ``timeout`` seconds."""
        with selectors.DefaultSelector() as selector:
            for sock in self.opened_at:
                selector.register(sock, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while len(self.closed_after) < self.count and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.5):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if not _read_some(sock):
                        self.closed_after[sock] = time.monotonic() - self.opened_at[sock]
                        selector.unregister(sock)


def _read_some(sock: socket.socket) -> bool:
    """False once the peer has closed (an answer, such as a 401, may come first)."""
    try:
        return bool(sock.recv(65536))
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
