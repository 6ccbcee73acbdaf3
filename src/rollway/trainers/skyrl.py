"""SkyRL's PPO trainer sampling through rollway: a ``GeneratorInterface`` over a ``RolloutClient``.

    client = RolloutClient(PromptAgent, engine="embedded", reward=my_reward, max_tokens=256)

    class RollwayExp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            return RollwayGenerator(client, step_wise=cfg.generator.step_wise_trajectories)

SkyRL (``skyrl`` 0.4.0, ``skyrl/train/generators/base.py``) calls ``await generate(input_batch)``
with one row per trajectory: ``prompts`` (chat messages), ``env_classes``, ``env_extras`` (the
dataset row's other columns), vLLM-style ``sampling_params``, ``trajectory_ids``
(``TrajectoryID(instance_id, repetition_id)``: the ``n_samples_per_prompt`` repetitions of one
prompt share an ``instance_id``) and ``batch_metadata`` (global step, train or eval). It needs a
``GeneratorOutput`` back, rows in input order, which its trainer validates
(``validate_generator_output``) and pads into training tensors
(``convert_prompts_responses_to_batch_tensors``). SkyRL installs into its own venv
(``scripts/trainer_venvs.sh skyrl``); this module imports it at import time.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollway.client import RolloutClient
from rollway.errors import ConfigError
from rollway.results import RolloutRecord
from rollway.trainers.trl import PromptAgent, full_record
from rollway.trajectory import Sample

try:
    from skyrl.train.generators.base import (
        BatchMetadata,
        GeneratorInput,
        GeneratorInterface,
        GeneratorOutput,
        TrajectoryID,
    )
    from skyrl.train.generators.utils import get_rollout_metrics
except ImportError as error:  # the main venv has no SkyRL: its pins conflict with rollway's
    raise ImportError(
        f"rollway.trainers.skyrl needs SkyRL (skyrl==0.4.0), which lives in its own venv: "
        f"run `scripts/trainer_venvs.sh skyrl` and use .venv-skyrl/bin/python ({error})"
    ) from error

__all__ = ["RollwayGenerator", "skyrl_engine_spec", "skyrl_sampling"]

#: vLLM sampling keys that change only the text vLLM detokenizes (SkyRL's own generator reads
#: it); rollway returns token ids and parses the text itself, so they change nothing here.
_TEXT_ONLY = frozenset(
    {
        "skip_special_tokens",
        "include_stop_str_in_output",
        "spaces_between_special_tokens",
        "detokenize",
    }
)
#: vLLM sampling keys rollway's engines cannot honour, with the value that means "off".
_OFF = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "n": 1,
}
#: Keys a task gets from the generator; an ``env_extras`` column of that name would be lost.
_RESERVED = frozenset(
    {"task_id", "prompt", "env_class", "instance_id", "global_step", "training_phase"}
)


def skyrl_sampling(params: Mapping[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """SkyRL's vLLM sampling dict (``get_sampling_params_for_backend``) as rollway options, and
    whether it asks for logprobs. ``max_tokens`` caps each model call; ``top_k=-1`` is off.
    What rollway's engines do not sample with (``min_p``, penalties, ``n``, ``min_tokens`` over
    1, an unknown key) is refused, naming the key: SkyRL would train on the samples as if
    they had. None (no sampling params): the client's own, with logprobs."""
    if params is None:
        return {}, True
    flat = dict(params)
    extra = flat.pop("additional_kwargs", None) or {}  # SkyRL's DictConfig path keeps it nested
    flat.update({key: value for key, value in dict(extra).items() if key not in flat})
    options: dict[str, Any] = {}
    for key, value in flat.items():
        if value is None or key in _TEXT_ONLY or key == "logprobs":
            continue
        options.update(_option(key, value))
    return options, flat.get("logprobs") is not None


