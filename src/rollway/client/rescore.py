"""Rescoring a recorded run: rewards computed again over the stored trajectories, without
running a single rollout. Each record a reward function can score (one that completed or was
truncated, or whose reward failed) gets the new reward and components; what it said before is
kept in its ``reward_history``, and the run's ``groups.json`` and ``summary.json`` are made
again from the records. A record this function has already scored is skipped, so a rescore cut
short goes on where it stopped when run again; a failed score is tried again.

A rescore never makes a run worse unless asked: a record whose new reward fails keeps its
reward and status, the failed try noted in ``reward_info["rescore_failed"]``
(``replace_on_failure``: it becomes ``error/reward``). It holds the experiment's lease while it
runs (a live client is refused, and refused while it runs), checks records as export does (one
whose token data do not line up is a bad record), and writes back a record only as it read it,
with its reward fields replaced (one that changed meanwhile is left to what changed it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rollway.client.batch import group_stats, outcome_figures
from rollway.errors import BadRecordError, ConfigError, StoredDataError
from rollway.gateway.handle import GatewayHandle
from rollway.leases import DEFAULT_TTL_S, Lease, LeaseHolder
from rollway.loop_thread import run_to_end
from rollway.results import PastReward, RolloutRecord
from rollway.rollouts import RewardFn, RolloutLimits
from rollway.rollouts.judge import judges_in, judging, refuse_without_policy
from rollway.rollouts.rewards import reward_identity, score
from rollway.sandbox.environment import refuse_rescoring
from rollway.store.base import OnBadRecord, Store
from rollway.store.export import aligned

log = logging.getLogger(__name__)

#: Told of the report once the records to score are chosen, then after each is written.
OnProgress = Callable[["RescoreReport"], None]

T = TypeVar("T")


@dataclass
class RescoreReport:
    """What a rescore did: of the ``chosen`` records, those scored anew, those whose new reward
    failed (left as they were unless ``replace_on_failure``), those another writer changed
    since they were read (left to it); those not chosen (``skipped``: not scorable, or scored
    by this function already); the bad records skipped. ``reasons``: the failures' reasons."""

    reward_fn: str
    chosen: int = 0
    scored: int = 0
    failed: int = 0
    changed: int = 0
    skipped: int = 0
    bad: list[BadRecordError] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    interrupted: bool = False

    @property
    def done(self) -> int:
        return self.scored + self.failed + self.changed

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward_fn": self.reward_fn,
            "chosen": self.chosen,
            "scored": self.scored,
            "failed": self.failed,
            "changed": self.changed,
            "skipped": self.skipped,
            "bad": len(self.bad),
            "interrupted": self.interrupted,
        }


