"""TRL's ``GRPOTrainer`` sampling through rollway: a ``rollout_func`` over a ``RolloutClient``.

    client = RolloutClient(PromptAgent, engine="embedded", max_tokens=256)
    trainer = GRPOTrainer(model, reward_funcs=[rollway_reward], args=GRPOConfig(...),
                          train_dataset=dataset, rollout_func=rollway_rollout_func(client))

TRL (1.16, ``trl/trainer/grpo_trainer.py`` ``GRPOTrainer._generate``) calls
``rollout_func(prompts, trainer)`` with the prompts of one generation round, each already
repeated ``num_generations`` times in a row (its ``RepeatSampler``), and needs back
``prompt_ids``, ``completion_ids`` and ``logprobs``, one per prompt; ``env_mask`` (popped as
its tool mask) keeps tokens the model did not sample out of the loss, and any other key
reaches the reward functions as a per-completion column. Nothing here imports ``trl``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rollway.agents import AgentLoop, RolloutContext
from rollway.errors import ConfigError
from rollway.results import AgentResult, RolloutRecord
from rollway.trajectory import Sample

if TYPE_CHECKING:
    from rollway.client import RolloutClient

#: A TRL prompt: a string or a list of chat messages.
Prompt = str | list[dict[str, Any]]
TaskFn = Callable[[Prompt], dict[str, Any]]


def prompt_task(prompt: Prompt) -> dict[str, Any]:
    """The default task of a TRL prompt: ``{"prompt": prompt}`` (what ``PromptAgent`` reads)."""
    return {"prompt": prompt}


class PromptAgent(AgentLoop):
    """One model call on the task's ``prompt``: a list of chat messages, or a string sent as
    one user message (rollway always applies the chat template). Its reward is the client's
    reward function's, if any; TRL's reward functions score the completion either way."""

    name = "prompt"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        prompt = ctx.task["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        reply = await ctx.chat(list(messages))
        return ctx.complete([*messages, reply.message])


def rollway_reward(
    completions: list[Any], rollway_reward: list[float | None], **_: Any
) -> list[float | None]:
    """A TRL reward function giving each completion its rollway record's reward (the agent's
    or the client's reward function's). None (a failed rollout, or no reward) is left out of
    TRL's group baseline and gets no advantage."""
    return list(rollway_reward)


def rollway_rollout_func(
    client: RolloutClient,
    *,
    task_from_prompt: TaskFn = prompt_task,
    sync_weights: bool = True,
    weights_mode: str = "abort",
) -> Callable[[list[Prompt], Any], dict[str, list[Any]]]:
    """A TRL ``rollout_func`` running each generation round through ``client``.

    Each group of ``num_generations`` equal prompts becomes one task (``task_from_prompt``)
    run as a rollway group; the returned ids are the records' own: ``prompt_ids`` and
    ``completion_ids`` are the sample's ``prompt_ids`` and ``response_ids`` (a multi-turn
    rollout's tool output and template glue included), ``logprobs`` the engine's, ``env_mask``
    the sample's loss mask. Extra columns for reward functions: ``rollway_reward``,
    ``rollway_status``, ``rollway_rollout_id``, ``rollway_policy_version``. A rollout that
    failed becomes a one-token placeholder with mask 0 and reward None.

    Each round samples with the trainer's ``GRPOConfig`` (temperature, top-p, top-k, and
    ``max_completion_length`` as each call's ``max_tokens``: ``trainer_sampling``), and the
    ``logprobs`` are that temperature's, as TRL recomputes them.

    With ``sync_weights``, before a round whose trainer step differs from the last synced one
    (the first round included, as TRL does for vLLM), the trainer's model weights go into
    every engine with ``client.update_weights(state_dict, mode=weights_mode)``.
    """
    return _RolloutFunc(client, task_from_prompt, sync_weights, weights_mode)


class WeightSync:
    """Pushes a TRL trainer's weights into ``client``'s engines before the first round of each
    trainer step (the first round included, as TRL does for vLLM)."""

    def __init__(self, client: RolloutClient, mode: str) -> None:
        self.client = client
        self.mode = mode
        self.synced_step: int | None = None

    def __call__(self, trainer: Any) -> None:
        if trainer.state.global_step != self.synced_step:
            model = trainer.accelerator.unwrap_model(trainer.model)
            self.client.update_weights(model.state_dict(), mode=self.mode)
            self.synced_step = trainer.state.global_step


def full_record(client: RolloutClient, record: RolloutRecord) -> RolloutRecord:
    """The record with its trajectory: Ray workers send records back light, and their
    trajectories are in the store."""
    if record.trajectory is None and record.trajectory_stats is not None:
        return client.store.get(record.rollout_key) or record
    return record


