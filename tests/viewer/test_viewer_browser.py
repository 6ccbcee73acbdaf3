"""The pages in a real headless Chromium: the listing renders the run's rows, a rollout page
renders its token stream with one element per response token under its loss mask."""

from __future__ import annotations

import os
import struct
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import orjson

from rollway.results import RolloutRecord
from rollway.store import FileStore
from rollway.viewer import create_viewer_app, open_run
from rollway.web.background_server import BackgroundServer
from tests.viewer.conftest import EXP_ID, Browser, RealRun
from tests.viewer.test_listing_scale import small_record
from tests.viewer.test_token_view import trajectory as drifted


class Elements(HTMLParser):
    """Every start tag's attributes, in document order."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def with_attr(self, name: str) -> list[dict[str, str | None]]:
        return [attrs for _, attrs in self.tags if name in attrs]


def test_the_listing_page_renders_the_runs_rows(
    browser: Browser, viewer_url: str, real_run: RealRun
) -> None:
    dom = Elements(browser.dom(f"{viewer_url}/"))
    keys = [attrs["data-key"] for attrs in dom.with_attr("data-key")]
    assert sorted(keys) == sorted(FileStore(real_run.folder.parent, EXP_ID).keys())
    links = {a["href"] for tag, a in dom.tags if tag == "a"}
    assert {f"/rollouts/{key}" for key in keys} <= links
    errors = Elements(browser.dom(f"{viewer_url}/?status=error"))
    assert sorted(a["data-key"] for a in errors.with_attr("data-key")) == ["bad.0", "bad.1"]


def test_a_rollout_page_shows_each_token_under_its_loss_mask(
    browser: Browser, viewer_url: str, real_run: RealRun
) -> None:
    record = FileStore(real_run.folder.parent, EXP_ID).get("add.1")
    assert record is not None and record.trajectory is not None
    dom = Elements(browser.dom(f"{viewer_url}/rollouts/add.1"))
    samples = dom.with_attr("data-segment")
    assert len(samples) == len(record.trajectory.samples)
    shown = Counter(attrs["data-mask"] for attrs in dom.with_attr("data-mask"))
    expected = Counter(str(m) for s in record.trajectory.samples for m in s.loss_mask)
    assert shown["1"] == expected["1"] > 0 and shown["0"] == expected["0"] > 0
    assert set(shown) == {"0", "1"}
    turns = dom.with_attr("data-turn")
    assert len(turns) == len(record.trajectory.turns)
    # Tooltips carry id, text, logprob: the first sampled token's, as recorded.
    first = record.trajectory.turns[0]
    tips = [a["title"] or "" for a in dom.with_attr("data-mask") if a.get("title")]
    assert any(f"id {first.completion_ids[0]}" in t and "logprob" in t for t in tips)
    if first.policy_versions:
        assert any(f"policy version {first.policy_versions[0]}" in t for t in tips)


def test_a_screenshot_of_each_page_is_kept(
    browser: Browser, viewer_url: str, tmp_path: Path
) -> None:
    folder = Path(os.environ.get("ROLLWAY_TEST_ARTIFACTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    for name, page in (("viewer.png", "/"), ("viewer-rollout.png", "/rollouts/add.0")):
        path = browser.screenshot(f"{viewer_url}{page}", folder / name)
        header = path.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", header[16:24]) == (1400, 1000)


def test_segments_drift_and_bare_ids_on_a_rollout_page(browser: Browser, tmp_path: Path) -> None:
    store = FileStore(tmp_path, "exp")
    record = small_record(1).model_copy(update={"trajectory": drifted(3)})
    store.write(record)
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        dom = Elements(browser.dom(f"{url}/rollouts/{record.rollout_key}"))
    assert [a["data-segment"] for a in dom.with_attr("data-segment")] == ["0", "1"]
    assert [a["data-turn"] for a in dom.with_attr("data-turn")] == ["0", "1", "2"]
    tokens = dom.with_attr("data-mask")
    assert [a["data-mask"] for a in tokens] == ["1", "1", "0", "0", "1", "1", "1", "1"]
    drift = [a for a in tokens if "drift" in (a.get("class") or "")]
    assert len(drift) == 1 and drift[0]["title"].startswith("#3 · id 11")  # segment 1's ids
    assert "policy version 2" in drift[0]["title"]


def test_the_listing_shows_policy_versions_and_filters_on_one(
    browser: Browser, tmp_path: Path
) -> None:
    store = FileStore(tmp_path, "exp")
    for i, version in enumerate([0, 1, 1, None], start=1):
        store.write(small_record(i).model_copy(update={"policy_version": version}))
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        every = Elements(browser.dom(f"{url}/"))
        ones = Elements(browser.dom(f"{url}/?version=1"))
    shown = sorted(a["data-version"] or "" for a in every.with_attr("data-version"))
    assert shown == ["", "0", "1", "1"]
    assert [a["data-version"] for a in ones.with_attr("data-version")] == ["1", "1"]


def test_the_listing_has_a_sortable_column_per_reward_component(
    browser: Browser, tmp_path: Path
) -> None:
    store = FileStore(tmp_path, "exp")
    for i, correct in enumerate([0.0, 1.0], start=1):
        info = {"correct": correct, "format": 0.5}
        store.write(small_record(i).model_copy(update={"reward": 1.0, "reward_info": info}))
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        dom = Elements(browser.dom(f"{url}/?sort=reward/correct&order=desc"))
    headers = [a for tag, a in dom.tags if tag == "th" and "data-component" in a]
    # The rollouts' columns, then the groups' (test_the_group_views_...).
    assert [a["data-sort"] for a in headers] == ["reward/correct", "reward/format"] * 2
    cells = [a["data-component"] for a in dom.with_attr("data-component") if "data-sort" not in a]
    assert cells == ["correct", "format"] * 3  # two rollouts, their group
    shown = [a["data-key"] for a in dom.with_attr("data-key")]
    assert shown == [small_record(2).rollout_key, small_record(1).rollout_key]


def test_an_unreadable_record_is_listed_apart_and_its_page_says_why(
    browser: Browser, tmp_path: Path
) -> None:
    store = FileStore(tmp_path, "exp")
    store.write(small_record(1))
    (store.path / "trajectories" / "cut.json").write_bytes(b'{"exp_id": "exp", "rollout')
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        listing = Elements(browser.dom(f"{url}/"))
        page = browser.dom(f"{url}/rollouts/cut")
    assert [a["data-key"] for a in listing.with_attr("data-key")] == ["t00000.1"]
    assert [a["data-unreadable"] for a in listing.with_attr("data-unreadable")] == ["cut"]
    assert "unreadable record: Invalid JSON" in page


def test_a_truncated_rollouts_page_says_why_beside_its_status(
    browser: Browser, tmp_path: Path
) -> None:
    """A record written before the reason was always named (truncated, reason null, status
    completed) shows the reason the trajectory now reads with."""
    store = FileStore(tmp_path, "exp")
    old = orjson.loads(small_record(1).model_dump_json())
    old["trajectory"] |= {"is_truncated": True, "truncation_reason": None}
    old["trajectory"]["turns"][-1]["finish_reason"] = "length"
    (store.path / "trajectories" / "old.json").write_bytes(orjson.dumps(old))
    cut = orjson.loads(small_record(2).model_dump_json())
    cut["trajectory"] |= {"is_truncated": True, "truncation_reason": "max_tokens"}
    cut["trajectory"]["turns"][-1]["finish_reason"] = "length"
    cut |= {"status": "truncated", "finish_reason": "length"}
    store.write(RolloutRecord.model_validate(cut))
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        before = browser.dom(f"{url}/rollouts/old")
        now = browser.dom(f"{url}/rollouts/t00000.2")
    assert "<b>truncated</b> max_tokens" in before and "<b>truncated</b> yes" not in before
    assert 'status-truncated">truncated' in now and "<b>finish</b> length" in now
    assert "<b>truncated</b> max_tokens" in now


#: A component name is user code's: shown as text, never markup.
HOSTILE = '<img src=x onerror="document.body.dataset.owned=1">'


def test_the_group_views_have_a_sortable_column_per_reward_component(
    browser: Browser, tmp_path: Path
) -> None:
    """The listing's groups (each component's mean, sorted by the server) and a rollout's
    group (each sibling's components, sorted on the page by a click); a component named
    with markup shows as its text."""
    store = FileStore(tmp_path, "exp")
    for i, correct in {1: 0.0, 2: 1.0, 8: 1.0, 9: 1.0}.items():
        info = {"correct": correct, HOSTILE: 0.5}
        store.write(small_record(i).model_copy(update={"reward": 1.0, "reward_info": info}))
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        listing_html = browser.dom(f"{url}/?gSort=reward/correct&gOrder=desc")
        page_html = browser.dom(f"{url}/rollouts/{small_record(1).rollout_key}")
    listing, page = Elements(listing_html), Elements(page_html)
    assert not [tag for tag, _ in listing.tags + page.tags if tag == "img"]
    assert "data-owned" not in listing_html + page_html
    headers = [a for tag, a in listing.tags if tag == "th" and a.get("data-component")]
    group_headers = headers[-2:]  # after the rollouts' own
    assert [a["data-sort"] for a in group_headers] == [f"reward/{HOSTILE}", "reward/correct"]
    groups = [a["data-group"] for a in listing.with_attr("data-group")]
    assert groups == ["exp:t00001", "exp:t00000"]
    assert "0.500" in listing_html  # t00000's mean of correct
    siblings = [a for tag, a in page.tags if tag == "th" and a.get("data-component")]
    assert [a["data-sort"] for a in siblings] == [f"reward/{HOSTILE}", "reward/correct"]
    cells = [a["data-component"] for a in page.with_attr("data-component") if "data-sort" not in a]
    assert cells == [HOSTILE, "correct"] * 2