async def rescore_async(
    store: Store,
    reward_fn: RewardFn,
    *,
    failed_only: bool = False,
    again: bool = False,
    replace_on_failure: bool = False,
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
    its own asks ``gateway``'s (the client's); without one it is refused before any record is
    read, as a reward that uses the environment is. ``ExperimentInUseError`` while a client
    holds the experiment. Cancelled (Ctrl-C), the records scored so far stay scored and the
    summaries say so (``summary.rescored.interrupted``)."""
    if not callable(reward_fn):
        raise ConfigError("reward must be a callable: a reward function or a Rubric", "reward")
    refuse_rescoring(reward_fn)
    if gateway is None:
        refuse_without_policy(reward_fn)
    limits = limits or RolloutLimits()
    report = RescoreReport(reward_identity(reward_fn))
    # The judges that build their engine here close it here: an engine's HTTP session is bound
    # to this event loop (which ``rescore`` closes on return).
    opened = [judge for judge in judges_in(reward_fn) if not judge.holds_engine]

    def bad(error: BadRecordError) -> None:
        report.bad.append(error)
        if on_bad is not None:
            on_bad(error)

    async with _holding(store):
        try:
            records = await asyncio.to_thread(_readable, store, bad)
            chosen = [r for r, ok in records if ok and _wanted(r, report, failed_only, again)]
            report.chosen = len(chosen)
            report.skipped = sum(ok for _, ok in records) - len(chosen)
            if on_progress is not None:
                on_progress(report)
            rescoring = _Rescoring(
                store, reward_fn, report, limits, gateway, replace_on_failure, on_progress,
                {r.rollout_key: r for r, _ in records},
            )  # fmt: skip
            await rescoring.run(chosen, concurrency)
        finally:
            for judge in opened:
                await judge.aclose()
    return report


@dataclass
class _Rescoring:
    """One rescore's scoring and writing back; ``by_key``: the records the summaries are
    made of, each as last written."""

    store: Store
    reward_fn: RewardFn
    report: RescoreReport
    limits: RolloutLimits
    gateway: GatewayHandle | None
    replace_on_failure: bool
    on_progress: OnProgress | None
    by_key: dict[str, RolloutRecord]

    async def run(self, chosen: list[RolloutRecord], concurrency: int) -> None:
        """Score ``chosen``, ``concurrency`` at a time, then make the summaries again (also
        when cut short: of what was written)."""
        slots = asyncio.Semaphore(concurrency)
        tasks = [asyncio.ensure_future(self.one(record, slots)) for record in chosen]
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            self.report.interrupted = True
            raise
        finally:
            for task in tasks:  # a failure ends the others; a cancel has ended them already
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            records = list(self.by_key.values())
            await asyncio.to_thread(_summaries, self.store, records, self.report)

    async def one(self, record: RolloutRecord, slots: asyncio.Semaphore) -> None:
        async with slots:
            new, error = await _rescored(
                record,
                self.reward_fn,
                self.report.reward_fn,
                self.limits,
                self.gateway,
                self.replace_on_failure,
            )
            await _uninterrupted(self.write_back(record, new, error))

    async def write_back(self, read: RolloutRecord, new: RolloutRecord, error: str | None) -> None:
        """``new`` written where the store still holds ``read``, and counted."""
        report = self.report
        stored = await asyncio.to_thread(_write_if_unchanged, self.store, read, new)
        if stored is not new:  # the summaries count the record the store holds now
            if stored is None:
                self.by_key.pop(read.rollout_key, None)
            else:
                self.by_key[read.rollout_key] = stored
            report.changed += 1
        else:
            self.by_key[new.rollout_key] = new
            report.scored += error is None
            report.failed += error is not None
            report.reasons.update([error] if error is not None else [])
        if self.on_progress is not None:
            self.on_progress(report)


def _readable(store: Store, bad: OnBadRecord) -> list[tuple[RolloutRecord, bool]]:
    """Every record that reads, each with whether its token data line up (export's check:
    one that does not is passed to ``bad``, and is not scored, as export and resume skip it)."""
    return [(r, r.trajectory is None or aligned(r, bad)) for r in store.records(on_bad=bad)]


def _wanted(record: RolloutRecord, report: RescoreReport, failed_only: bool, again: bool) -> bool:
    """Whether ``record`` is one to score: it has a trajectory and finished (or only its reward
    failed), and this function has not scored it already (a failure is always tried again)."""
    reward_failed = record.error_kind == "reward"
    if record.trajectory is None or not (record.success or reward_failed):
        return False
    if failed_only and not reward_failed:
        return False
    return again or reward_failed or record.reward_info.get("reward_fn") != report.reward_fn


async def _rescored(
    record: RolloutRecord,
    reward_fn: RewardFn,
    identity: str,
    limits: RolloutLimits,
    gateway: GatewayHandle | None,
    replace_on_failure: bool,
) -> tuple[RolloutRecord, str | None]:
    """``record`` with its new score, the one it had kept in its history; or, where the new
    score failed (the reason second), as it was with the failure noted, unless
    ``replace_on_failure``."""
    assert record.trajectory is not None
    with judging(gateway, record.rollout_id) as judge_calls:
        scored = await score(
            reward_fn, record.task, record.trajectory, limits.reward_timeout, limits.reward_retries
        )
    info: dict[str, Any] = {**scored.info(), "source": "reward_fn", "reward_fn": identity}
    if judge_calls:
        info["judge_calls"] = judge_calls
    if scored.error is not None and not replace_on_failure:
        failure = {**info, "reason": scored.error, "at": time.time()}
        del failure["source"]
        kept = {**record.reward_info, "rescore_failed": failure}
        return record.model_copy(update={"reward_info": kept}), scored.error
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
    return record.model_copy(update=update), scored.error


def _write_if_unchanged(
    store: Store, read: RolloutRecord, new: RolloutRecord
) -> RolloutRecord | None:
    """Write ``new`` (``read`` with its reward fields replaced) only while the store still
    holds ``read``: a record written meanwhile (a new rollout under the same key) is newer
    than the trajectory scored, and stays. What the store holds now: ``new`` when written,
    else the other writer's record (None: gone, or no longer readable)."""
    try:
        current = store.get(read.rollout_key)
    except BadRecordError:
        current = None
    if current != read:
        log.warning(
            "record %s changed since the rescore read it: left as it is now", read.rollout_key
        )
        return current
    store.write(new)
    return new


async def _uninterrupted(step: Coroutine[Any, Any, T]) -> T:
    """``step`` run to its end even when the caller is cancelled meanwhile (then the cancel
    is raised after it): a record written is counted in the summaries."""
    running = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await running
        raise


@contextlib.asynccontextmanager
async def _holding(store: Store) -> AsyncIterator[None]:
    """The experiment's lease (``rollway.leases``), as a client running batches holds it:
    taken before any record is read, renewed every ``ttl / 6``, given back at the end."""
    lease = Lease(
        exp_id=store.exp_id,
        holder=LeaseHolder.this_process(),
        renewed_at=time.time(),
        ttl_s=DEFAULT_TTL_S,
    )
    await asyncio.to_thread(store.take_lease, lease)

    async def renew() -> None:
        while True:
            await asyncio.sleep(lease.ttl_s / 6)
            try:  # a renewal begun ends before the lease is given back, never after it
                await _uninterrupted(asyncio.to_thread(store.take_lease, lease.renewed()))
            except Exception as exc:  # the lease outlives a few missed beats
                log.warning("could not renew the lease on %r: %r", store.exp_id, exc)

    beat = asyncio.ensure_future(renew())
    try:
        yield
    finally:
        beat.cancel()
        await asyncio.wait([beat])
        try:
            await asyncio.to_thread(store.release_lease, lease.holder)
        except Exception as exc:  # one not given back lapses by itself
            log.warning("could not release the lease on %r: %r", store.exp_id, exc)


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
    return run_to_end(rescore_async(store, reward_fn, **options))