class _RolloutFunc:
    def __init__(
        self, client: RolloutClient, task_from_prompt: TaskFn, sync_weights: bool, mode: str
    ) -> None:
        self.client = client
        self.task_from_prompt = task_from_prompt
        self.weights = WeightSync(client, mode) if sync_weights else None
        self.rounds = 0

    def __call__(self, prompts: list[Prompt], trainer: Any) -> dict[str, list[Any]]:
        if self.weights is not None:
            self.weights(trainer)
        generations = (
            trainer.num_generations if trainer.model.training else (trainer.num_generations_eval)
        )
        records = self.run_round(prompts, generations, **trainer_sampling(trainer.args))
        return trl_columns(records, trainer_eos_id(trainer.processing_class))

    def run_round(
        self, prompts: Sequence[Prompt], generations: int, **sampling: Any
    ) -> list[RolloutRecord]:
        """One record per prompt, in the prompts' order; ``sampling`` overrides the client's
        for this round (``trainer_sampling``)."""
        group = generations if _grouped(prompts, generations) else 1
        round_id, self.rounds = self.rounds, self.rounds + 1
        tasks = []
        for index, prompt in enumerate(prompts[::group]):
            # A fresh id per round: the store keeps every round, and resume never stands in
            # an older round's record for a new sample of the same prompt.
            tasks.append({"task_id": f"trl-{round_id}-{index}", **self.task_from_prompt(prompt)})
        records: list[RolloutRecord | None] = [None] * len(prompts)
        for item in self.client.run_batch(tasks, group_size=group, resume=False, **sampling):
            records[item.index] = full_record(self.client, item.result)
        done = [r for r in records if r is not None]
        assert len(done) == len(records)  # run_batch yields one item per task and rollout
        return done


def trainer_sampling(args: Any) -> dict[str, Any]:
    """The sampling a ``GRPOConfig`` asks for, as rollway options: ``temperature``, ``top_p``,
    ``top_k`` and ``max_completion_length`` (each model call's ``max_tokens``). TRL recomputes
    logprobs at its temperature, so rollouts must be sampled at it. What rollway's engines
    cannot sample with (``repetition_penalty``, ``min_p``, ``generation_kwargs``) is refused,
    naming the field, instead of being silently ignored."""
    unsupported = {
        "repetition_penalty": getattr(args, "repetition_penalty", 1.0) not in (None, 1.0),
        "min_p": getattr(args, "min_p", None) not in (None, 0.0),
        "generation_kwargs": bool(getattr(args, "generation_kwargs", None)),
    }
    for name, asked in unsupported.items():
        if asked:
            raise ConfigError(
                f"GRPOConfig.{name}={getattr(args, name)!r}: rollway's engines do not sample "
                "with it, and TRL would score completions as if they had; leave it unset",
                name,
            )
    options: dict[str, Any] = {
        "temperature": float(args.temperature),
        "top_p": float(getattr(args, "top_p", 1.0) or 1.0),
        "top_k": int(getattr(args, "top_k", 0) or 0),
    }
    if getattr(args, "max_completion_length", None) is not None:
        options["max_tokens"] = int(args.max_completion_length)
    return options


def trl_columns(records: Sequence[RolloutRecord], eos_id: int) -> dict[str, list[Any]]:
    """What TRL's ``rollout_func`` returns, one entry per record in each column."""
    rows = [_row(record, eos_id) for record in records]
    return {key: [row[key] for row in rows] for key in _COLUMNS}


_COLUMNS = (
    "prompt_ids",
    "completion_ids",
    "logprobs",
    "env_mask",
    "rollway_reward",
    "rollway_status",
    "rollway_rollout_id",
    "rollway_policy_version",
)


def _row(record: RolloutRecord, eos_id: int) -> dict[str, Any]:
    row = {
        "rollway_status": record.status,
        "rollway_rollout_id": record.rollout_id,
        "rollway_policy_version": record.policy_version,
    }
    sample = _only_sample(record)
    if sample is None:  # nothing to train on: one masked token, and no reward
        tokens = {
            "prompt_ids": [eos_id],
            "completion_ids": [eos_id],
            "logprobs": [0.0],
            "env_mask": [0],
            "rollway_reward": None,
        }
        return {**row, **tokens}
    return {
        **row,
        "prompt_ids": sample.prompt_ids,
        "completion_ids": sample.response_ids,
        "logprobs": sample.logprobs,
        "env_mask": sample.loss_mask,
        "rollway_reward": record.reward,
    }


def _only_sample(record: RolloutRecord) -> Sample | None:
    """The record's one sample; None when it failed or sampled nothing."""
    trajectory = record.trajectory
    samples = trajectory.samples if record.success and trajectory is not None else []
    if not samples:
        return None
    if len(samples) > 1:
        raise ConfigError(
            f"rollout {record.rollout_id} has {len(samples)} segments (its agent "
            "rewrote the conversation); TRL takes one completion per prompt",
            "agent",
        )
    sample = samples[0]
    return sample if sample.response_ids else None


def _grouped(prompts: Sequence[Prompt], generations: int) -> bool:
    """Whether ``prompts`` are whole runs of ``generations`` equal prompts (on several
    processes TRL may split a group between them: then each prompt is its own task)."""
    if generations < 1 or len(prompts) % generations:
        return False
    return all(
        prompts[start + k] == prompts[start]
        for start in range(0, len(prompts), generations)
        for k in range(1, generations)
    )


def trainer_eos_id(processing_class: Any) -> int:
    """The placeholder token of a failed rollout: the tokenizer's EOS."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)  # a processor's own
    return int(tokenizer.eos_token_id)


__all__ = [
    "Prompt",
    "PromptAgent",
    "TaskFn",
    "prompt_task",
    "rollway_reward",
    "rollway_rollout_func",
    "trainer_sampling",
]
