"""``file://`` store: one folder per experiment.

    <root>/<exp_id>/config.json                 the run's config
    <root>/<exp_id>/trajectories/<key>.json     one record per rollout (written atomically)
    <root>/<exp_id>/index.jsonl                 one line per written record: key, status, reward
    <root>/<exp_id>/<name>.json                 summaries (groups, run)
    <root>/<exp_id>/debug/<rollout_id>.jsonl    per-rollout debug events, when enabled
    <root>/<exp_id>/agent-reports/<run_key>.json  what remote agent servers reported

The trajectory files are the source of truth; the index is a fast listing and tolerates a
torn last line.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from rollway.errors import ConfigError
from rollway.types import AgentReport, RolloutRecord

_SAFE_KEY = re.compile(r"^[A-Za-z0-9._-]+$")


def check_name(name: str, what: str) -> None:
    """Experiment ids and rollout keys become file and object names: keep them plain."""
    if not _SAFE_KEY.match(name) or name in (".", ".."):
        raise ConfigError(f"{what} {name!r} may hold only letters, digits, . _ -")


class FileStore:
    def __init__(self, root: str | Path, exp_id: str) -> None:
        check_name(exp_id, "experiment id")
        self.exp_id = exp_id
        self.path = Path(root).absolute() / exp_id  # the same folder from any worker
        self._trajectories = self.path / "trajectories"
        self._trajectories.mkdir(parents=True, exist_ok=True)
        self.debug_dir: Path | None = self.path / "debug"

    def write_config(self, config: dict[str, Any]) -> None:
        _atomic_write(self.path / "config.json", orjson.dumps(config, option=orjson.OPT_INDENT_2))

    def write(self, record: RolloutRecord) -> None:
        _atomic_write(self._record_path(record.rollout_key), record.model_dump_json().encode())
        entry = {"key": record.rollout_key, "status": record.status, "reward": record.reward}
        with (self.path / "index.jsonl").open("ab") as index:
            index.write(orjson.dumps(entry) + b"\n")

    def exists(self, rollout_key: str) -> bool:
        return self._record_path(rollout_key).is_file()

    def get(self, rollout_key: str) -> RolloutRecord | None:
        path = self._record_path(rollout_key)
        if not path.is_file():
            return None
        return RolloutRecord.model_validate_json(path.read_bytes())

    def keys(self) -> set[str]:
        return {path.stem for path in self._trajectories.glob("*.json")}

    def records(self) -> Iterator[RolloutRecord]:
        for path in sorted(self._trajectories.glob("*.json")):
            yield RolloutRecord.model_validate_json(path.read_bytes())

    def write_summary(self, name: str, data: dict[str, Any]) -> None:
        payload = orjson.dumps(data, option=orjson.OPT_INDENT_2)
        _atomic_write(self.path / f"{name}.json", payload)

    def write_report(self, report: AgentReport) -> None:
        path = self._report_path(report.run_key)
        path.parent.mkdir(exist_ok=True)
        _atomic_write(path, report.model_dump_json().encode())

    def report_exists(self, run_key: str) -> bool:
        return self._report_path(run_key).is_file()

    def get_report(self, run_key: str) -> AgentReport | None:
        path = self._report_path(run_key)
        if not path.is_file():
            return None
        return AgentReport.model_validate_json(path.read_bytes())

    def _report_path(self, run_key: str) -> Path:
        check_name(run_key, "run key")
        return self.path / "agent-reports" / f"{run_key}.json"

    def _record_path(self, rollout_key: str) -> Path:
        check_name(rollout_key, "rollout key")
        return self._trajectories / f"{rollout_key}.json"


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, flush it to disk, then rename over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
