"""Log lines that carry a rollout's id and stage as ``key=value`` fields."""

from __future__ import annotations

import logging

#: ``extra`` keys rollway attaches to log records, in the order they are printed.
FIELDS = ("rollout_id", "stage", "status")


class KeyValueFormatter(logging.Formatter):
    """``time level logger: message key=value ...`` for the fields a record carries."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={getattr(record, k)}" for k in FIELDS if hasattr(record, k)]
        return " ".join([line, *fields])


def configure(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(KeyValueFormatter())
    logging.basicConfig(level=level, handlers=[handler])