def _option(key: str, value: Any) -> dict[str, Any]:
    """One vLLM sampling key as rollway options (none where it asks for rollway's default)."""
    if key in ("temperature", "top_p"):
        return {key: float(value)}
    if key == "top_k":
        return {"top_k": max(int(value), 0)}  # vLLM's -1 and rollway's 0 both mean off
    if key in ("max_tokens", "seed"):
        return {key: int(value)}
    if key in ("stop", "stop_token_ids"):
        return {key: list(value)} if value else {}
    # vLLM holds back EOS for min_tokens tokens; at 1 (SkyRL's default) that only keeps a first
    # EOS out. rollway keeps the unmasked distribution's logprob, the one the trainer recomputes.
    if key == "min_tokens" and int(value) <= 1:
        return {}
    if key in _OFF and value == _OFF[key]:
        return {}
    raise ConfigError(
        f"SkyRL sampling_params[{key!r}]={value!r}: rollway's engines do not sample with it, "
        "and SkyRL would train on the samples as if they had; leave it unset",
        key,
    )


def skyrl_engine_spec(inference_engine_client: Any) -> str:
    """A ``vllm://`` engine spec for SkyRL's own vLLM servers (its ``InferenceEngineClient``'s
    data-plane URL), so that SkyRL's weight sync reaches the rollouts."""
    url = str(inference_engine_client.get_endpoint_url())
    return "vllm://" + url.split("://", 1)[-1].rstrip("/")


@dataclass(frozen=True)
class InputRow:
    """One input row of SkyRL's batch."""

    index: int
    prompt: Any
    env_class: str | None
    env_extras: dict[str, Any]
    trajectory_id: TrajectoryID


