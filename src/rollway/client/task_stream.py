"""A step source's tasks: any iterable (a list, a generator, a ``datasets`` split) over epochs,
each row at a position (its place in the stream, counted across epochs) that a restarted trainer
finds again, since the same iterable yields the same rows in the same order. Positions whose
group was handed to the trainer or set aside are *settled*; a restarted stream skips exactly
those, so no task is repeated or skipped."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rollway.checks import check_count
from rollway.errors import ConfigError, StoredDataError


@dataclass
class Settled:
    """The settled positions: every one below ``below``, and those in ``above``. Groups finish
    out of order, so a few positions past ``below`` settle early; ``above`` stays as small as
    the groups in flight."""

    below: int = 0
    above: set[int] = field(default_factory=set)

    def add(self, position: int) -> None:
        self.above.add(position)
        while self.below in self.above:
            self.above.discard(self.below)
            self.below += 1

    def covers(self, position: int) -> bool:
        return position < self.below or position in self.above

    def to_dict(self) -> dict[str, Any]:
        return {"settled_below": self.below, "settled_above": sorted(self.above)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> Settled:
        below, above = data.get("settled_below"), data.get("settled_above")
        listed = isinstance(above, list) and all(isinstance(p, int) for p in above)
        if not isinstance(below, int) or below < 0 or not isinstance(above, list) or not listed:
            raise StoredDataError(
                f"{where}: settled_below must be a whole number and settled_above a list of "
                "them; delete the file to start the task stream from its beginning",
                "settled_below",
            )
        return cls(below, set(above))


class TaskStream:
    """Hands out ``(position, task)`` in stream order, requeued tasks first, skipping settled
    positions. ``epochs`` passes over ``tasks``: more than one needs an iterable that can be
    iterated again (a list, a ``datasets`` split), not a generator."""

    def __init__(self, tasks: Iterable[dict[str, Any]], epochs: int, settled: Settled) -> None:
        check_count("epochs", epochs, least=1)
        if epochs > 1 and iter(tasks) is tasks:
            raise ConfigError(
                f"epochs={epochs} needs tasks that can be iterated again (a list, a datasets "
                "split), not a one-pass iterator or generator: pass list(tasks)",
                "epochs",
            )
        self.settled = settled
        self._tasks, self._epochs = tasks, epochs
        self._rows = self._each()
        self._requeued: deque[tuple[int, dict[str, Any]]] = deque()
        self._exhausted = False

    @property
    def more(self) -> bool:
        """Whether ``next`` may give another task."""
        return bool(self._requeued) or not self._exhausted

    def requeue(self, position: int, task: dict[str, Any]) -> None:
        """Run ``task`` again (its group was dropped); it goes ahead of new rows."""
        self._requeued.append((position, task))

    def next(self) -> tuple[int, dict[str, Any]] | None:
        if self._requeued:
            return self._requeued.popleft()
        for position, task in self._rows:
            if not self.settled.covers(position):
                return position, task
        self._exhausted = True
        return None

    def _each(self) -> Iterator[tuple[int, dict[str, Any]]]:
        position = 0
        for _ in range(self._epochs):
            for index, task in enumerate(self._tasks):
                if not isinstance(task, dict):
                    raise ConfigError(
                        f"tasks[{index}] must be a dict, not {type(task).__name__}", "tasks"
                    )
                yield position, task
                position += 1
