"""Runs inside a network-isolated sandbox, as the first process of its namespaces: brings up
loopback, relays ``127.0.0.1:PORT`` to the gateway's Unix socket (the one way out), runs the
command (the sandbox's supervisor) and exits as it did; every process of the namespace dies
with it.

    python -I -S relay.py --port 8123 --unix /tmp/gw.sock -- CMD ...

Standard library only, run by path in isolated mode (like ``supervisor.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_FORWARDED = {signal.SIGTERM, signal.SIGINT}


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


async def run(port: int | None, unix_path: str | None, command: Sequence[str]) -> int:
    """The command's return code, negative for a signal (as ``asyncio`` reports it)."""
    server = None
    if port is not None and unix_path is not None:
        server = await asyncio.start_server(_relay_to(unix_path), "127.0.0.1", port)
    process = await asyncio.create_subprocess_exec(*command)
    loop = asyncio.get_running_loop()
    # As the namespace's first process, signals reach us only through handlers: pass them on.
    # The sandbox starts us with them blocked, so one sent before now is pending, not lost.
    for signum in _FORWARDED:
        loop.add_signal_handler(signum, process.send_signal, signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
    code = await process.wait()
    if server is not None:
        server.close()
    return code


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rollway.sandbox.relay")
    parser.add_argument("--port", type=int)
    parser.add_argument("--unix")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    bring_up_loopback()
    code = asyncio.run(run(args.port, args.unix, command))
    os._exit(code & 0xFF if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
