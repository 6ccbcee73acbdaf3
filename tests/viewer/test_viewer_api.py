"""The viewer's JSON API over a real run: listing, filters, group statistics, one rollout's
conversation and token stream (decoded with the run's model's tokenizer) and debug events."""

from __future__ import annotations

import statistics
from collections import Counter

import httpx
import pytest
from starlette.testclient import TestClient

from rollway.store import FileStore
from rollway.viewer import create_viewer_app, open_run
from tests.viewer.conftest import EXP_ID, RealRun


@pytest.fixture(scope="module")
def client(real_run: RealRun):
    with TestClient(create_viewer_app(open_run(str(real_run.folder)))) as test_client:
        yield test_client


def records(real_run: RealRun):
    return list(FileStore(real_run.folder.parent, EXP_ID).records())


def test_the_listing_pages_filters_and_sorts(client: TestClient, real_run: RealRun) -> None:
    stored = {r.rollout_key: r for r in records(real_run)}
    page = client.get("/api/rollouts", params={"limit": 3}).json()
    assert page["total"] == page["matched"] == 4 and len(page["rows"]) == 3
    rest = client.get("/api/rollouts", params={"limit": 3, "offset": 3}).json()["rows"]
    keys = [r["key"] for r in page["rows"] + rest]
    assert sorted(keys) == sorted(stored) and len(set(keys)) == 4
    for row in page["rows"] + rest:
        record = stored[row["key"]]
        assert (row["status"], row["reward"], row["group_id"]) == (
            record.status, record.reward, record.group_id)  # fmt: skip
        turns = record.trajectory.turns if record.trajectory else []
        assert row["turns"] == len(turns)
        assert row["sampled_tokens"] == sum(len(t.completion_ids) for t in turns)
        assert row["elapsed_s"] == record.elapsed_s
    errors = client.get("/api/rollouts", params={"status": "error"}).json()
    assert errors["matched"] == 2 and errors["total"] == 4
    assert all("no luck with bad" in r["reason"] for r in errors["rows"])
    by_text = client.get("/api/rollouts", params={"q": "NO LUCK"}).json()
    assert {r["key"] for r in by_text["rows"]} == {r["key"] for r in errors["rows"]}
    group = stored["add.0"].group_id
    in_group = client.get("/api/rollouts", params={"group": group}).json()["rows"]
    assert {r["key"] for r in in_group} == {"add.0", "add.1"}
    by_tokens = client.get("/api/rollouts", params={"sort": "sampled_tokens", "order": "desc"})
    tokens = [r["sampled_tokens"] for r in by_tokens.json()["rows"]]
    assert tokens == sorted(tokens, reverse=True)


def test_group_statistics_and_run_totals(client: TestClient, real_run: RealRun) -> None:
    stored = records(real_run)
    groups = {g["group_id"]: g for g in client.get("/api/groups").json()["rows"]}
    assert len(groups) == 2
    good = [r for r in stored if r.success]
    stats = groups[good[0].group_id]
    rewards = [r.reward for r in good]
    assert stats["n"] == stats["scored"] == 2 and stats["success_rate"] == 1.0
    assert stats["mean_reward"] == pytest.approx(statistics.fmean(rewards))
    assert stats["std_reward"] == pytest.approx(statistics.pstdev(rewards))
    failed = groups[next(r.group_id for r in stored if r.status == "error")]
    assert failed["success_rate"] == 0.0 and failed["mean_reward"] is None
    run = client.get("/api/run").json()
    assert run["name"] == EXP_ID and run["config"]["agent_name"] == "two-turn"
    totals = run["totals"]
    assert totals["rollouts"] == 4
    assert totals["by_status"] == dict(Counter(r.status for r in stored))
    assert totals["success_rate"] == 0.5
    sampled = sum(len(t.completion_ids) for r in good for t in r.trajectory.turns)
    assert totals["sampled_tokens"] == sampled and totals["turns"] == 4


def test_a_rollout_has_its_conversation_token_stream_and_debug_events(
    client: TestClient, real_run: RealRun
) -> None:
    record = next(r for r in records(real_run) if r.rollout_key == "add.0")
    trajectory = record.trajectory
    detail = client.get("/api/rollouts/add.0").json()
    assert detail["record"]["rollout_key"] == "add.0" and "trajectory" not in detail["record"]
    assert detail["trajectory"]["messages"] == trajectory.messages
    assert [t["completion_tokens"] for t in detail["turns"]] == [
        len(t.completion_ids) for t in trajectory.turns
    ]
    assert len(detail["samples"]) == len(trajectory.samples)
    for view, sample in zip(detail["samples"], trajectory.samples, strict=True):
        assert view["ids"] == sample.prompt_ids + sample.response_ids
        assert view["prompt_len"] == len(sample.prompt_ids)
        assert view["loss_mask"] == sample.loss_mask and view["logprobs"] == sample.logprobs
        for turn, marked in zip(
            [t for t in trajectory.turns if t.segment == sample.segment], view["turns"], strict=True
        ):
            start, end = marked["start"], marked["end"]
            assert view["ids"][start:end] == turn.completion_ids  # the turn's span is its own
            response_start = view["prompt_len"]
            assert set(sample.loss_mask[start - response_start : end - response_start]) == {1}
    assert any(0 in s["loss_mask"] for s in detail["samples"])  # the second turn's glue
    # Every id decoded one by one with the run's model's tokenizer.
    assert detail["tokenizer"] == "SmolLM2-135M-Instruct"
    decode = real_run.renderer.decode_one
    ids = {i for s in detail["samples"] for i in s["ids"]}
    assert detail["texts"] == {str(i): decode(i) for i in ids}
    # debug=True kept the stage log: two chats, then the end.
    kinds = [e["kind"] for e in detail["debug"]]
    assert kinds == ["chat", "chat", "complete"] and {e["attempt"] for e in detail["debug"]} == {1}


def test_an_agent_failure_has_no_trajectory_and_unknown_keys_are_404(client: TestClient) -> None:
    detail = client.get("/api/rollouts/bad.0").json()
    assert detail["record"]["status"] == "error" and detail["record"]["error_kind"] == "agent"
    assert detail["samples"] == [] and detail["tokenizer"] is None
    assert client.get("/api/rollouts/nope.0").status_code == 404
    assert client.get("/api/rollouts/..").status_code == 404
    wrong = client.get("/api/rollouts", params={"sort": "colour"})
    assert wrong.status_code == 422 and wrong.json()["error"]["param"] == "sort"
    assert client.get("/api/rollouts", params={"limit": 0}).status_code == 422
    assert client.get("/api/nothing").json()["error"]["type"] == "invalid_request_error"


def test_pages_and_assets_are_served_over_loopback(viewer_url: str) -> None:
    with httpx.Client(base_url=viewer_url) as http:
        listing = http.get("/")
        assert listing.status_code == 200 and "/assets/listing.js" in listing.text
        assert "http" not in listing.text.replace(viewer_url, "")  # nothing from elsewhere
        assert "/assets/rollout.js" in http.get("/rollouts/add.0").text
        for asset in ("viewer.css", "common.js", "listing.js", "rollout.js"):
            assert http.get(f"/assets/{asset}").status_code == 200
        assert http.get("/api/rollouts", params={"limit": 1}).json()["total"] == 4
        assert "/api/rollouts" in http.get("/openapi.json").json()["paths"]
