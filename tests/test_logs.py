from __future__ import annotations

import logging

import pytest

from rollway.logs import KeyValueFormatter, log_stage


def test_rollout_id_and_stage_are_printed_as_fields() -> None:
    record = logging.LogRecord("rollway.x", logging.INFO, __file__, 1, "cleanup failed", None, None)
    record.rollout_id, record.stage = "exp.t.0.1", "unregister"
    line = KeyValueFormatter().format(record)
    assert line.endswith("rollway.x: cleanup failed rollout_id=exp.t.0.1 stage=unregister")


def test_a_stage_warning_names_its_rollout_under_any_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("rollway.test_logs")
    with caplog.at_level(logging.DEBUG, logger="rollway.test_logs"):
        log_stage(logger, "fetch_trajectory", "exp.t.0.1", level=logging.WARNING, error="Boom()")
        log_stage(logger, "register", "exp.t.0.1")
    warning, debug = caplog.records
    # The message alone (what Python's last-resort handler prints) says which rollout.
    assert warning.getMessage() == "fetch trajectory (rollout exp.t.0.1), error=Boom()"
    assert (
        KeyValueFormatter()
        .format(warning)
        .endswith(
            "fetch trajectory (rollout exp.t.0.1), error=Boom() rollout_id=exp.t.0.1 "
            "stage=fetch_trajectory"
        )
    )
    assert debug.getMessage() == "register"  # a stage line's fields stay fields
