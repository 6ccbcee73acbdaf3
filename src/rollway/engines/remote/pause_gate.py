"""Where a remote engine holds its generate calls while it is paused (``pause`` to ``resume``):
they wait at the gate, unsent, and ``release`` lets one go without sending it (its abort)."""

from __future__ import annotations

import asyncio


class PauseGate:
    """Holds generate calls while the engine is paused; ``release`` lets one go unsent."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._held: dict[str, asyncio.Event] = {}
        self._released: set[str] = set()

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()
        for wake in self._held.values():
            wake.set()

    async def passed(self, request_id: str) -> bool:
        """True once the gate is open; False when ``release(request_id)`` came first."""
        while not self._open.is_set() and request_id not in self._released:
            wake = self._held[request_id] = asyncio.Event()
            try:
                await wake.wait()
            finally:
                del self._held[request_id]
        if request_id in self._released:
            self._released.discard(request_id)
            return False
        return True

    def release(self, request_id: str) -> None:
        if request_id in self._held:
            self._released.add(request_id)
            self._held[request_id].set()

    def release_all(self) -> None:
        for request_id in list(self._held):
            self.release(request_id)
