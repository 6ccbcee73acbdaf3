"""The store seam: where an experiment's config and rollout outcomes are kept."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rollway.errors import BadRecordError, ConfigError
from rollway.leases import Lease, LeaseHolder
from rollway.results import AgentReport, RolloutRecord

#: Told of each record that cannot be used, which is then skipped.
OnBadRecord = Callable[[BadRecordError], None]


@runtime_checkable
class Store(Protocol):
    """One experiment's results. ``write`` replaces a rollout's record atomically (a reader sees
    the old record or the new one, never half of one); ``exists`` checks for a record without
    reading it; ``records`` yields every stored record.

    A stored record that cannot be used (cut short, edited, of a newer format, a link: links
    are never followed) is a ``BadRecordError`` naming it and why, from ``get``; ``records``
    passes each to ``on_bad`` and goes on, or raises it where no ``on_bad`` is given."""

    exp_id: str
    #: A local folder for per-rollout debug files, or None where the store has none.
    debug_dir: Path | None

    def write_config(self, config: dict[str, Any]) -> None: ...

    def write(self, record: RolloutRecord) -> None: ...

    def get(self, rollout_key: str) -> RolloutRecord | None: ...

    def exists(self, rollout_key: str) -> bool: ...

    def keys(self) -> set[str]:
        """The rollout keys of every stored record: one listing, no reads."""
        ...

    def records(self, on_bad: OnBadRecord | None = None) -> Iterator[RolloutRecord]: ...

    def write_summary(self, name: str, data: dict[str, Any]) -> None: ...

    def read_summary(self, name: str) -> dict[str, Any] | None:
        """The summary written as ``name`` (None: none, or not one that can be read)."""
        ...

    # Agent servers leave their reports here, so a client that missed the callback (or
    # restarted) finds them by polling ``report_exists`` (a HEAD, not a read).

    def write_report(self, report: AgentReport) -> None: ...

    def report_exists(self, run_key: str) -> bool: ...

    def get_report(self, run_key: str) -> AgentReport | None: ...

    # The experiment's lease (``rollway.leases``): one live client at a time runs its rollouts.

    def take_lease(self, lease: Lease) -> None:
        """Hold the experiment for ``lease.holder``, or renew its hold, atomically; an
        ``ExperimentInUseError`` naming the holder while another client's lease is live."""
        ...

    def release_lease(self, holder: LeaseHolder) -> None:
        """Give the lease back, if ``holder`` still has it."""
        ...


def each_record(store: Store, on_bad: OnBadRecord | None) -> Iterator[RolloutRecord]:
    """Every record of ``store`` in key order, each bad one passed to ``on_bad`` (raised where
    it is None) and skipped; a record removed since the listing is skipped too."""
    for key in sorted(store.keys()):
        try:
            record = store.get(key)
        except (BadRecordError, ConfigError) as exc:  # a ConfigError: a name put there by hand
            if on_bad is None:
                raise
            bad = exc if isinstance(exc, BadRecordError) else None
            on_bad(bad or BadRecordError.of(f"record {key!r}", str(exc)))
            continue
        if record is not None:
            yield record
