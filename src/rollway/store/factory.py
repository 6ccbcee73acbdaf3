"""Build a store from a URI: a folder path, ``file://PATH``, or ``s3://``/``gs://``/``az://``."""

from __future__ import annotations

from rollway.errors import ConfigError
from rollway.store.base import Store
from rollway.store.file import FileStore


def store_from_uri(uri: str, exp_id: str) -> Store:
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return FileStore(uri, exp_id)
    if scheme == "file":
        return FileStore(rest, exp_id)
    if scheme in ("s3", "gs", "az", "abfs"):
        from rollway.store.object_store import ObjectStore

        return ObjectStore(uri, exp_id)
    raise ConfigError(f"unsupported store {uri!r}: use a folder, file://PATH or s3://BUCKET/PREFIX")
