from __future__ import annotations

import logging

from rollway.logs import KeyValueFormatter


def test_rollout_id_and_stage_are_printed_as_fields() -> None:
    record = logging.LogRecord("rollway.x", logging.INFO, __file__, 1, "cleanup failed", None, None)
    record.rollout_id, record.stage = "exp.t.0.1", "unregister"
    line = KeyValueFormatter().format(record)
    assert line.endswith("rollway.x: cleanup failed rollout_id=exp.t.0.1 stage=unregister")
