"""Where trajectories are kept (``file://`` folders), and their export for trainers."""

from rollway.store.base import Store
from rollway.store.export import export_records, sample_rows
from rollway.store.factory import store_from_uri
from rollway.store.file import FileStore

__all__ = ["FileStore", "Store", "export_records", "sample_rows", "store_from_uri"]
