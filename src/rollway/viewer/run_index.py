"""The listing of a run: one compact row per rollout, filtered, sorted and paged in memory.

Rows come from the run folder's ``index.jsonl`` (``rollway.store.index_row`` lines), so listing
10,000 rollouts reads that one file and never a trajectory. A line stands for its record only
while the record file is the one it was written for: one scandir of ``trajectories/`` and an
``lstat`` each compare every file with its line's size and time (``record_files.describes``),
so a record cut short, rewritten or replaced by a link, a folder or a FIFO since is read, not
trusted. Records the index does not describe (an object store keeps no index; runs written
before the index had these fields; those changed files) are read once, in threads, and their
rows kept while their file stays as it was. A local run is looked at again every ``recheck_s``
and listed again when its index or a record file changed; object storage is listed again every
``recheck_s``, which finds new records but not a record rewritten in place (a rerun): that one
shows its first row until the viewer restarts. A record that does not read is listed apart, as
unreadable with its reason (``record_files``), in no statistic, and read again with the next
listing; an index line that lacks the listing's fields is passed over for its record.
"""

from __future__ import annotations

import functools
import math
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollway.errors import TRANSIENT_KINDS, ConfigError
from rollway.results import RolloutRecord
from rollway.store import Store, index_row, read_index, store_from_uri
from rollway.store.file import INDEX
from rollway.viewer.record_files import (
    FileStamp,
    Unreadable,
    describes,
    load_record,
    read_plain_file,
    record_stamps,
)
from rollway.viewer.run_stats import (
    SUCCESS,
    advantages,
    is_scored,
    mean,
    scored_rewards,
    version_stats,
)

Row = dict[str, Any]
#: Columns a listing sorts on (index_row's fields).
ROLLOUT_COLUMNS = frozenset(
    {
        "key",
        "status",
        "reward",
        "group_id",
        "turns",
        "sampled_tokens",
        "elapsed_s",
        "reason",
        "error_kind",
        "started_at",
        "attempts",
        "task_index",
        "sample_index",
        "policy_version",
    }
)
#: A listing sorts by a reward component as ``reward/<name>``.
COMPONENT_SORT = "reward/"
GROUP_COLUMNS = frozenset(
    {"group_id", "n", "scored", "mean_reward", "std_reward", "success_rate", "first_task", "flat"}
)
#: One look at a local run's folder: its index's size and time (None: no index) and each
#: record file's ``lstat``. A write changes it, and so does any other hand on a record.
_Look = tuple[tuple[int, int] | None, dict[str, FileStamp]]


@dataclass(frozen=True)
class RunLocation:
    """A run to look at: its store, and its folder when it is a local one (the index, the
    config and the debug files live there)."""

    store: Store
    folder: Path | None
    name: str

    def read_config(self) -> dict[str, Any]:
        """The run's ``config.json``; {} where there is none or it does not read."""
        if self.folder is None:
            return {}
        try:
            config = orjson.loads(read_plain_file(self.folder / "config.json"))
        except (OSError, orjson.JSONDecodeError):
            return {}
        return config if isinstance(config, dict) else {}

    def read_record(self, key: str) -> RolloutRecord | Unreadable | None:
        """The record ``key``, or why it does not read; None where there is none."""
        return load_record(self.store, key)


def open_run(run: str) -> RunLocation:
    """``rollway-runs/<exp_id>`` or ``s3://bucket/prefix/<exp_id>`` (as ``rollway export``)."""
    root, _, exp_id = run.rstrip("/").rpartition("/")
    if "://" in run:
        return RunLocation(store_from_uri(root, exp_id), None, run.rstrip("/"))
    folder = Path(run)
    if not (folder / "trajectories").is_dir():
        raise ConfigError(f"{run} is not an experiment folder (no trajectories/)")
    return RunLocation(store_from_uri(root or ".", exp_id), folder.absolute(), exp_id)


@dataclass(frozen=True)
class Query:
    """A listing's filters and order. ``status``: any of these (empty: all); ``text``: a
    case-insensitive substring of key, group, status, error kind or reason."""

    status: frozenset[str] = frozenset()
    group: str | None = None
    #: Only rollouts whose oldest sampled token is of this weights version.
    policy_version: int | None = None
    text: str = ""
    sort: str = "task_index"
    descending: bool = False


