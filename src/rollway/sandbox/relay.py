"""The network side of a namespace sandbox, run by its supervisor (the namespaces' first
process): brings up loopback and relays ``127.0.0.1:PORT`` to the gateway's Unix socket, the
one way out, from a background thread for as long as the supervisor lives.

Standard library only: the supervisor, run by path in isolated mode, loads it from beside itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import threading
from collections.abc import Awaitable, Callable

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def bring_up_loopback() -> None:
    """A new network namespace starts with ``lo`` down; we are root in it, so raise it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, bytes(14))
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, bytes(14)))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _relay_to(unix_path: str) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(unix_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    return handle


def start(port: int | None, unix_path: str | None) -> None:
    """Bring up loopback and, given both ends, relay between them in a daemon thread. The port
    is bound before this returns, so the command's first call finds it."""
    bring_up_loopback()
    if port is None or unix_path is None:
        return
    listener = socket.create_server(("127.0.0.1", port))
    threading.Thread(target=asyncio.run, args=(_serve(listener, unix_path),), daemon=True).start()


async def _serve(listener: socket.socket, unix_path: str) -> None:
    server = await asyncio.start_server(_relay_to(unix_path), sock=listener)
    await server.serve_forever()
