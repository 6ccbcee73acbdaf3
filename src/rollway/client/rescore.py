"""Rescoring a recorded run: rewards computed again over the stored trajectories, without
running a single rollout. Each record a reward function can score (one that completed or was
truncated, or whose reward failed) gets the new reward and components; what it said before is
kept in its ``reward_history``, and the run's ``groups.json`` and ``summary.json`` are made
again from the records. A record this function has already scored is skipped, so a rescore cut
short goes on where it stopped when run again; a failed score is tried again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollway.client.batch import group_stats, outcome_figures
from rollway.errors import BadRecordError, ConfigError, StoredDataError
from rollway.gateway.handle import GatewayHandle
from rollway.results import PastReward, RolloutRecord
from rollway.rollouts import RewardFn, RolloutLimits
from rollway.rollouts.judge import judging
from rollway.rollouts.rewards import reward_identity, score
from rollway.sandbox.environment import refuse_rescoring
from rollway.store.base import OnBadRecord, Store

#: Told after each record is scored (or fails to be), with how many are done and of how many.
OnProgress = Callable[[int, int], None]


@dataclass
class RescoreReport:
    """What a rescore did: records scored anew, those whose reward failed (``error/reward``),
    those left as they were (not scorable, or scored by this function already), and the bad
    records skipped."""

    reward_fn: str
    scored: int = 0
    failed: int = 0
    skipped: int = 0
    bad: list[BadRecordError] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward_fn": self.reward_fn,
            "scored": self.scored,
            "failed": self.failed,
            "skipped": self.skipped,
            "bad": len(self.bad),
        }


async def rescore_async(
    store: Store,
    reward_fn: RewardFn,
    *,
    failed_only: bool = False,
    again: bool = False,
    limits: RolloutLimits | None = None,
    concurrency: int = 8,
    on_bad: OnBadRecord | None = None,
    on_progress: OnProgress | None = None,
    gateway: GatewayHandle | None = None,
) -> RescoreReport:
    """Score ``store``'s records again with ``reward_fn`` (``failed_only``: only those whose
    reward failed; ``again``: those this function scored already too), ``concurrency`` at a
    time, each under ``limits``' ``reward_timeout`` and ``reward_retries``. A bad record goes
    to ``on_bad`` (always counted in the report) and is skipped. A ``Judge`` with no engine of
    its own asks ``gateway``'s (the client's)."""
    if not callable(reward_fn):
        raise ConfigError("reward must be a callable: a reward function or a Rubric", "reward")
    refuse_rescoring(reward_fn)
    limits = limits or RolloutLimits()
    report = RescoreReport(reward_identity(reward_fn))

    def bad(error: BadRecordError) -> None:
        report.bad.append(error)
        if on_bad is not None:
            on_bad(error)

    records = await asyncio.to_thread(lambda: list(store.records(on_bad=bad)))
    chosen = [r for r in records if _wanted(r, report.reward_fn, failed_only, again)]
    report.skipped = len(records) - len(chosen)
    slots = asyncio.Semaphore(concurrency)
    by_key = {r.rollout_key: r for r in records}

    async def one(record: RolloutRecord) -> None:
        async with slots:
            new = await _rescored(record, reward_fn, report.reward_fn, limits, gateway)
            await asyncio.to_thread(store.write, new)
        by_key[new.rollout_key] = new
        report.failed += new.error_kind == "reward"
        report.scored += new.error_kind != "reward"
        if on_progress is not None:
            on_progress(report.scored + report.failed, len(chosen))

    await asyncio.gather(*(one(record) for record in chosen))
    await asyncio.to_thread(_summaries, store, list(by_key.values()), report)
    return report


def _wanted(record: RolloutRecord, identity: str, failed_only: bool, again: bool) -> bool:
    """Whether ``record`` is one to score: it has a trajectory and finished (or only its reward
    failed), and this function has not scored it already (a failure is always tried again)."""
    reward_failed = record.error_kind == "reward"
    if record.trajectory is None or not (record.success or reward_failed):
        return False
    if failed_only and not reward_failed:
        return False
    return again or reward_failed or record.reward_info.get("reward_fn") != identity


async def _rescored(
    record: RolloutRecord,
    reward_fn: RewardFn,
    identity: str,
    limits: RolloutLimits,
    gateway: GatewayHandle | None,
) -> RolloutRecord:
    """``record`` with its new score, the one it had kept in its history."""
    assert record.trajectory is not None
    with judging(gateway, record.rollout_id) as judge_calls:
        scored = await score(
            reward_fn, record.task, record.trajectory, limits.reward_timeout, limits.reward_retries
        )
    info: dict[str, Any] = {**scored.info(), "source": "reward_fn", "reward_fn": identity}
    if judge_calls:
        info["judge_calls"] = judge_calls
    if "agent_reward" in record.reward_info:
        info["agent_reward"] = record.reward_info["agent_reward"]
    past = PastReward(
        reward=record.reward,
        reward_info=record.reward_info,
        status=record.status,
        error_kind=record.error_kind,
        reason=record.reason,
        reward_fn=_scored_by(record),
        replaced_at=time.time(),
    )
    update: dict[str, Any] = {
        "reward": scored.reward,
        "reward_info": info,
        "reward_history": [*record.reward_history, past],
    }
    if scored.error is not None:
        update |= {"status": "error", "error_kind": "reward", "reason": scored.error}
    else:
        status = "truncated" if record.trajectory.is_truncated else "completed"
        update |= {"status": status, "error_kind": None, "reason": None}
    if record.fingerprint is not None:  # resume returns it to a batch with this function
        update["fingerprint"] = {**record.fingerprint, "reward": identity}
    return record.model_copy(update=update)


def _scored_by(record: RolloutRecord) -> str | None:
    """What gave ``record`` its reward: a rescore's function, the agent, or the run's
    function (from the fingerprint; None where an older record does not say)."""
    if "reward_fn" in record.reward_info:
        return str(record.reward_info["reward_fn"])
    if record.reward_info.get("source") == "agent":
        return "agent"
    fingerprint = record.fingerprint or {}
    return fingerprint.get("reward")


def _summaries(store: Store, records: list[RolloutRecord], report: RescoreReport) -> None:
    """``groups.json`` and ``summary.json`` made again from ``records``: the outcome and
    reward figures replaced, the run's own (throughput, latency) kept as they were."""
    store.write_summary("groups", {"groups": [g.to_dict() for g in group_stats(records)]})
    try:
        summary = store.read_summary("summary") or {}
    except StoredDataError:  # written again whole below: one cut short is as good as none
        summary = {}
    summary |= outcome_figures(records)
    summary["total"] = len(records)
    summary["rescored"] = {**report.to_dict(), "at": time.time()}
    store.write_summary("summary", summary)


def rescore(store: Store, reward_fn: RewardFn, **options: Any) -> RescoreReport:
    """``rescore_async`` from synchronous code (not from inside a running event loop)."""
    return asyncio.run(rescore_async(store, reward_fn, **options))
