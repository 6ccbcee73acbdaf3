"""A program agent that exits on the gateway's 4xx: the refusal is logged with the rollout's
id, counted on its record, and named in the failure reason."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from rollway.agents.program import ProgramAgent
from rollway.client import RolloutClient
from rollway.gateway.render.chat_template import ChatRenderer
from tests.agents.test_program import TASK, sim_gateway

REFUSED = """
import json, os, sys, urllib.error, urllib.request
body = {"messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}}
for _ in range(2):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request)
    except urllib.error.HTTPError as exc:
        status = exc.code
sys.stderr.write(f"request failed with {status}")
sys.exit(1)
"""


def test_a_program_that_exits_on_a_refusal_names_it_in_its_reason(
    renderer: ChatRenderer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    program = tmp_path / "prog.py"
    program.write_text(REFUSED)
    agent = ProgramAgent([sys.executable, str(program)])
    with (
        caplog.at_level(logging.WARNING, logger="rollway.gateway"),
        RolloutClient(
            agent, sim_gateway(renderer), store=str(tmp_path / "s"), max_retry_attempts=1
        ) as client,
    ):
        (item,) = client.run_batch([TASK])
    record = item.result
    assert (record.status, record.error_kind) == ("error", "agent")
    assert "the gateway refused 2 request(s), first 400: response_format" in record.reason
    refusals = record.trajectory.refusals
    assert refusals is not None and refusals.count == 2 and refusals.first_status == 400
    assert refusals.first_body["error"]["param"] == "response_format"
    logged = [r for r in caplog.records if getattr(r, "stage", None) == "refusal"]
    assert len(logged) == 2 and all(r.rollout_id == record.rollout_id for r in logged)