@dataclass
class _Snapshot:
    """Rows as of one reading of the index, with what queries over them reuse (each made
    when first asked for: a page of rollouts needs none of the group statistics)."""

    rows: list[Row]  # in task order
    #: Records that did not read, by key: listed apart, in no statistic.
    unreadable: list[Unreadable] = field(default_factory=list)
    views: dict[Query, list[Row]] = field(default_factory=dict)

    @functools.cached_property
    def haystacks(self) -> list[str]:
        return [_haystack(row) for row in self.rows]

    @functools.cached_property
    def groups(self) -> list[Row]:
        return _groups(self.rows)

    @functools.cached_property
    def totals(self) -> dict[str, Any]:
        return {**_totals(self.rows, self.groups), "unreadable": len(self.unreadable)}

    @functools.cached_property
    def advantages(self) -> dict[str, float | None]:
        return advantages(self.rows, self.groups)

    @functools.cached_property
    def versions(self) -> list[Row]:
        return version_stats(self.rows)

    @functools.cached_property
    def component_names(self) -> list[str]:
        """Every reward component a row has, sorted."""
        return _names(self.rows)

    def with_advantage(self, rows: list[Row]) -> list[Row]:
        """Copies of ``rows`` (index rows stay as read) with their GRPO advantage."""
        return [{**row, "advantage": self.advantages[row["key"]]} for row in rows]


class RunIndex:
    """Thread-safe; every read first checks (at most every ``recheck_s``) whether the index
    changed. ``records_read`` counts the records read to build rows (none for an indexed run).
    """

    def __init__(
        self, location: RunLocation, *, recheck_s: float | None = None, threads: int = 16
    ) -> None:
        self.location = location
        self.recheck_s = recheck_s if recheck_s is not None else (2.0 if location.folder else 30.0)
        self.threads = threads
        self.records_read = 0
        #: Rows built from records, by key, with their file's stamp when read (None: an object).
        self._read_rows: dict[str, tuple[FileStamp | None, Row]] = {}
        self._seen: _Look | None = None
        self._checked_at = float("-inf")
        self._snapshot: _Snapshot | None = None
        self._lock = threading.Lock()

    def rollouts(self, query: Query, offset: int, limit: int) -> dict[str, Any]:
        snapshot = self._current()
        matched = self._view(snapshot, query)
        return {
            "total": len(snapshot.rows),
            "matched": len(matched),
            "offset": offset,
            "limit": limit,
            "rows": snapshot.with_advantage(matched[offset : offset + limit]),
            # A column each, sortable as ``reward/<name>``.
            "reward_components": snapshot.component_names,
        }

    def group(self, group_id: str, limit: int) -> dict[str, Any] | None:
        """One group's statistics and its first ``limit`` rollouts in sample order, each with
        its advantage (None: no such group in the listing)."""
        snapshot = self._current()
        stats = next((g for g in snapshot.groups if g["group_id"] == group_id), None)
        if stats is None:
            return None
        members = self._view(snapshot, Query(group=group_id, sort="sample_index"))
        rollouts = snapshot.with_advantage(members[:limit])
        return {**stats, "rollouts": rollouts, "reward_components": _names(members)}

    def versions(self) -> list[Row]:
        """Per policy version: rollouts, mean reward and completion rate (``version_stats``)."""
        return self._current().versions

    def groups(
        self, text: str, sort: str, descending: bool, offset: int, limit: int
    ) -> dict[str, Any]:
        snapshot = self._current()
        needle = text.lower()
        matched = [g for g in snapshot.groups if needle in g["group_id"].lower()]
        matched = _sorted(matched, sort, descending)
        page = matched[offset : offset + limit]
        return {
            "total": len(snapshot.groups),
            "matched": len(matched),
            "rows": page,
            # A column each (the group's mean of it), sortable as ``reward/<name>``.
            "reward_components": snapshot.component_names,
        }

    def totals(self) -> dict[str, Any]:
        return self._current().totals

    def unreadable(self) -> list[Unreadable]:
        """The run's records that did not read as of the last listing, by key."""
        return self._current().unreadable

    def _current(self) -> _Snapshot:
        with self._lock:
            now = time.monotonic()
            if self._snapshot is None or now - self._checked_at >= self.recheck_s:
                self._checked_at = now
                look = self._look()
                if self._snapshot is None or look is None or look != self._seen:
                    self._snapshot = self._build(look)
                    self._seen = look
            return self._snapshot

    def _look(self) -> _Look | None:
        """The local run's folder as it is now (``_Look``); None where there is no folder to
        watch (object storage): list the records again."""
        folder = self.location.folder
        if folder is None:
            return None
        try:
            found = (folder / INDEX).lstat()
        except FileNotFoundError:
            return None, record_stamps(folder)
        return (found.st_size, found.st_mtime_ns), record_stamps(folder)

    def _build(self, look: _Look | None) -> _Snapshot:
        folder = self.location.folder
        entries = read_index(folder) if folder and _plain_index(folder) else {}
        stamps = look[1] if look is not None else None
        # One listing: the records that are there.
        keys = stamps.keys() if stamps is not None else self.location.store.keys()
        index_time = look[0][1] if look is not None and look[0] is not None else 0
        rows: dict[str, Row] = {}
        unread: list[tuple[str, FileStamp | None]] = []
        for key in [*(k for k in entries if k in keys), *sorted(keys - entries.keys())]:
            entry = entries.get(key)
            stamp = stamps[key] if stamps is not None else None
            known = self._read_rows.get(key)
            if entry is not None and _stands(entry.row, stamp, index_time):
                rows[key] = entry.row
            elif known is not None and known[0] == stamp:  # read before, unchanged since
                rows[key] = known[1]
            else:
                unread.append((key, stamp))
        unreadable: list[Unreadable] = []
        for (key, stamp), row in zip(unread, self._read([k for k, _ in unread]), strict=True):
            if isinstance(row, Unreadable):
                unreadable.append(row)
            elif row is not None:
                rows[key] = row
                if stamp is None or stamp.regular:  # else it changed while read: read it again
                    self._read_rows[key] = (stamp, row)
        return _Snapshot(sorted(rows.values(), key=_task_order), unreadable)

    def _read(self, keys: list[str]) -> Iterable[Row | Unreadable | None]:
        if not keys:
            return []
        self.records_read += len(keys)

        def one(key: str) -> Row | Unreadable | None:
            record = self.location.read_record(key)
            return index_row(record) if isinstance(record, RolloutRecord) else record

        with ThreadPoolExecutor(min(self.threads, len(keys))) as pool:
            return list(pool.map(one, keys))

    def _view(self, snapshot: _Snapshot, query: Query) -> list[Row]:
        with self._lock:
            cached = snapshot.views.get(query)
        if cached is not None:
            return cached
        matched = [
            row
            for row in snapshot.rows
            if (not query.status or row["status"] in query.status)
            and (query.group is None or row["group_id"] == query.group)
            and (query.policy_version is None or row.get("policy_version") == query.policy_version)
        ]
        if query.text:
            needle = query.text.lower()
            texts = dict(zip(map(id, snapshot.rows), snapshot.haystacks, strict=True))
            matched = [row for row in matched if needle in texts[id(row)]]
        matched = _sorted(matched, query.sort, query.descending)
        with self._lock:
            if len(snapshot.views) > 64:  # a few recent listings, not every one ever asked
                snapshot.views.clear()
            snapshot.views[query] = matched
        return matched


