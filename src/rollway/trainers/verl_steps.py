"""verl's PPO trainer taking its batches from a step source: ``StepSourceManager``, an
``AgentLoopManager`` whose training ``generate_sequences`` hands verl the step's whole groups
(``client.step_source``) instead of running the batch's prompts.

    source = client.step_source(tasks, group_size=n, groups_per_step=B, temperature=T)

    class RollwayTrainer(RayPPOTrainer):
        def init_workers(self):
            super().init_workers()
            self.async_rollout_manager = StepSourceManager(
                self.config, client, source, evaluate=self.async_rollout_manager)

verl's ``fit()`` still draws ``data.train_batch_size`` prompts a step, each repeated
``rollout.n`` times in a row; they only pace the steps and must be as many rows as a batch.
Each row is a handed-over record's sample as ``RollwayAgentLoop`` maps it
(``agent_loop_output``), padded and batched by verl's own ``AgentLoopWorker``
(``_agent_loop_postprocess``, ``_postprocess``), groups contiguous and one ``uid`` a group:
verl's GRPO advantage then groups a rollway group.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

# First: without verl, its ImportError says where verl is installed.
from rollway.trainers.verl import agent_loop_output, pad_id_of

# isort: split
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await

from rollway.client import RolloutClient
from rollway.errors import ConfigError
from rollway.results import RolloutRecord
from rollway.trainers.step_rounds import (
    RoundGroups,
    check_group_size,
    check_rows,
    check_sampling,
)
from rollway.trainers.trl import full_record

if TYPE_CHECKING:
    from rollway.client import StepBatch, StepSource

__all__ = ["StepSourceManager"]


class StepSourceManager(AgentLoopManager):
    """verl's rollout manager handing over ``source``'s batches (``source`` made by ``client``).

    ``config``: the trainer's whole config. A training batch must hold one step's rows:
    ``data.train_batch_size * rollout.n`` equal to ``groups_per_step * group_size``,
    ``rollout.n`` equal to ``group_size``, and ``rollout``'s temperature, top-p and top-k the
    source's; each is checked before a batch is taken (``ConfigError`` naming it). A batch short
    of groups is filled from the next one (``RoundGroups``); ``batches``: the ``StepBatch``es the
    last call drew (log their ``metrics``). Validation batches go to ``evaluate`` (verl's own
    ``AgentLoopManager``, which runs their prompts), or are refused without it. ``worker``: the
    ``AgentLoopWorker`` that pads (default: one built from ``config``, in this process)."""

    def __init__(
        self,
        config: Any,
        client: RolloutClient,
        source: StepSource,
        *,
        evaluate: Any = None,
        worker: AgentLoopWorker | None = None,
    ) -> None:
        super().__init__(config, llm_client=None)
        self.client = client
        self.source = source
        self.evaluate = evaluate
        self.worker = worker if worker is not None else AgentLoopWorker(config, llm_client=None)
        self.rounds = RoundGroups(source, "lower trainer.total_epochs or total_training_steps")

    @property
    def batches(self) -> list[StepBatch]:
        return self.rounds.batches

    @auto_await  # type: ignore[untyped-decorator]  # verl is untyped: fit() calls it without awaiting
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        if prompts.meta_info.get("validate", False):
            return await self._validate(prompts)
        check_prompts(self.source, prompts, self.worker.rollout_config)
        groups = await self.rounds.take_async()
        records = [full_record(self.client, record) for group in groups for record in group]
        output = await self._padded(records)
        output.non_tensor_batch.update(group_columns(records, prompts))
        # What verl's own manager leaves in meta_info: fit() reads its timing.
        metrics = output.meta_info.pop("metrics")
        timing = self._performance_metrics([metrics], output)
        output.meta_info = {"timing": timing, **output.meta_info}
        return output

    async def _padded(self, records: list[RolloutRecord]) -> DataProto:
        """The records as verl's worker pads and batches its agent loops' outputs."""
        for record in records:
            check_reward(record)
        config, worker = self.worker.rollout_config, self.worker
        padded = []
        for record in records:
            output = agent_loop_output(
                record,
                prompt_length=int(config.prompt_length),
                response_length=int(config.response_length),
                logprobs=bool(config.calculate_log_probs),
                pad_id=pad_id_of(worker.tokenizer),
            )
            padded.append(
                await worker._agent_loop_postprocess(output, False, raw_prompt=asked(record))
            )
        return worker._postprocess(padded, validate=False)

    async def _validate(self, prompts: DataProto) -> DataProto:
        if self.evaluate is None:
            raise ConfigError(
                "a step source feeds training batches only: give StepSourceManager "
                "evaluate= (verl's own AgentLoopManager runs the validation prompts), or set "
                "trainer.val_before_train=false and trainer.test_freq=-1",
                "evaluate",
            )
        answer = self.evaluate.generate_sequences(prompts)
        return await answer if inspect.isawaitable(answer) else answer


def check_prompts(source: StepSource, prompts: DataProto, rollout: Any) -> None:
    """A ``ConfigError`` where verl's training batch (``prompts``; ``rollout``: its rollout
    config) cannot take ``source``'s batches: another row count or group size, other sampling,
    REMAX's greedy rows, or ``uid``s not in runs of a group."""
    if "__do_sample__" in prompts.non_tensor_batch:
        raise ConfigError(
            "REMAX's greedy baseline rows cannot come from a step source: use another "
            "algorithm.adv_estimator (grpo, rloo, ...)",
            "adv_estimator",
        )
    check_rows(source, len(prompts), "data.train_batch_size * actor_rollout_ref.rollout.n",
               "train_batch_size")  # fmt: skip
    check_group_size(source, int(rollout.n), "rollout.n")
    sampling = {
        "temperature": float(rollout.temperature),
        "top_p": float(rollout.top_p),
        "top_k": max(int(rollout.top_k), 0),  # verl's -1 is rollway's 0: off
    }
    check_sampling(source, sampling, lambda name: f"actor_rollout_ref.rollout.{name}")
    if "uid" in prompts.non_tensor_batch:
        check_uid_runs(list(prompts.non_tensor_batch["uid"]), source.plan.group_size)