@dataclass(frozen=True)
class _Out:
    """One output row: a rollout's sample (a segment, with ``step_wise``) or a placeholder."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    stop_reason: str


class RollwayGenerator(GeneratorInterface):
    """A SkyRL generator whose rollouts run through ``client`` (or, without one, a client of
    ``agent`` on ``engine``, embedded by default, built with ``client_options``; closed by
    ``close``).

    The ``n_samples_per_prompt`` repetitions of an ``instance_id`` run as one rollway group
    (the task: ``{"prompt": messages, **env_extras, "env_class", "instance_id",
    "global_step", "training_phase"}``, what ``PromptAgent`` and reward functions read; the
    record's ``sample_index`` is the ``repetition_id``); the
    batch's ``sampling_params`` apply to it (``skyrl_sampling``). Each output row is a
    record's sample, unchanged: ``prompt_token_ids``, ``response_ids`` (tool output and
    template glue included), ``loss_masks``, ``rollout_logprobs`` (at the sampling
    temperature, which SkyRL's trainer recomputes at), ``rewards`` (the record's: the agent's or
    the client's reward function's), ``stop_reasons`` (the last turn's finish reason;
    ``length`` for a truncated rollout).

    A rollout whose agent rewrote its history has several samples (segments). With
    ``step_wise`` (set it as SkyRL's ``generator.step_wise_trajectories``), each segment is its
    own row, the rollout's ``trajectory_id`` on each and ``is_last_step`` on the last, which
    carries the reward: SkyRL computes the advantage on that row and gives it to every
    segment, as docs/trainers.md advises. Without it such a rollout is refused
    (``ConfigError``): one row cannot hold two exact samples. A failed rollout is one masked
    token (``placeholder_token_id``) with reward 0.0 and its status as the stop reason.
    """

    def __init__(
        self,
        client: RolloutClient | None = None,
        *,
        agent: Any = PromptAgent,
        engine: Any = "embedded",
        step_wise: bool = False,
        placeholder_token_id: int = 0,
        **client_options: Any,
    ) -> None:
        self.owns_client = client is None
        self.client = (
            client if client is not None else (RolloutClient(agent, engine, **client_options))
        )
        self.step_wise = step_wise
        self.placeholder_token_id = placeholder_token_id
        self.calls = itertools.count()

    def close(self) -> None:
        """Close the client if this generator made it."""
        if self.owns_client:
            self.client.close()

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        rows = _rows(input_batch)
        options, want_logprobs = skyrl_sampling(input_batch.get("sampling_params"))
        records = await self._run(rows, input_batch.get("batch_metadata"), options)
        outs = [self._outs(record) for record in records]
        return generator_output(rows, records, outs, want_logprobs, self.step_wise)

    async def _run(
        self, rows: list[InputRow], metadata: BatchMetadata | None, options: dict[str, Any]
    ) -> list[RolloutRecord]:
        """One record per row, in the rows' order."""
        groups = _groups(rows)
        size = len(groups[0])
        call = next(self.calls)
        tasks = [_task(group[0], metadata, call) for group in groups]
        records: list[RolloutRecord | None] = [None] * len(rows)
        # resume=False: a rerun of a step samples anew, never hands back an older sample.
        batch = self.client.run_batch_async(tasks, group_size=size, resume=False, **options)
        async for item in batch:
            record = full_record(self.client, item.result)
            records[groups[record.task_index][record.sample_index].index] = record
        assert all(record is not None for record in records)
        return records  # type: ignore[return-value]

    def _outs(self, record: RolloutRecord) -> list[_Out]:
        """A record's output rows: one per segment (one in all without ``step_wise``)."""
        samples = _samples(record)
        if not samples:  # nothing to train on: one masked token
            token = [self.placeholder_token_id]
            return [_Out(token, token, [0], [0.0], 0.0, record.status)]
        if len(samples) > 1 and not self.step_wise:
            raise ConfigError(
                f"rollout {record.rollout_id} has {len(samples)} segments (its agent rewrote "
                "the conversation); one SkyRL row holds one sample: set "
                "generator.step_wise_trajectories and RollwayGenerator(step_wise=True)",
                "step_wise",
            )
        if record.reward is None:
            raise ConfigError(
                f"rollout {record.rollout_id} has no reward: give the RolloutClient a "
                "reward= function, or have the agent return one; SkyRL trains on rewards",
                "reward",
            )
        last = len(samples) - 1
        return [
            _out(record, sample, record.reward if i == last else 0.0, i == last)
            for i, sample in enumerate(samples)
        ]


def _rows(batch: GeneratorInput) -> list[InputRow]:
    prompts = batch["prompts"]
    extras = batch.get("env_extras") or [{}] * len(prompts)
    classes = batch.get("env_classes") or [None] * len(prompts)
    # Without trajectory ids, each row is its own instance, as SkyRL's generator treats it.
    ids = batch.get("trajectory_ids") or [TrajectoryID(str(i), 0) for i in range(len(prompts))]
    for name, column in (("env_extras", extras), ("env_classes", classes), ("trajectory_ids", ids)):
        if len(column) != len(prompts):
            raise ConfigError(f"{name} has {len(column)} rows for {len(prompts)} prompts", name)
    return [
        InputRow(i, prompts[i], classes[i], dict(extras[i] or {}), ids[i])
        for i in range(len(prompts))
    ]


def _groups(rows: list[InputRow]) -> list[list[InputRow]]:
    """The rows as rollway groups: the repetitions of each ``instance_id`` (same prompt and
    extras, equally many each), in repetition order; otherwise one group per row."""
    by_instance: dict[str, list[InputRow]] = {}
    for row in rows:
        by_instance.setdefault(row.trajectory_id.instance_id, []).append(row)
    groups = [
        sorted(group, key=lambda r: r.trajectory_id.repetition_id) for group in by_instance.values()
    ]
    same_size = len({len(group) for group in groups}) == 1
    alike = all(
        (r.prompt, r.env_class, r.env_extras) == (g[0].prompt, g[0].env_class, g[0].env_extras)
        for g in groups
        for r in g
    )
    return groups if same_size and alike else [[row] for row in rows]


def _task(row: InputRow, metadata: BatchMetadata | None, call: int) -> dict[str, Any]:
    """The rollway task of a row: the dataset's columns as SkyRL gives them to its envs."""
    taken = _RESERVED & row.env_extras.keys()
    if taken:
        raise ConfigError(
            f"env_extras has {sorted(taken)}, which the generator sets on the task; rename "
            "the dataset column",
            "env_extras",
        )
    step = metadata.global_step if metadata is not None else None
    phase = metadata.training_phase if metadata is not None else "train"
    return {
        **row.env_extras,
        # A fresh id per call: the store keeps every step, and two steps never share a key.
        "task_id": f"skyrl-{phase}-{step}-{call}-{row.trajectory_id.instance_id}",
        "prompt": row.prompt,
        "env_class": row.env_class,
        # The group's: a rollout's repetition_id is its record's sample_index.
        "instance_id": row.trajectory_id.instance_id,
        "global_step": step,
        "training_phase": phase,
    }


def _samples(record: RolloutRecord) -> list[Sample]:
    """The record's samples that hold a response; none when it failed."""
    trajectory = record.trajectory
    samples = trajectory.samples if record.success and trajectory is not None else []
    return [sample for sample in samples if sample.response_ids]


def _out(record: RolloutRecord, sample: Sample, reward: float, last: bool) -> _Out:
    trajectory = record.trajectory
    assert trajectory is not None
    turns = [turn for turn in trajectory.turns if turn.segment == sample.segment]
    stop = turns[-1].finish_reason if turns else "stop"
    if last and trajectory.is_truncated:
        stop = "length"  # SkyRL's overlong filtering and zero_reward_on_non_stop read this
    return _Out(
        sample.prompt_ids,
        sample.response_ids,
        sample.loss_mask,
        sample.logprobs,
        float(reward),
        stop,
    )


def generator_output(
    rows: Sequence[InputRow],
    records: Sequence[RolloutRecord],
    outs: Sequence[list[_Out]],
    want_logprobs: bool,
    step_wise: bool,
) -> GeneratorOutput:
    """SkyRL's ``GeneratorOutput``: each row's outputs in input order (a trajectory's steps
    adjacent, as SkyRL's step-wise validation requires)."""
    flat = [
        (row, record, out, i == len(row_outs) - 1)
        for row, record, row_outs in zip(rows, records, outs, strict=True)
        for i, out in enumerate(row_outs)
    ]
    times = [record.elapsed_s for record in records]
    splits = {
        "llm": [record.metrics.llm_latency_ms / 1000 for record in records],
        "env": [record.metrics.tool_latency_ms / 1000 for record in records],
    }
    responses = [out.response_ids for _, _, out, _ in flat]
    rewards = [out.reward for _, _, out, _ in flat]
    masks = [out.loss_mask for _, _, out, _ in flat]
    metrics = get_rollout_metrics(
        responses,
        rewards,
        loss_masks=masks,
        trajectory_completion_times=times,
        trajectory_time_splits=splits,
    )
    metrics.update(_rollway_metrics(records, outs))
    return {
        "prompt_token_ids": [out.prompt_ids for _, _, out, _ in flat],
        "response_ids": responses,
        "rewards": rewards,
        "loss_masks": masks,
        "stop_reasons": [out.stop_reason for _, _, out, _ in flat],
        "rollout_metrics": metrics,
        "rollout_logprobs": [out.logprobs for _, _, out, _ in flat] if want_logprobs else None,
        "trajectory_ids": [row.trajectory_id for row, _, _, _ in flat],
        "trajectory_generation_times": [record.elapsed_s for _, record, _, _ in flat],
        "trajectory_time_splits": {
            "llm": [record.metrics.llm_latency_ms / 1000 for _, record, _, _ in flat],
            "env": [record.metrics.tool_latency_ms / 1000 for _, record, _, _ in flat],
        },
        "is_last_step": [last for _, _, _, last in flat] if step_wise else None,
    }


def _rollway_metrics(
    records: Sequence[RolloutRecord], outs: Sequence[list[_Out]]
) -> dict[str, float]:
    """What SkyRL's metrics cannot see: failed and truncated rollouts, segments per rollout."""
    count = len(records)
    return {
        "rollway/failed_fraction": sum(not r.success for r in records) / count,
        "rollway/truncated_fraction": sum(r.status == "truncated" for r in records) / count,
        "rollway/rows_per_rollout": sum(len(o) for o in outs) / count,
    }
