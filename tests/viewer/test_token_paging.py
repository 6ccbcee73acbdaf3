"""A long rollout's tokens come a page at a time: the rollout page lays out one page per sample
(not 100k spans), and the pages, fetched one after the other, are the sample exactly."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from rollway.results import RolloutRecord
from rollway.store import FileStore
from rollway.trajectory import Trajectory
from rollway.viewer import create_viewer_app, open_run
from rollway.viewer.token_view import PAGE_TOKENS
from rollway.web.background_server import BackgroundServer
from tests.trajectories import chain
from tests.viewer.conftest import Browser
from tests.viewer.test_listing_scale import small_record
from tests.viewer.test_viewer_browser import Elements

TURNS = 40


def long_trajectory() -> Trajectory:
    """A 40-turn rollout of about 12,500 tokens: each turn adds 300 prompt ids, samples 10."""
    whole: list[dict[str, Any]] = []
    sequence = list(range(100, 200))
    for index in range(TURNS):
        sequence = sequence + [(index * 7 + k) % 5000 + 10 for k in range(300)]
        completion = [9000 + index] * 10
        whole.append(dict(
            index=index, segment=0, request_id=f"r{index}", prompt_ids=sequence,
            completion_ids=completion, logprobs=[-0.01 * (index + 1)] * 10,
            finish_reason="stop", content="", sampling={}, latency_ms=1.0, prompt_hash="0" * 16,
            policy_versions=[index] * 10,
        ))  # fmt: skip
        sequence = sequence + completion
    return Trajectory(
        rollout_id="exp.long.1", model="m", sampling={}, max_turns=None, max_seq_len=None,
        messages=[], tools=None, turns=chain(whole), is_truncated=False, truncation_reason=None,
        is_cancelled=False, segment_count=1, drift=None,
    )  # fmt: skip


def long_record() -> RolloutRecord:
    return small_record(1).model_copy(update={"trajectory": long_trajectory()})


def test_pages_of_a_long_sample_add_up_to_it_exactly(tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    record = long_record()
    store.write(record)
    assert record.trajectory is not None
    (sample,) = record.trajectory.samples
    stream = sample.prompt_ids + sample.response_ids
    assert len(stream) > 3 * PAGE_TOKENS
    with TestClient(create_viewer_app(open_run(str(store.path)))) as client:
        detail = client.get(f"/api/rollouts/{record.rollout_key}").json()
        (first,) = detail["samples"]
        assert first["length"] == len(stream) and len(first["ids"]) == PAGE_TOKENS
        assert first["sampled"] == TURNS * 10 and len(first["turns"]) == TURNS
        pages, offset = [first], PAGE_TOKENS
        while offset < len(stream):
            url = f"/api/rollouts/{record.rollout_key}/tokens?segment=0&offset={offset}"
            page = client.get(url).json()
            assert page["offset"] == offset
            pages.append(page)
            offset += len(page["ids"])
        bad = client.get(f"/api/rollouts/{record.rollout_key}/tokens?segment=7")
        assert bad.status_code == 404 and "segment 7" in bad.json()["error"]["message"]
        limit = client.get(f"/api/rollouts/{record.rollout_key}/tokens?limit={PAGE_TOKENS + 1}")
        assert limit.status_code == 422
    assert [i for page in pages for i in page["ids"]] == stream
    # Each page's mask, logprobs and versions are the sample's, for the response ids it shows.
    for name in ("loss_mask", "logprobs", "policy_versions"):
        assert [v for page in pages for v in page[name]] == getattr(sample, name)
    for page in pages:
        shown = page["offset"] + len(page["ids"]) - max(page["offset"], page["prompt_len"])
        assert len(page["loss_mask"]) == max(0, shown)
        assert page["response_offset"] == max(0, page["offset"] - page["prompt_len"])


def test_the_rollout_page_lays_out_one_page_of_a_long_sample(browser: Browser, tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    record = long_record()
    store.write(record)
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        dom = Elements(browser.dom(f"{url}/rollouts/{record.rollout_key}"))
    tokens = [a for a in dom.with_attr("title") if (a["title"] or "").startswith("#")]
    prompt = 100 + 300  # the first turn's prompt, all on the first page
    assert len(tokens) == PAGE_TOKENS
    assert len([a for a in tokens if "prompt" in (a.get("class") or "")]) == prompt
    assert len(dom.with_attr("data-mask")) == PAGE_TOKENS - prompt
    assert any(tag == "button" for tag, _ in dom.tags)  # the pager


def test_numbers_in_queries_are_ascii_digits_within_bounds_or_a_422(tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    record = long_record()
    store.write(record)
    key = record.rollout_key
    with TestClient(create_viewer_app(open_run(str(store.path)))) as client:
        for bad in ("²", "١٢", "-1", "1e3", str(10**30), "9" * 5000, ""):
            for url in (f"/api/rollouts/{key}/tokens?offset={bad}",
                        f"/api/rollouts/{key}/tokens?segment={bad}",
                        f"/api/rollouts/{key}/tokens?limit={bad}",
                        f"/api/rollouts?offset={bad}"):  # fmt: skip
                answer = client.get(url)
                assert answer.status_code == 422, (url, answer.text[:200])
        past = client.get(f"/api/rollouts/{key}/tokens?offset={10**15 - 1}").json()
        assert past["ids"] == [] and past["length"] > 0
