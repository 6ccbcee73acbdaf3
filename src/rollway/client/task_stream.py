"""A step source's tasks: any iterable (a list, a generator, a ``datasets`` split) over epochs,
each row at a position (its place in the stream, counted across epochs) and with an identity: its
``task_key`` and which occurrence of that key it is in the stream (0 in the first epoch, 1 in the
second, or a duplicate row's). Rows whose group the trainer was done with, or that were set
aside, are *settled*, by identity: a restarted stream skips exactly those, whatever order the
rows now come in, so no task is repeated or skipped."""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rollway.checks import check_count
from rollway.errors import ConfigError, StoredDataError
from rollway.rollouts import task_key

log = logging.getLogger(__name__)

#: A row's identity: its task key and its occurrence of that key in the stream.
Identity = tuple[str, int]


@dataclass
class Occurrences:
    """The settled occurrences of one key: every one below ``below``, and those in ``above``
    (a few settle early, as groups finish out of order)."""

    below: int = 0
    above: set[int] = field(default_factory=set)

    def add(self, occurrence: int) -> None:
        self.above.add(occurrence)
        while self.below in self.above:
            self.above.discard(self.below)
            self.below += 1

    def covers(self, occurrence: int) -> bool:
        return occurrence < self.below or occurrence in self.above


@dataclass
class Settled:
    """The settled rows, by identity. ``legacy``: the positions a store written before
    identities settled (``settled_below``/``settled_above``), read against the given order."""

    keys: dict[str, Occurrences] = field(default_factory=dict)
    legacy: Occurrences | None = None

    def add(self, identity: Identity) -> None:
        key, occurrence = identity
        self.keys.setdefault(key, Occurrences()).add(occurrence)

    def covers(self, identity: Identity, position: int) -> bool:
        key, occurrence = identity
        if self.legacy is not None and self.legacy.covers(position):
            self.add(identity)  # kept by identity from now on
            return True
        known = self.keys.get(key)
        return known is not None and known.covers(occurrence)

    def __len__(self) -> int:
        return sum(o.below + len(o.above) for o in self.keys.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "settled": {
                key: o.below if not o.above else [o.below, sorted(o.above)]
                for key, o in self.keys.items()
            }
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> Settled:
        if "settled" not in data and "settled_below" in data:
            return cls(legacy=_legacy(data, where))
        raw = data.get("settled")
        if not isinstance(raw, dict):
            raise _bad(where, "settled must map each task key to its settled occurrences")
        keys: dict[str, Occurrences] = {}
        for key, value in raw.items():
            if _count(value):
                keys[key] = Occurrences(value)
            elif isinstance(value, list) and len(value) == 2 and _count(value[0]) and \
                    isinstance(value[1], list) and all(_count(v) for v in value[1]):  # fmt: skip
                keys[key] = Occurrences(value[0], set(value[1]))
            else:
                raise _bad(where, f"settled[{key!r}] must be a count or [count, [occurrences]]")
        return cls(keys)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _bad(where: str, what: str) -> StoredDataError:
    return StoredDataError(
        f"{where}: {what}; delete the file to start the task stream from its beginning",
        "settled",
    )


def _legacy(data: dict[str, Any], where: str) -> Occurrences:
    below, above = data.get("settled_below"), data.get("settled_above")
    if (
        not isinstance(below, int)
        or not _count(below)
        or not isinstance(above, list)
        or not all(_count(p) for p in above)
    ):
        raise _bad(where, "settled_below must be a whole number and settled_above a list of them")
    return Occurrences(below, set(above))


class TaskStream:
    """Hands out ``(position, identity, task)`` in stream order, requeued tasks first, skipping
    settled rows. ``epochs`` passes over ``tasks``: more than one needs an iterable that can be
    iterated again (a list, a ``datasets`` split), not a generator. ``where``: the stored
    progress, named in the warning when it matches none of these tasks."""

    def __init__(
        self, tasks: Iterable[dict[str, Any]], epochs: int, settled: Settled, where: str = ""
    ) -> None:
        check_count("epochs", epochs, least=1)
        if epochs > 1 and iter(tasks) is tasks:
            raise ConfigError(
                f"epochs={epochs} needs tasks that can be iterated again (a list, a datasets "
                "split), not a one-pass iterator or generator: pass list(tasks)",
                "epochs",
            )
        self.settled = settled
        self._tasks, self._epochs, self._where = tasks, epochs, where
        self._rows = self._each()
        self._requeued: deque[tuple[int, Identity, dict[str, Any]]] = deque()
        self._peeked: tuple[int, Identity, dict[str, Any]] | None = None
        self._exhausted = False
        self._skipped = 0
        self._stored = len(settled) if settled.legacy is None else 0
        if self._stored and iter(tasks) is not tasks:
            # Tasks that can be read again are checked now, before anything runs.
            keys = set(settled.keys)
            if not any(task_key(t) in keys for t in tasks if isinstance(t, dict)):
                self._warn_unmatched()
                self._stored = 0

    @property
    def more(self) -> bool:
        """Whether ``next`` gives another task (looking one row ahead: a step must not be
        handed empty for tasks that are not there)."""
        if self._requeued or self._peeked is not None:
            return True
        self._peeked = self._pull()
        return self._peeked is not None

    def requeue(self, position: int, identity: Identity, task: dict[str, Any]) -> None:
        """Run ``task`` again (its group was dropped); it goes ahead of new rows."""
        self._requeued.append((position, identity, task))

    def next(self) -> tuple[int, Identity, dict[str, Any]] | None:
        if self._requeued:
            return self._requeued.popleft()
        drawn, self._peeked = self._peeked or self._pull(), None
        return drawn

    def _pull(self) -> tuple[int, Identity, dict[str, Any]] | None:
        if self._exhausted:
            return None
        for position, identity, task in self._rows:
            if not self.settled.covers(identity, position):
                return position, identity, task
            self._skipped += 1
        self._exhausted = True
        if self._stored and not self._skipped:
            self._warn_unmatched()
            self._stored = 0
        return None

    def _warn_unmatched(self) -> None:
        log.warning(
            "%s records %d settled tasks, none of them among the tasks given, so every task "
            "given runs (give each task set its own exp_id, or pass resume=False to start "
            "afresh on purpose)",
            self._where or "the stored progress",
            self._stored,
            extra={"stage": "step"},
        )

    def _each(self) -> Iterator[tuple[int, Identity, dict[str, Any]]]:
        position = 0
        seen: Counter[str] = Counter()
        for _ in range(self._epochs):
            for index, task in enumerate(self._tasks):
                if not isinstance(task, dict):
                    raise ConfigError(
                        f"tasks[{index}] must be a dict, not {type(task).__name__}", "tasks"
                    )
                key = task_key(task)
                yield position, (key, seen[key]), task
                seen[key] += 1
                position += 1