def check_uid_runs(uids: Sequence[Any], group_size: int) -> None:
    """A ``ConfigError`` unless ``uids`` come in runs of ``group_size`` equal ids, each run its
    own (``fit()``'s ``repeat(rollout.n, interleave=True)``): the groups are handed over so."""
    runs = [uids[start : start + group_size] for start in range(0, len(uids), group_size)]
    if any(len(set(run)) != 1 for run in runs) or len({run[0] for run in runs}) != len(runs):
        raise ConfigError(
            f"the batch's uid column is not one id per run of {group_size} rows: verl's fit() "
            "repeats each prompt rollout.n times in a row (interleave=True), and the step's "
            "groups take those runs' places",
            "uid",
        )


def group_columns(records: list[RolloutRecord], prompts: DataProto) -> dict[str, np.ndarray]:
    """``uid`` (the prompts' own where they have one, since ``fit()`` unions its batch with the
    output and requires them equal; else each record's ``group_id``), ``rollway_group_id`` and
    ``rollway_sample_index``."""
    group_ids = np.empty(len(records), dtype=object)
    group_ids[:] = [record.group_id for record in records]
    uid = prompts.non_tensor_batch.get("uid")
    return {
        "uid": group_ids if uid is None else uid,
        "rollway_group_id": group_ids,
        "rollway_sample_index": np.array([record.sample_index for record in records]),
    }


def check_reward(record: RolloutRecord) -> None:
    """A ``ConfigError`` for a successful rollout without a reward: verl would then score the
    whole batch with its own reward function, on its pacing prompts' columns."""
    if record.success and record.reward is None:
        raise ConfigError(
            f"rollout {record.rollout_id} has no reward: verl would score the step with its "
            "reward function on the pacing prompts' data, not on what ran; give the client "
            "reward= or have the agent return one",
            "reward",
        )


def asked(record: RolloutRecord) -> list[dict[str, Any]]:
    """The conversation before the model's first answer (verl's ``raw_prompt`` column)."""
    messages = record.messages
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    return messages if first is None else messages[:first]
