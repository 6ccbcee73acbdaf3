"""Which rollout to run (a task row and its place in its group), and the ids a rollout and each
of its attempts go by. How it runs (the batch's settings) is ``rollouts.config``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from rollway.ids import TASK_KEY_MAX_LENGTH
from rollway.rollouts.config import RolloutConfig


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """Which rollout: a task row and its place in its group."""

    task: dict[str, Any]
    task_index: int
    task_key: str
    group_id: str
    group_index: int
    sample_index: int
    #: Above 1 when a rollout is run again after its worker died: gateway ids stay unique.
    first_attempt: int = 1
    #: The batch (or single invoke) it belongs to; its record says so.
    run_id: str | None = None
    #: What its seed derives from, where that is not ``rollout_key``: a single invoke's key
    #: carries a unique suffix, its seed must not (the same task and seed draw the same tokens).
    seed_key: str | None = None
    #: What its record will say made it (``client.fingerprint``): resume compares it.
    fingerprint: dict[str, Any] | None = None

    @property
    def rollout_key(self) -> str:
        return f"{self.task_key}.{self.sample_index}"

    def seed(self, run_seed: int) -> int:
        """This rollout's engine seed: the first 4 bytes (little-endian) of
        ``sha256(f"{run_seed}:{task key}.{sample index}")``, so a group's samples differ and a
        rerun (or an invoke of the same task) draws the same tokens."""
        key = self.seed_key if self.seed_key is not None else self.rollout_key
        digest = hashlib.sha256(f"{run_seed}:{key}".encode()).digest()
        return int.from_bytes(digest[:4], "little")


def task_key(task: dict[str, Any]) -> str:
    """A stable key: the task's ``task_id`` when it has one, else a hash of its content."""
    given = task.get("task_id")
    text = str(given)
    usable = len(text) <= TASK_KEY_MAX_LENGTH and text.isascii()
    if given is not None and usable and text.replace("-", "").replace("_", "").isalnum():
        return text
    return hashlib.sha256(orjson.dumps(task, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def attempt_id(settings: RolloutConfig, spec: RolloutSpec, attempt: int) -> str:
    """The gateway's id for one attempt of a rollout."""
    return f"{settings.exp_id}.{spec.rollout_key}.{attempt}"
