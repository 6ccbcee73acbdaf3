"""One rollout for its page: the record, its whole conversation segment by segment
(``conversation``), its group's rollouts with their advantages, each turn, the token stream per
sample (``token_view``), and the debug events the run kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from rollway.results import RolloutRecord
from rollway.viewer.conversation import conversation
from rollway.viewer.record_files import read_plain_file
from rollway.viewer.run_index import RunLocation
from rollway.viewer.token_view import (
    PAGE_TOKENS,
    TokenTexts,
    model_names,
    sample_views,
    token_texts,
)

#: The most debug events a page shows per rollout (a chatty agent may log thousands).
MAX_DEBUG_EVENTS = 2000
#: A turn's per-token fields, which the page reads from the samples' token pages instead.
PER_TOKEN = {
    "new_prompt_ids",
    "completion_ids",
    "logprobs",
    "policy_versions",
    "raw_logprobs",
    "kept_mass",
    "distribution",
}


def rollout_detail(
    record: RolloutRecord,
    location: RunLocation,
    texts: TokenTexts,
    config: dict[str, Any],
    group: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``group``: the rollout's group as the listing has it (``RunIndex.group``)."""
    detail: dict[str, Any] = {
        "record": record.model_dump(mode="json", exclude={"trajectory"}),
        "group": group,
        "conversation": [],
        "trajectory": None,
        "turns": [],
        "samples": [],
        "page_tokens": PAGE_TOKENS,
        "tokenizer": None,
        "texts": {},
        "debug": debug_events(location.folder, record),
    }
    trajectory = record.trajectory
    if trajectory is None:
        return detail
    detail["trajectory"] = trajectory.model_dump(mode="json", exclude={"turns", "samples"})
    detail["turns"] = [
        {
            **turn.model_dump(mode="json", exclude=PER_TOKEN),
            "prompt_tokens": turn.prompt_len,
            "completion_tokens": len(turn.completion_ids),
            "policy_versions": sorted(set(turn.policy_versions or [])),
        }
        for turn in trajectory.turns
    ]
    views = sample_views(trajectory)
    detail["samples"] = views
    model = config.get("model")
    names = model_names(trajectory, model if isinstance(model, str) else None)
    detail["conversation"] = conversation(trajectory, lambda ids: texts.decode(names, ids))
    detail["tokenizer"], detail["texts"] = token_texts(
        texts, trajectory, views, model if isinstance(model, str) else None
    )
    return detail


def debug_events(folder: Path | None, record: RolloutRecord) -> list[dict[str, Any]]:
    """The events ``debug=True`` wrote for each attempt (``debug/<exp>.<key>.<attempt>.jsonl``),
    oldest first, each with its attempt; torn lines skipped, as are files that are not regular
    (a symbolic link is not followed)."""
    debug = folder / "debug" if folder else None
    if debug is None or not debug.is_dir():
        return []
    prefix = f"{record.exp_id}.{record.rollout_key}."
    attempts = []
    for path in debug.glob(f"{prefix}*.jsonl"):
        number = path.name.removeprefix(prefix).removesuffix(".jsonl")
        if number.isdigit():  # not another key that starts like this one
            attempts.append((int(number), path))
    events: list[dict[str, Any]] = []
    for attempt, path in sorted(attempts):
        try:
            data = read_plain_file(path)
        except OSError:
            continue
        for line in data.splitlines():
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append({"attempt": attempt, **event})
    events.sort(key=_event_time)
    return events[:MAX_DEBUG_EVENTS]


def _event_time(event: dict[str, Any]) -> float:
    """An event's time; 0.0 where it has none (it sorts first)."""
    at = event.get("t")
    return float(at) if isinstance(at, int | float) else 0.0
