"""Build a store from a URI: a folder path or ``file://PATH``."""

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
    raise ConfigError(f"unsupported store {uri!r}: use a folder or file://PATH")
