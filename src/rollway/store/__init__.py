"""Where trajectories are kept (``file://`` folders), and their export for trainers."""

from rollway.store.base import Store
from rollway.store.export import export_records, sample_rows
from rollway.store.factory import store_from_uri
from rollway.store.file import FileStore, IndexEntry, index_row, read_index

__all__ = [
    "FileStore",
    "IndexEntry",
    "Store",
    "export_records",
    "index_row",
    "read_index",
    "sample_rows",
    "store_from_uri",
]
