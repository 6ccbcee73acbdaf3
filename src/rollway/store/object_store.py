"""Object storage (``s3://bucket/prefix``, also ``gs://`` and ``az://``) through obstore.

obstore was chosen over boto3 and s3fs: one small maintained library (Rust ``object_store``)
for S3, GCS and Azure with the same calls, configured from the standard ``AWS_*`` (or cloud)
environment variables, and fast for many small objects.

Layout as in ``file.py``, under ``<uri>/<exp_id>/``: ``config.json``, ``trajectories/<key>.json``,
``agent-reports/<run_key>.json``, summaries, ``lease.json`` (``rollway.leases``: taken and
renewed by conditional PUTs, so two clients cannot both take it). Each record is one PUT, which
object stores make visible all at once (never half written). There is no append, so no
``index.jsonl``: listing ``trajectories/`` serves resume.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from rollway.errors import ConfigError, InfrastructureError
from rollway.leases import Lease, LeaseHolder, check_free
from rollway.results import AgentReport, RolloutRecord
from rollway.store.base import OnBadRecord, each_record
from rollway.store.file import check_name
from rollway.store.reading import parse_lease, parse_record, parse_summary

#: Environment variables that configure object stores (endpoint, region, credentials).
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")
_LEASE = "lease.json"
#: Conditional writes of the lease lost to other clients' before giving up.
_LEASE_TRIES = 5


class ObjectStore:
    """``env``: the configuring environment variables; default: this process's. A store
    pickled to a Ray worker is rebuilt there from the same ones, so workers write where the
    client reads whatever their own environment says."""

    def __init__(self, uri: str, exp_id: str, env: Mapping[str, str] | None = None) -> None:
        try:
            import obstore
            from obstore.store import from_url
        except ImportError:
            raise ConfigError("object storage needs obstore: pip install 'rollway[s3]'") from None
        check_name(exp_id, "experiment id")
        self._obstore = obstore
        self.exp_id = exp_id
        self._base_uri = uri
        self.uri = f"{uri.rstrip('/')}/{exp_id}"
        self.debug_dir: Path | None = None
        if env is None:
            env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
        self._env = dict(env)
        try:
            with _environment(self._env):  # obstore reads its configuration from there
                self._store = from_url(self.uri)
        except Exception as exc:
            raise ConfigError(f"cannot open {self.uri}: {exc}") from exc

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectStore, (self._base_uri, self.exp_id, self._env))

    def write_config(self, config: dict[str, Any]) -> None:
        self._put("config.json", orjson.dumps(config, option=orjson.OPT_INDENT_2))

    def write(self, record: RolloutRecord) -> None:
        self._put(self._record_path(record.rollout_key), record.stored())

    def get(self, rollout_key: str) -> RolloutRecord | None:
        path = self._record_path(rollout_key)
        data = self._get(path)
        return None if data is None else parse_record(data, f"{self.uri}/{path}", rollout_key)

    def exists(self, rollout_key: str) -> bool:
        """A HEAD request: whether the rollout's record is there, without reading it."""
        return self._head(self._record_path(rollout_key))

    def write_report(self, report: AgentReport) -> None:
        self._put(self._report_path(report.run_key), report.model_dump_json().encode())

    def report_exists(self, run_key: str) -> bool:
        return self._head(self._report_path(run_key))

    def get_report(self, run_key: str) -> AgentReport | None:
        data = self._get(self._report_path(run_key))
        return None if data is None else AgentReport.model_validate_json(data)

    def keys(self) -> set[str]:
        return {
            item["path"].removeprefix("trajectories/").removesuffix(".json")
            for batch in self._obstore.list(self._store, prefix="trajectories/")
            for item in batch
            if item["path"].endswith(".json")
        }

    def records(self, on_bad: OnBadRecord | None = None) -> Iterator[RolloutRecord]:
        return each_record(self, on_bad)

    def write_summary(self, name: str, data: dict[str, Any]) -> None:
        self._put(f"{name}.json", orjson.dumps(data, option=orjson.OPT_INDENT_2))

    def read_summary(self, name: str) -> dict[str, Any] | None:
        check_name(name, "summary name")
        data = self._get(f"{name}.json")
        return None if data is None else parse_summary(data, f"{self.uri}/{name}.json")

    def take_lease(self, lease: Lease) -> None:
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        for _ in range(_LEASE_TRIES):
            current, mode = self._current_lease()
            check_free(current, lease.holder, f"lease at {self.uri}/{_LEASE}")
            try:
                self._obstore.put(self._store, _LEASE, lease.model_dump_json().encode(), mode=mode)
                return
            except (AlreadyExistsError, PreconditionError):
                continue
        raise InfrastructureError(f"{self.uri}/{_LEASE} changed under every try to take it")

    def release_lease(self, holder: LeaseHolder) -> None:
        current, _ = self._current_lease()
        if current is not None and current.holder.id == holder.id:
            self._obstore.delete(self._store, _LEASE)

    def _current_lease(self) -> tuple[Lease | None, Any]:
        """The lease, and the PUT mode that replaces exactly it: a client that wrote it since
        wins, and the next look names that client."""
        try:
            found = self._obstore.get(self._store, _LEASE)
        except FileNotFoundError:
            return None, "create"
        e_tag = found.meta.get("e_tag")
        mode = {"e_tag": e_tag} if e_tag else "overwrite"  # a store without ETags: last wins
        return parse_lease(bytes(found.bytes()), f"{self.uri}/{_LEASE}"), mode

    def _put(self, path: str, data: bytes) -> None:
        self._obstore.put(self._store, path, data)

    def _get(self, path: str) -> bytes | None:
        try:
            return bytes(self._obstore.get(self._store, path).bytes())
        except FileNotFoundError:
            return None

    def _head(self, path: str) -> bool:
        try:
            self._obstore.head(self._store, path)
        except FileNotFoundError:
            return False
        return True

    @staticmethod
    def _report_path(run_key: str) -> str:
        check_name(run_key, "run key")
        return f"agent-reports/{run_key}.json"

    @staticmethod
    def _record_path(rollout_key: str) -> str:
        check_name(rollout_key, "rollout key")
        return f"trajectories/{rollout_key}.json"


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set in the environment for the duration, then as they were."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
