"""SkyRL's PPO trainer taking its batches from a step source: ``StepSourceGenerator``, a
``RollwayGenerator`` whose training ``generate`` hands SkyRL the step's whole groups
(``client.step_source``) instead of running the batch's prompts.

    source = client.step_source(tasks, group_size=G, groups_per_step=B, temperature=T)

    class RollwayExp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            return StepSourceGenerator(client, source)

SkyRL still draws its prompts (``train_batch_size`` a step, each ``n_samples_per_prompt``
times); they only pace the steps and must be as many rows as a batch. Rows are the records'
samples as ``RollwayGenerator`` maps them, groups contiguous, each ``trajectory_id`` the
record's ``group_id`` and ``sample_index``: SkyRL's advantage then groups a rollway group.
Eval batches run their own prompts, as ``RollwayGenerator`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollway.client import RolloutClient
from rollway.errors import ConfigError
from rollway.trainers.skyrl import (
    InputRow,
    RollwayGenerator,
    generator_output,
    skyrl_sampling,
)
from rollway.trainers.step_rounds import (
    RoundGroups,
    check_group_size,
    check_rows,
    check_sampling,
)
from rollway.trainers.trl import full_record

try:
    from skyrl.train.generators.base import GeneratorInput, GeneratorOutput, TrajectoryID
except ImportError as error:  # the main venv has no SkyRL: its pins conflict with rollway's
    raise ImportError(
        f"rollway.trainers.skyrl_steps needs SkyRL (skyrl==0.4.0), which lives in its own venv: "
        f"run `scripts/trainer_venvs.sh skyrl` and use .venv-skyrl/bin/python ({error})"
    ) from error

if TYPE_CHECKING:
    from rollway.client import StepBatch, StepSource

__all__ = ["StepSourceGenerator"]


class StepSourceGenerator(RollwayGenerator):
    """A SkyRL generator handing over ``source``'s batches (``source`` made by ``client``).

    A training batch (``batch_metadata.training_phase`` ``train``) must hold one step's rows:
    ``train_batch_size * n_samples_per_prompt`` equal to ``groups_per_step * group_size``, and
    ``n_samples_per_prompt`` equal to ``group_size``; its temperature, top-p and top-k the
    source's. Each is checked before a batch is taken (``ConfigError`` naming it). A batch
    short of groups is filled from the next one (``RoundGroups``); ``batches``: the
    ``StepBatch``es the last call drew (log their ``metrics``). ``step_wise`` and
    ``placeholder_token_id`` as for ``RollwayGenerator``."""

    def __init__(
        self,
        client: RolloutClient,
        source: StepSource,
        *,
        step_wise: bool = False,
        placeholder_token_id: int = 0,
    ) -> None:
        super().__init__(client, step_wise=step_wise, placeholder_token_id=placeholder_token_id)
        self.source = source
        self.rounds = RoundGroups(source, "lower trainer.epochs or the dataset's size")

    @property
    def batches(self) -> list[StepBatch]:
        return self.rounds.batches

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        metadata = input_batch.get("batch_metadata")
        if metadata is not None and metadata.training_phase != "train":
            return await super().generate(input_batch)
        options, want_logprobs = skyrl_sampling(input_batch.get("sampling_params"))
        check_batch(self.source, input_batch, options)
        groups = await self.rounds.take_async()
        records = [full_record(self.client, record) for group in groups for record in group]
        rows = [
            InputRow(index, record.task.get("prompt"), None, {},
                 TrajectoryID(record.group_id, record.sample_index))
            for index, record in enumerate(records)
        ]  # fmt: skip
        outs = [self._outs(record) for record in records]
        return generator_output(rows, records, outs, want_logprobs, self.step_wise)


def check_batch(source: StepSource, batch: GeneratorInput, options: dict[str, Any]) -> None:
    """A ``ConfigError`` where SkyRL's training batch cannot take ``source``'s batches: another
    row count or group size, or other sampling."""
    what = "train_batch_size * n_samples_per_prompt"
    check_rows(source, len(batch["prompts"]), what, "train_batch_size")
    ids = batch.get("trajectory_ids") or []
    sizes: dict[str, int] = {}
    for trajectory_id in ids:
        sizes[trajectory_id.instance_id] = sizes.get(trajectory_id.instance_id, 0) + 1
    if len(set(sizes.values())) > 1:
        raise ConfigError(
            f"instances with {sorted(set(sizes.values()))} repetitions: SkyRL's batch must "
            "repeat each prompt equally",
            "n_samples_per_prompt",
        )
    if sizes:
        check_group_size(source, next(iter(sizes.values())), "n_samples_per_prompt")
    check_sampling(source, options, lambda name: f"sampling_params[{name!r}]")