def _plain_index(folder: Path) -> bool:
    """Whether the run's index is a regular file (a link to elsewhere is not read)."""
    try:
        return stat.S_ISREG(os.lstat(folder / INDEX).st_mode)
    except FileNotFoundError:
        return False


def _stands(row: Row, stamp: FileStamp | None, index_time: int) -> bool:
    """Whether an index line stands for its record in the listing: it has the listing's
    fields and the record file is still the one it was written for."""
    return stamp is not None and _listable(row) and describes(row, stamp, index_time)


_NUMBER = (int, float, type(None))
_TEXT = (str, type(None))
#: The types a listing sorts and sums an index line's fields by. A line that lacks ``turns``
#: (written before lines carried the listing's fields) or holds another type (a hand-edited or
#: foreign line) is passed over: its record is read instead. Other fields may be missing.
_LISTED: dict[str, tuple[type, ...]] = {
    "key": (str,),
    "status": (str,),
    "group_id": (str,),
    "task_index": (int,),
    "sample_index": (int,),
    "turns": (int, type(None)),
    **dict.fromkeys(("reward", "elapsed_s", "started_at", "attempts"), _NUMBER),
    **dict.fromkeys(("sampled_tokens", "policy_version"), _NUMBER),
    **dict.fromkeys(("error_kind", "reason"), _TEXT),
}
_PRESENT = ("key", "status", "group_id", "task_index", "sample_index", "turns")


def _listable(row: Row) -> bool:
    return all(name in row for name in _PRESENT) and all(
        isinstance(row.get(name), kinds) and not isinstance(row.get(name), bool)
        for name, kinds in _LISTED.items()
    )


def component(row: Row, name: str) -> float | None:
    """A row's reward component ``name``; None where it has none (or an index line that
    predates components)."""
    components = row.get("reward_components")
    value = components.get(name) if isinstance(components, dict) else None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _names(rows: list[Row]) -> list[str]:
    """Every reward component one of ``rows`` has, sorted."""
    names: set[str] = set()
    for row in rows:
        components = row.get("reward_components")
        names.update(components if isinstance(components, dict) else ())
    return sorted(names)


