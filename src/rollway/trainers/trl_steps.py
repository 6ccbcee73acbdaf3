"""TRL's ``GRPOTrainer`` taking its batches from a step source: a ``rollout_func`` that hands
TRL each step's whole groups (``client.step_source``) instead of running TRL's prompts.

    source = client.step_source(tasks, group_size=G, groups_per_step=B, **trainer_sampling(args))
    trainer = GRPOTrainer(model, reward_funcs=[rollway_reward], args=args, train_dataset=pacer,
                          rollout_func=step_rollout_func(client, source))

TRL still draws prompts from its dataset (``pacer``: any rows with a ``prompt``), one
generation round a step; they only pace the steps. Each row returned is a handed-over record's
sample, mapped as ``rollway_rollout_func`` maps them (``trl_columns``), groups contiguous, so
that TRL's advantage, which groups ``num_generations`` rows in a row, is the group's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollway.errors import ConfigError
from rollway.trainers.step_rounds import (
    RoundGroups,
    check_group_size,
    check_rows,
    check_sampling,
)
from rollway.trainers.trl import (
    Prompt,
    WeightSync,
    full_record,
    trainer_eos_id,
    trainer_sampling,
    trl_columns,
)

if TYPE_CHECKING:
    from rollway.client import RolloutClient, StepBatch, StepSource


def step_rollout_func(
    client: RolloutClient,
    source: StepSource,
    *,
    sync_weights: bool = True,
    weights_mode: str = "abort",
) -> StepRolloutFunc:
    """A TRL ``rollout_func`` returning ``source``'s next batch (made by ``client``) for each
    training round, whatever the prompts. The round's rows must be the batch's:
    ``per_device_train_batch_size * steps_per_generation`` (by default
    ``gradient_accumulation_steps``) equal to ``groups_per_step * group_size``, and
    ``num_generations`` equal to ``group_size``; the source's temperature, top-p and top-k the
    ``GRPOConfig``'s. Each is checked before a batch is taken (``ConfigError`` naming it).

    A batch short of groups is filled from the next one (``RoundGroups``); ``batches``: the
    ``StepBatch``es the last round drew (log their ``metrics``). With ``sync_weights``, the
    trainer's weights go into ``client``'s engines before each new trainer step's batch, as
    ``rollway_rollout_func`` does. Eval rounds are refused: evaluate with
    ``rollway_rollout_func`` on the eval prompts instead."""
    weights = WeightSync(client, weights_mode) if sync_weights else None
    return StepRolloutFunc(client, source, weights)


class StepRolloutFunc:
    """The ``rollout_func`` of ``step_rollout_func``."""

    def __init__(
        self, client: RolloutClient, source: StepSource, weights: WeightSync | None
    ) -> None:
        self.client = client
        self.source = source
        self.weights = weights
        self.rounds = RoundGroups(source, "lower GRPOConfig.max_steps")

    @property
    def batches(self) -> list[StepBatch]:
        return self.rounds.batches

    def __call__(self, prompts: list[Prompt], trainer: Any) -> dict[str, list[Any]]:
        check_trainer(self.source, len(prompts), trainer)
        if self.weights is not None:
            self.weights(trainer)
        groups = self.rounds.take()
        records = [full_record(self.client, record) for group in groups for record in group]
        return trl_columns(records, trainer_eos_id(trainer.processing_class))


def check_trainer(source: StepSource, rows: int, trainer: Any) -> None:
    """A ``ConfigError`` where a TRL round of ``rows`` prompts cannot take ``source``'s
    batches: an eval round, another row count or group size, or other sampling."""
    if not trainer.model.training:
        raise ConfigError(
            "a step source feeds training rounds only; evaluate with rollway_rollout_func "
            "(or set GRPOConfig.eval_strategy='no')",
            "eval_strategy",
        )
    what = ("per_device_train_batch_size * steps_per_generation, by default "
            "gradient_accumulation_steps, per process")  # fmt: skip
    check_rows(source, rows, what, "per_device_train_batch_size")
    check_group_size(source, trainer.num_generations, "num_generations")
    check_sampling(source, trainer_sampling(trainer.args), lambda name: f"GRPOConfig.{name}")


__all__ = ["StepRolloutFunc", "step_rollout_func"]
