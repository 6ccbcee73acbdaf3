"""What the trainer adapters that take a step source's batches share: a round's whole groups
(``RoundGroups``) and the checks that a round of the trainer's can hold them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rollway.errors import ConfigError
from rollway.results import RolloutRecord

if TYPE_CHECKING:
    from rollway.client import StepBatch, StepSource

#: The sampling a trainer recomputes logprobs with: the source's must be the trainer's.
SAMPLING = ("temperature", "top_p", "top_k")


class RoundGroups:
    """``groups_per_step`` whole groups a round from ``source``. A batch short of groups
    (``lacking``: dynamic sampling hit its cap) is filled with whole groups of the next one, and
    what is left over starts the next round: no handed-over group is lost. ``batches``: the
    ``StepBatch``es the last round drew (their ``metrics`` to log). ``out_of_tasks``: what to
    change when the source runs out (the trainer's own setting)."""

    def __init__(self, source: StepSource, out_of_tasks: str) -> None:
        self.source = source
        self.out_of_tasks = out_of_tasks
        self.left_over: list[list[RolloutRecord]] = []
        self.batches: list[StepBatch] = []

    def take(self) -> list[list[RolloutRecord]]:
        self.batches = []
        while self._short:
            try:
                self._add(self.source.next_batch())
            except StopIteration:
                raise self._ran_out() from None
        return self._cut()

    async def take_async(self) -> list[list[RolloutRecord]]:
        """``take`` without blocking the running loop."""
        self.batches = []
        while self._short:
            try:
                self._add(await self.source.next_batch_async())
            except StopAsyncIteration:
                raise self._ran_out() from None
        return self._cut()

    @property
    def _short(self) -> bool:
        return len(self.left_over) < self.source.plan.groups_per_step

    def _add(self, batch: StepBatch) -> None:
        self.batches.append(batch)
        self.left_over += batch.groups

    def _cut(self) -> list[list[RolloutRecord]]:
        need = self.source.plan.groups_per_step
        groups, self.left_over = self.left_over[:need], self.left_over[need:]
        return groups

    def _ran_out(self) -> ConfigError:
        need = self.source.plan.groups_per_step
        return ConfigError(
            f"the step source has run out of tasks ({len(self.left_over)} of {need} groups "
            f"left for this round): {self.out_of_tasks}, or give the source more tasks or "
            "epochs",
            "tasks",
        )


def check_rows(source: StepSource, rows: int, what: str, field: str) -> None:
    """A ``ConfigError`` unless a round of ``rows`` rows (``what``: the trainer's settings that
    make it, ``field`` the one to name) is one batch: ``groups_per_step * group_size``."""
    plan = source.plan
    want = plan.groups_per_step * plan.group_size
    if rows != want:
        raise ConfigError(
            f"the trainer's round has {rows} rows ({what}) but the step source hands over "
            f"{plan.groups_per_step} groups of {plan.group_size} = {want}: make them equal",
            field,
        )


def check_group_size(source: StepSource, size: int, field: str) -> None:
    """A ``ConfigError`` unless the trainer groups ``size`` rows as the source does."""
    if size != source.plan.group_size:
        raise ConfigError(
            f"{field}={size} but the step source's group_size={source.plan.group_size}: the "
            "trainer's advantage groups that many rows in a row",
            field,
        )


def check_sampling(
    source: StepSource, wanted: Mapping[str, Any], name_of: Callable[[str], str]
) -> None:
    """A ``ConfigError`` where the trainer's temperature, top-p or top-k (``wanted``, those
    present) differ from the source's: the recorded logprobs would not be the ones the trainer
    recomputes. ``name_of``: the trainer's name of a setting."""
    sampled = source.plan.settings.sampling
    for name in SAMPLING:
        if name in wanted and getattr(sampled, name) != wanted[name]:
            raise ConfigError(
                f"the step source samples with {name}={getattr(sampled, name)!r} but "
                f"{name_of(name)}={wanted[name]!r}, and the trainer recomputes logprobs with "
                "its own: make the source with the trainer's sampling",
                name,
            )
