"""The agent server's boundary: ids follow the shared rule (no ``.``/``..`` folders in the
store), any key is a 401 (never a 500), and an idempotency key names one rollout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agents.server.fixtures import AUTH, AgentServer

Start = Callable[..., AgentServer]


@pytest.mark.parametrize(
    ("field", "value"),
    [("exp_id", "."), ("exp_id", ".."), ("exp_id", ".hidden"), ("rollout_id", ".."),
     ("rollout_id", "a#1"), ("idempotency_key", ".."), ("idempotency_key", "k/../k")],
)  # fmt: skip
def test_unsafe_ids_are_422_naming_the_field_and_nothing_is_written(
    agent_server: Start, tmp_path: Path, field: str, value: str
) -> None:
    reports = tmp_path / "reports"
    server = agent_server(store=str(reports))
    body = {"rollout_id": "r1", "exp_id": "exp", field: value}
    answer = server.init(**body)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["param"] == field and field in error["message"]
    assert server.service.runs_started == 0
    assert not tmp_path.joinpath("agent-reports").exists() and not reports.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("base_url", "http://[::1"), ("callback_url", "http://"),
     # Hosts that IDNA cannot encode: the resolver would raise UnicodeError on first use.
     ("callback_url", "http://a..b"), ("base_url", f"http://{'a' * 64}.com/v1/rollouts/r1"),
     ("sampling", {"temperature": "hot"}), ("sampling", {"temperature": 99}),
     # JSON of the wrong type is refused, not coerced (true is not 1, "0.5" not 0.5).
     ("sampling", {"seed": True}), ("sampling", {"temperature": "0.5"}), ("debug", 1),
     # The gateway's rules, the same on every surface.
     ("sampling", {"stop": [""]}), ("sampling", {"stop_token_ids": [-1]})],
)  # fmt: skip
def test_urls_and_sampling_are_checked_at_init(
    agent_server: Start, field: str, value: object
) -> None:
    server = agent_server()
    answer = server.init("r1", **{field: value})
    assert answer.status_code == 422, answer.text
    # The full path of the field: a sampling error names the sampling field.
    (inner,) = value if isinstance(value, dict) else [None]
    assert answer.json()["error"]["param"] == (f"{field}.{inner}" if inner else field)
    assert server.service.runs_started == 0


@pytest.mark.parametrize(
    ("field", "value"), [("max_turns", True), ("timeout_s", "5"), ("max_seq_len", 2**63)]
)
def test_limits_of_the_wrong_json_type_are_422(
    agent_server: Start, field: str, value: object
) -> None:
    server = agent_server()
    answer = server.init("r1", limits={field: value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["param"] == f"limits.{field}"
    assert server.service.runs_started == 0


NON_ASCII = "ключ-é".encode()


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/rollout/init"), ("GET", "/v1/rollout/r1"), ("POST", "/v1/rollout/r1/cancel"),
     ("GET", "/v1/health")],
)  # fmt: skip
@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_non_ascii_keys_are_401(agent_server: Start, method: str, path: str, header: str) -> None:
    server = agent_server()
    assert server.init("r1").status_code == 202
    value = (b"Bearer " if header == "authorization" else b"") + NON_ASCII
    answer = server.http.request(method, path, headers={header: value}, json={})
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["type"] == "authentication_error"


def test_unknown_and_known_rollouts_look_the_same_without_the_key(agent_server: Start) -> None:
    server = agent_server()
    assert server.init("r1").status_code == 202
    for path in ("/v1/rollout/r1", "/v1/rollout/ghost"):
        assert server.http.get(path, headers={"Authorization": "Bearer x"}).status_code == 401


def test_a_reused_idempotency_key_with_another_rollout_id_is_409(agent_server: Start) -> None:
    server = agent_server()
    assert server.init("r1", idempotency_key="k1", task={"sleep": 0.3}).status_code == 202
    other = server.init("r2", idempotency_key="k1")
    assert other.status_code == 409, other.text
    error = other.json()["error"]
    assert error["param"] == "idempotency_key" and "'exp/r1'" in error["message"]
    server.wait_finished("r1")
    assert server.init("r2", idempotency_key="k1").status_code == 409
    assert server.service.runs_started == 1


def test_a_reused_key_of_a_rollout_known_only_from_the_store_is_409(agent_server: Start) -> None:
    server = agent_server(ttl_s=0.0)
    server.init("r1", idempotency_key="k1")
    server.wait_finished("r1")
    server.init("other")  # sweeps expired rollouts: k1 is now only in the store
    assert server.http.get("/v1/rollout/r1", headers=AUTH).status_code == 404
    assert server.init("r2", idempotency_key="k1").status_code == 409
    assert server.init("r1", idempotency_key="k1").json()["rollout_id"] == "r1"


def test_the_same_key_in_another_experiment_is_409(agent_server: Start) -> None:
    server = agent_server()
    assert server.init("r1", idempotency_key="k1").status_code == 202
    other = server.init("r1", idempotency_key="k1", exp_id="other")
    assert other.status_code == 409 and "'exp/r1'" in other.json()["error"]["message"]
    assert "'other/r1'" in other.json()["error"]["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("idempotency_key", "k" * 220), ("rollout_id", "R" * 200), ("exp_id", "E" * 200)],
)
def test_the_longest_valid_ids_fit_in_file_names(
    agent_server: Start, tmp_path: Path, field: str, value: str
) -> None:
    """Ids become report file names: the longest the rule allows still makes a legal one."""
    server = agent_server(store=str(tmp_path / "reports"))
    ids = {"rollout_id": "long", "exp_id": "exp", field: value}
    rollout_id = ids.pop("rollout_id")
    answer = server.init(rollout_id, **ids)
    assert answer.status_code == 202, answer.text
    assert server.wait_finished(rollout_id)["status"] == "completed"
    (report,) = (tmp_path / "reports").rglob("agent-reports/*.json")
    assert len(report.name) <= 255
    longer = {"rollout_id": "other", **ids, field: value + "x"}
    too_long = server.init(longer.pop("rollout_id"), **longer)
    assert too_long.status_code == 422 and too_long.json()["error"]["param"] == field