def _component_means(rows: list[Row]) -> dict[str, float]:
    """Per reward component, its mean over the scored rows that have it (as the reward's)."""
    scored = [row for row in rows if is_scored(row)]
    means: dict[str, float] = {}
    for name in _names(scored):
        average = mean([v for v in (component(row, name) for row in scored) if v is not None])
        if average is not None:
            means[name] = average
    return means


def _sorted(rows: list[Row], column: str, descending: bool) -> list[Row]:
    """Stable (ties keep their order), with missing values last in either direction;
    ``reward/<name>`` sorts by that reward component."""
    if column.startswith(COMPONENT_SORT):
        name = column.removeprefix(COMPONENT_SORT)
        keyed = [(component(r, name), r) for r in rows]
        scored = [(v, r) for v, r in keyed if v is not None]
        scored.sort(key=lambda pair: pair[0], reverse=descending)
        return [r for _, r in scored] + [r for v, r in keyed if v is None]
    present = [r for r in rows if r.get(column) is not None]
    missing = [r for r in rows if r.get(column) is None]
    value: Callable[[Row], Any] = lambda r: r[column]  # noqa: E731
    if column in ("reason", "group_id", "key", "status", "error_kind"):
        value = lambda r: str(r[column]).lower()  # noqa: E731
    return sorted(present, key=value, reverse=descending) + missing


def _task_order(row: Row) -> tuple[int, int]:
    return row["task_index"], row["sample_index"]


def _haystack(row: Row) -> str:
    parts = (row["key"], row["group_id"], row["status"], row["error_kind"], row["reason"])
    return " ".join(str(p) for p in parts if p).lower()


def _groups(rows: list[Row]) -> list[Row]:
    """Per group: rollouts, reward mean/std over scored ones (infrastructure and engine failures
    left out, as ``groups.json``), success rate (completed or truncated) over all."""
    members: dict[str, list[Row]] = {}
    for row in rows:
        members.setdefault(row["group_id"], []).append(row)
    groups = []
    for group_id, group in members.items():
        transient = sum(r["error_kind"] in TRANSIENT_KINDS for r in group)
        rewards = scored_rewards(group)
        average = mean(rewards)
        groups.append(
            {
                "group_id": group_id,
                "first_task": group[0]["task_index"],
                "n": len(group),
                "scored": len(rewards),
                "mean_reward": average,
                "std_reward": _pstdev(rewards, average),
                "success_rate": sum(r["status"] in SUCCESS for r in group) / len(group),
                "infrastructure_failures": transient,
                # No GRPO signal: fewer than two different rewards (export's flat_groups).
                "flat": len(set(rewards)) < 2,
                # Each component's mean: a group sorts by one as ``reward/<name>``.
                "reward_components": _component_means(group),
            }
        )
    return groups


def _share(rows: list[Row], status: str) -> float | None:
    return sum(r["status"] == status for r in rows) / len(rows) if rows else None


def _pstdev(values: list[float], mean: float | None) -> float | None:
    """The population standard deviation (as ``groups.json``), in floats: ``statistics``
    computes it exactly in fractions, 20 times slower over thousands of groups."""
    if mean is None:
        return None
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def _totals(rows: list[Row], groups: list[Row]) -> dict[str, Any]:
    scored = scored_rewards(rows)
    tokens = [r["sampled_tokens"] for r in rows if r.get("sampled_tokens") is not None]
    elapsed = [r["elapsed_s"] for r in rows if r.get("elapsed_s") is not None]
    return {
        "rollouts": len(rows),
        "groups": len({r["group_id"] for r in rows}),
        "by_status": dict(Counter(r["status"] for r in rows).most_common()),
        "errors_by_kind": dict(Counter(r["error_kind"] for r in rows if r["error_kind"])),
        "success_rate": sum(r["status"] in SUCCESS for r in rows) / len(rows) if rows else None,
        # What the page calls "completed": ran to its end without a gateway limit cutting it.
        "completed_rate": _share(rows, "completed"),
        "truncated_rate": _share(rows, "truncated"),
        "scored": len(scored),
        "mean_reward": sum(scored) / len(scored) if scored else None,
        "flat_groups": sum(group["flat"] for group in groups),
        "turns": sum(r.get("turns") or 0 for r in rows),
        "sampled_tokens": sum(tokens),
        "mean_elapsed_s": sum(elapsed) / len(elapsed) if elapsed else None,
    }
