"""Log lines that carry a rollout's id and stage as ``key=value`` fields."""

from __future__ import annotations

import logging
from typing import Any

#: ``extra`` keys rollway attaches to log records, in the order they are printed.
FIELDS = ("rollout_id", "stage", "status")


class KeyValueFormatter(logging.Formatter):
    """``time level logger: message key=value ...`` for the fields a record carries."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={getattr(record, k)}" for k in FIELDS if hasattr(record, k)]
        more = getattr(record, "fields", {})
        return " ".join([line, *fields, *(f"{k}={v}" for k, v in more.items())])


def log_stage(
    logger: logging.Logger, stage: str, rollout_id: str, level: int = logging.DEBUG, **fields: Any
) -> None:
    """One line per stage of a rollout (``stage=create_sandbox rollout_id=...``), at DEBUG by
    default: ``ROLLWAY_LOG_LEVEL=DEBUG`` follows each rollout through its stages. A warning
    names its rollout and fields in its message too: a handler other than rollway's (an
    application's, Python's last resort) prints the message alone."""
    message = stage.replace("_", " ")
    if level >= logging.WARNING:
        said = "".join(f", {k}={v}" for k, v in fields.items())
        message, fields = f"{message} (rollout {rollout_id}){said}", {}
    extra = {"rollout_id": rollout_id, "stage": stage, "fields": fields}
    logger.log(level, message, extra=extra)


def configure(level: int | str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(KeyValueFormatter())
    logging.basicConfig(level=level, handlers=[handler])
