"""A SIGTERM stops ``rollway run`` as Ctrl-C does. Slurm, Kubernetes and ``ray job stop`` end a
job with SIGTERM, whose default action kills the process at once: no summary, the lease left
behind. Raised as a ``KeyboardInterrupt`` on the main thread, it takes Ctrl-C's path through
the batch (rollouts cancelled, each recorded, the summary written, the lease released) and ends
with its own exit status, 143 (128 + 15, what a shell reports for a SIGTERM)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

from rollway.cli.failures import EXIT_INTERRUPTED, EXIT_TERMINATED


class Terminated(KeyboardInterrupt):
    """The SIGTERM, where Ctrl-C would raise ``KeyboardInterrupt``."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: a SIGTERM raises ``Terminated`` on the main thread. Ray's ``init`` sets its own
    handler (``sys.exit``) in a driver, so this is entered again once the client is up."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_status(interrupt: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED


def what_stopped(interrupt: KeyboardInterrupt) -> str:
    return "terminated (SIGTERM)" if isinstance(interrupt, Terminated) else "interrupted"


def _raise_terminated(signum: int, frame: FrameType | None) -> NoReturn:
    raise Terminated
