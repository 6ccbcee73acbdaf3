"""The RL views in headless Chromium: a folded rollout's segments and few-shot marks, its group
with advantages, the token shading toggle (logprob, entropy, mask) and printed logprobs, and the
reward-by-version chart on the listing."""

from __future__ import annotations

import re
from pathlib import Path

from rollway.store import FileStore
from rollway.trajectory import Trajectory
from rollway.viewer import create_viewer_app, open_run
from rollway.web.background_server import BackgroundServer
from tests.trajectories import chain
from tests.viewer.conftest import FOLDED_ID, Browser, RealRun
from tests.viewer.test_listing_scale import small_record
from tests.viewer.test_rl_views import versioned_run
from tests.viewer.test_token_view import turn
from tests.viewer.test_viewer_browser import Elements


def by_id(dom: Elements, name: str) -> dict[str, str | None]:
    return next(attrs for _, attrs in dom.tags if attrs.get("id") == name)


def test_a_folded_rollout_shows_every_segment_and_marks_few_shot_messages(
    browser: Browser, folded_run: RealRun
) -> None:
    record = FileStore(folded_run.folder.parent, FOLDED_ID).get("fold.0")
    assert record is not None and record.trajectory is not None
    with BackgroundServer(create_viewer_app(open_run(str(folded_run.folder)))) as url:
        html = browser.dom(f"{url}/rollouts/fold.0")
    dom = Elements(html)
    assert [a["data-segment-start"] for a in dom.with_attr("data-segment-start")] == ["0", "1"]
    assert "segment 1 starts: history rewritten" in html
    assert [a["data-part"] for a in dom.with_attr("data-part")] == ["prompt", "between"]
    # Segment 0's two replies, rebuilt; then the last request's messages, tied to their turns.
    sampled = [a["data-sampled-turn"] for a in dom.with_attr("data-sampled-turn")]
    assert sampled == ["0", "1", "0", "1", "2"]
    assert len(dom.with_attr("data-not-sampled")) == html.count("few-shot / not sampled") == 2
    # The run recorded entropy: that shade may be chosen.
    assert "disabled" not in by_id(dom, "shade-entropy")
    assert "hidden" in by_id(dom, "entropy-note")


def test_a_rollout_page_lists_its_group_with_advantages(
    browser: Browser, viewer_url: str, real_run: RealRun
) -> None:
    dom = Elements(browser.dom(f"{viewer_url}/rollouts/add.0"))
    assert [a["data-sibling"] for a in dom.with_attr("data-sibling")] == ["add.0", "add.1"]
    assert [a["data-sibling"] for a in dom.with_attr("data-current")] == ["add.0"]
    links = {a["href"] for tag, a in dom.tags if tag == "a"}
    assert "/rollouts/add.1" in links and "/rollouts/add.0" not in links
    assert len([a for a in dom.with_attr("data-advantage") if a["data-advantage"] != ""]) == 2
    # The run left record_entropy at its default (off): no entropy shade, and a note says why.
    assert "disabled" in by_id(dom, "shade-entropy")
    assert "hidden" not in by_id(dom, "entropy-note")


def shaded_trajectory() -> Trajectory:
    """Every sampled token at logprob -0.5; entropies of 0 and 3 nats alternating."""
    turns = [
        turn(0, 0, [1, 2, 3], [4, 5]) | {"distribution": {"entropy": [0.0, 3.0]}},
        turn(1, 0, [1, 2, 3, 4, 5, 6, 7], [8]) | {"distribution": {"entropy": [0.0]}},
        turn(2, 1, [1, 9], [10, 11, 12]) | {"distribution": {"entropy": [3.0, 0.0, 3.0]}},
    ]
    return Trajectory(
        rollout_id="r", model="m", sampling={}, max_turns=None, max_seq_len=None, messages=[],
        tools=None, turns=chain(turns), is_truncated=False, truncation_reason=None,
        is_cancelled=False, segment_count=2, drift=None,
    )  # fmt: skip


def sampled_styles(dom: Elements) -> list[str | None]:
    return [a.get("style") for a in dom.with_attr("data-mask") if a["data-mask"] == "1"]


def test_tokens_shade_by_logprob_entropy_or_mask_and_print_logprobs(
    browser: Browser, tmp_path: Path
) -> None:
    store = FileStore(tmp_path, "exp")
    record = small_record(1).model_copy(update={"trajectory": shaded_trajectory()})
    store.write(record)
    page = f"/rollouts/{record.rollout_key}"
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        by_logprob = browser.dom(f"{url}{page}")
        by_entropy = browser.dom(f"{url}{page}?shade=entropy&logprobs=1")
        by_mask = browser.dom(f"{url}{page}?shade=mask")
    entropies = [0.0, 3.0, 0.0, 3.0, 0.0, 3.0]  # the sampled tokens', in page order
    logprob = sampled_styles(Elements(by_logprob))
    assert len(logprob) == 6 and len(set(logprob)) == 1  # one logprob: one shade
    assert "<sub" not in by_logprob
    entropy = sampled_styles(Elements(by_entropy))
    pairs = set(zip(entropies, entropy, strict=True))
    assert len(pairs) == 2 and len({style for _, style in pairs}) == 2  # a shade per entropy
    assert by_id(Elements(by_entropy), "samples")["data-shade"] == "entropy"
    assert re.findall(r'<sub class="lp">([^<]*)</sub>', by_entropy) == ["-0.50"] * 6
    mask = sampled_styles(Elements(by_mask))
    assert len(set(mask)) == 1 and mask[0] not in (logprob[0], *entropy)


def test_the_listing_charts_reward_and_completion_by_policy_version(
    browser: Browser, tmp_path: Path
) -> None:
    records = versioned_run(tmp_path)
    with BackgroundServer(create_viewer_app(open_run(str(tmp_path / "exp")))) as url:
        dom = Elements(browser.dom(f"{url}/"))
    bars = {a["data-chart-version"]: a for tag, a in dom.tags if tag == "rect"}
    assert sorted(bars) == ["0", "1", "none"]
    assert [float(bars[v]["data-mean"] or "nan") for v in ("0", "1", "none")] == [
        0.5,
        0.8125,
        0.0,
    ]
    assert [bars[v]["data-n"] for v in ("0", "1", "none")] == ["4", "5", "1"]
    assert [bars[v]["data-completed"] for v in ("0", "1", "none")] == ["0.75", "0.8", "0"]
    dots = [a["data-chart-version"] for tag, a in dom.tags if tag == "circle"]
    assert dots == ["0", "1", "none"]
    rows = [a["data-version-row"] for a in dom.with_attr("data-version-row")]
    assert rows == ["0", "1", "none"]
    advantages = [a["data-advantage"] for a in dom.with_attr("data-advantage")]
    assert len(advantages) == len(records) and "" in advantages  # the engine failure's
