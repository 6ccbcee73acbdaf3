"""The SkyRL generator on SkyRL's real classes (skyrl 0.4.0, in .venv-skyrl): real rollouts from
the embedded engine go through ``RollwayGenerator.generate`` and then SkyRL's own trainer code
(``RayPPOTrainer.generate``, which validates the output, ``postprocess_generator_output`` and
``convert_to_training_input``); the training tensors must hold each record's sample unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_vllm_sampling_params
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.config.config import SamplingParams
from skyrl.train.generators.base import GeneratorInterface, TrajectoryID
from skyrl.train.generators.utils import prepare_generator_input
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils.trainer_utils import validate_generator_output

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.errors import ConfigError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult, RolloutRecord
from rollway.trainers.skyrl import RollwayGenerator, skyrl_sampling
from rollway.trainers.trl import PromptAgent
from rollway.trajectory import Sample, Trajectory

MAX_TOKENS = 4


class FoldingAgent(AgentLoop):
    """Answers, then asks again in a fresh conversation (as context folding does): two
    segments. Gives up on a task marked ``fail``."""

    name = "folding"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        if ctx.task.get("fail"):
            return ctx.error("asked to fail")
        first = await ctx.chat(list(ctx.task["prompt"]))
        summary = [{"role": "user", "content": "Say it again, shorter."}]
        second = await ctx.chat(summary)
        return ctx.complete([*ctx.task["prompt"], first.message, *summary, second.message])


class ChatAgent(AgentLoop):
    """Answers the prompt; with ``turns: 2`` in the task, asks a follow-up in the same
    conversation, so its one sample's response holds template glue and user text (mask 0)."""

    name = "chat"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = list(ctx.task["prompt"])
        for turn in range(ctx.task.get("turns", 1)):
            if turn:
                messages.append({"role": "user", "content": "And one more?"})
            reply = await ctx.chat(messages)
            messages.append(reply.message)
        return ctx.complete(messages)


def weight_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    """A reward read from the dataset column SkyRL passes as ``env_extras``."""
    return float(task["weight"]) + len(trajectory.turns)


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    # One engine for every client of the module: loading it is the slow part.
    loaded = EmbeddedEngine.from_pretrained()
    yield loaded
    asyncio.run(loaded.close())


@pytest.fixture(scope="module")
def renderer(engine: EmbeddedEngine) -> ChatRenderer:
    return ChatRenderer(engine.tokenizer)


@pytest.fixture
def gateway(engine: EmbeddedEngine, renderer: ChatRenderer) -> Gateway:
    return Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")


def make_client(engine: Gateway | str, tmp_path: Path, agent: Any = ChatAgent) -> RolloutClient:
    """A client on ``engine`` (the embedded one's gateway, or ``"sim"`` where the tokens do
    not matter) rewarding by the dataset's ``weight`` column."""
    return RolloutClient(agent, engine, store=str(tmp_path / "runs"), reward=weight_reward,
                         max_tokens=64, seed=7)  # fmt: skip


def skyrl_trainer(generator: GeneratorInterface, tokenizer: Any, **cfg: Any) -> RayPPOTrainer:
    """SkyRL's own trainer around ``generator``, on CPU: no Ray workers, so the data-parallel
    size its padding step asks the worker dispatch for is 1."""
    config = SkyRLTrainConfig()
    config.trainer.train_batch_size = cfg.pop("train_batch_size")
    config.trainer.policy_mini_batch_size = config.trainer.train_batch_size
    config.generator.n_samples_per_prompt = cfg.pop("n_samples_per_prompt")
    config.generator.step_wise_trajectories = cfg.pop("step_wise", False)
    # These watch SkyRL's vLLM servers and GPUs through a Ray cluster; there is none here.
    config.generator.inference_engine.enable_ray_prometheus_stats = False
    config.trainer.enable_ray_gpu_monitor = False
    trainer = RayPPOTrainer(config, None, tokenizer, None, None, generator)
    trainer.dispatch = SimpleNamespace(get_lcm_dp_size=lambda: 1)
    return trainer


def dataset_rows(weights: list[float], **extras: Any) -> list[dict[str, Any]]:
    """Rows as SkyRL's ``PromptDataset`` yields them: prompt (longer row by row), env class,
    extras, uid."""
    return [
        {"prompt": [{"role": "user", "content": "Name a colour" + " please" * i + "."}],
         "env_class": None, "env_extras": {"weight": weight, **extras}, "uid": f"q{i}"}
        for i, weight in enumerate(weights)
    ]  # fmt: skip


def records_by_trajectory(client: RolloutClient) -> dict[str, RolloutRecord]:
    """The client's records by SkyRL trajectory id (instance, then repetition)."""
    return {TrajectoryID(r.task["instance_id"], r.sample_index).to_string(): r
            for r in client.store.records()}  # fmt: skip


def assert_row_holds(batch: Any, row: int, sample: Sample, reward: float, pad_id: int) -> None:
    """Row ``row`` of SkyRL's training batch holds ``sample`` exactly: prompt and response
    ids at the right end of the left-padded sequence, and the response-level tensors
    right-aligned, zero before the response."""
    ids = sample.prompt_ids + sample.response_ids
    n, total = len(sample.response_ids), batch["sequences"].shape[1]
    pad = total - len(ids)
    assert batch["sequences"][row, pad:].tolist() == ids
    assert batch["sequences"][row, :pad].tolist() == [pad_id] * pad
    assert batch["attention_mask"][row].tolist() == [0] * pad + [1] * len(ids)
    width = batch["loss_mask"].shape[1]
    assert batch["response_mask"][row].tolist() == [0] * (width - n) + [1] * n
    mask = [float(m) for m in sample.loss_mask]
    assert batch["loss_mask"][row].tolist() == [0.0] * (width - n) + mask
    # SkyRL keeps logprobs in float32: the recorded values, rounded to it and nothing else.
    expected = torch.tensor([0.0] * (width - n) + sample.logprobs, dtype=torch.float32)
    assert torch.equal(batch["rollout_logprobs"][row], expected)
    # Postprocessing puts a response-level reward on the response's last token.
    assert batch["rewards"][row].tolist() == [0.0] * (width - 1) + [reward]


async def test_rollouts_reach_skyrl_training_tensors_unchanged(
    gateway: Gateway, renderer: ChatRenderer, tmp_path: Path
) -> None:
    sampling = get_vllm_sampling_params(SamplingParams(max_generate_length=MAX_TOKENS,
                                                       temperature=0.7, top_k=20))  # fmt: skip
    rows_in = dataset_rows([0.5, 2.0])
    rows_in[1]["env_extras"]["turns"] = 2  # a longer response, glue and user text inside
    batch_in, uids = prepare_generator_input(rows_in, 2, sampling, "gsm8k", "train", 3)
    with make_client(gateway, tmp_path) as client:
        generator = RollwayGenerator(client)
        trainer = skyrl_trainer(generator, renderer.tokenizer, train_batch_size=2,
                                n_samples_per_prompt=2)  # fmt: skip
        output = await trainer.generate(batch_in)  # SkyRL validates the output here
        records = records_by_trajectory(client)
    ids = batch_in["trajectory_ids"]
    assert output["trajectory_ids"] == ids and output["is_last_step"] is None
    rows = [records[tid.to_string()] for tid in ids]
    # env_extras, the trajectory id and the batch metadata reached the task.
    assert [(r.task["weight"], r.task.get("turns")) for r in rows] == [
        (0.5, None), (0.5, None), (2.0, 2), (2.0, 2)]  # fmt: skip
    assert {(r.task["global_step"], r.task["training_phase"], r.task["env_class"])
            for r in rows} == {(3, "train", "gsm8k")}  # fmt: skip
    # The repetitions of an instance are one rollway group, in repetition order.
    assert [r.sample_index for r in rows] == [0, 1, 0, 1]
    assert rows[0].group_id == rows[1].group_id != rows[2].group_id == rows[3].group_id
    # The batch's sampling params were the rollouts': SkyRL recomputes at its temperature.
    for record in rows:
        assert record.trajectory is not None
        for turn in record.trajectory.turns:
            assert turn.sampling["temperature"] == 0.7 and turn.sampling["top_k"] == 20
            assert turn.sampling["max_tokens"] == MAX_TOKENS
            assert len(turn.completion_ids) <= MAX_TOKENS
    samples = [r.trajectory.samples[0] for r in rows if r.trajectory is not None]
    # Rows of unequal lengths, so that SkyRL's padding moves them, and mask-0 tokens inside.
    assert len(samples[0].prompt_ids) < len(samples[2].prompt_ids)
    assert len(samples[0].response_ids) < len(samples[2].response_ids)
    assert 0 in samples[2].loss_mask[:-MAX_TOKENS]
    assert output["prompt_token_ids"] == [s.prompt_ids for s in samples]
    assert output["response_ids"] == [s.response_ids for s in samples]
    assert output["loss_masks"] == [s.loss_mask for s in samples]
    assert output["rollout_logprobs"] == [s.logprobs for s in samples]
    assert output["rewards"] == [r.reward for r in rows] == [1.5, 1.5, 4.0, 4.0]
    assert output["stop_reasons"] == [r.trajectory.turns[-1].finish_reason for r in rows
                                      if r.trajectory is not None]  # fmt: skip
    # The metrics went to SkyRL's trainer (and were popped from the output).
    assert trainer.all_metrics["generate/max_num_tokens"] == max(len(s.response_ids)
                                                                 for s in samples)  # fmt: skip
    assert trainer.all_metrics["rollway/failed_fraction"] == 0.0

    processed, uids = trainer.postprocess_generator_output(output, uids)
    batch = trainer.convert_to_training_input(processed, uids)
    assert batch["sequences"].shape[0] == 4
    for row, (sample, record) in enumerate(zip(samples, rows, strict=True)):
        assert record.reward is not None
        assert_row_holds(batch, row, sample, record.reward, renderer.tokenizer.pad_token_id)


async def test_segments_are_steps_of_one_trajectory_with_step_wise(
    gateway: Gateway, renderer: ChatRenderer, tmp_path: Path
) -> None:
    sampling = get_vllm_sampling_params(SamplingParams(max_generate_length=2))
    batch_in, _ = prepare_generator_input(dataset_rows([1.0]), 2, sampling, "x", "train", 0)
    with make_client(gateway, tmp_path, FoldingAgent) as client:
        generator = RollwayGenerator(client, step_wise=True)
        trainer = skyrl_trainer(generator, renderer.tokenizer, train_batch_size=1,
                                n_samples_per_prompt=2, step_wise=True)  # fmt: skip
        output = await trainer.generate(batch_in)
        records = records_by_trajectory(client)
    ids = batch_in["trajectory_ids"]
    assert output["trajectory_ids"] == [ids[0], ids[0], ids[1], ids[1]]
    assert output["is_last_step"] == [False, True, False, True]
    samples: list[Sample] = []
    rewards: list[float] = []
    for tid in ids:
        record = records[tid.to_string()]
        assert record.trajectory is not None and record.reward is not None
        assert [s.segment for s in record.trajectory.samples] == [0, 1]
        samples += record.trajectory.samples
        rewards += [0.0, record.reward]  # the last step carries the rollout's reward
    assert output["prompt_token_ids"] == [s.prompt_ids for s in samples]
    assert output["response_ids"] == [s.response_ids for s in samples]
    assert output["loss_masks"] == [s.loss_mask for s in samples]
    assert output["rollout_logprobs"] == [s.logprobs for s in samples]
    assert output["rewards"] == rewards
    # SkyRL's step-wise path: uids from the trajectory ids, as its training loop takes them.
    uids = [tid.instance_id for tid in output["trajectory_ids"]]
    processed, uids = trainer.postprocess_generator_output(output, uids)
    batch = trainer.convert_to_training_input(processed, uids)
    assert batch.metadata["is_last_step"] == [False, True, False, True]
    for row, (sample, reward) in enumerate(zip(samples, rewards, strict=True)):
        assert_row_holds(batch, row, sample, reward, renderer.tokenizer.pad_token_id)


async def test_segments_without_step_wise_are_refused(tmp_path: Path) -> None:
    batch_in, _ = prepare_generator_input(dataset_rows([1.0]), 1, None, "x", "train", 0)
    client = make_client("sim", tmp_path, FoldingAgent)
    with client, pytest.raises(ConfigError, match=r"2 segments.*step_wise_trajectories"):
        await RollwayGenerator(client).generate(batch_in)


async def test_a_failed_rollout_is_one_masked_token(tmp_path: Path) -> None:
    rows = dataset_rows([1.0, 1.0])
    rows[1]["env_extras"]["fail"] = True
    batch_in, _ = prepare_generator_input(rows, 1, get_vllm_sampling_params(
        SamplingParams(max_generate_length=4)), "x", "eval", 5)  # fmt: skip
    with make_client("sim", tmp_path, FoldingAgent) as client:
        output = await RollwayGenerator(client, step_wise=True, placeholder_token_id=2).generate(
            batch_in
        )
    validate_generator_output(2, output, step_wise=True)
    assert output["is_last_step"] == [False, True, True]
    assert output["prompt_token_ids"][2] == output["response_ids"][2] == [2]
    assert output["loss_masks"][2] == [0] and output["rollout_logprobs"][2] == [0.0]
    assert output["rewards"][2] == 0.0 and output["stop_reasons"][2] == "error"
    assert output["rollout_metrics"]["rollway/failed_fraction"] == 0.5


async def test_a_rollout_without_reward_is_refused(tmp_path: Path) -> None:
    batch_in, _ = prepare_generator_input(dataset_rows([1.0]), 1, get_vllm_sampling_params(
        SamplingParams(max_generate_length=2)), "x", "train", 0)  # fmt: skip
    client = RolloutClient(PromptAgent, "sim", store=str(tmp_path / "runs"))
    with client, pytest.raises(ConfigError, match="no reward"):
        await RollwayGenerator(client).generate(batch_in)


def test_without_trajectory_ids_each_row_is_its_own_instance() -> None:
    from rollway.trainers.skyrl import _groups, _rows

    prompt = [{"role": "user", "content": "hi"}]
    rows = _rows({"prompts": [prompt, prompt], "env_classes": ["a", "a"], "env_extras": None,
                  "sampling_params": None, "trajectory_ids": None,
                  "batch_metadata": None})  # fmt: skip
    assert [r.trajectory_id for r in rows] == [TrajectoryID("0", 0), TrajectoryID("1", 0)]
    assert [[r.index for r in g] for g in _groups(rows)] == [[0], [1]]


def test_skyrl_sampling_params_become_rollway_options() -> None:
    config = SamplingParams(max_generate_length=32, temperature=0.7, top_p=0.9, top_k=-1,
                            stop=["</answer>"])  # fmt: skip
    options, logprobs = skyrl_sampling(get_vllm_sampling_params(config))
    assert options == {"max_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": 0,
                       "stop": ["</answer>"]}  # fmt: skip
    assert logprobs is True
    _, logprobs = skyrl_sampling(get_vllm_sampling_params(SamplingParams(logprobs=None)))
    assert logprobs is False
    assert skyrl_sampling(None) == ({}, True)


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_p", 0.05), ("repetition_penalty", 1.1), ("min_tokens", 4), ("best_of", 2)],
)
def test_sampling_rollway_cannot_honour_is_refused(field: str, value: Any) -> None:
    # SkyRL's DictConfig path passes every sampling field through, additional_kwargs nested.
    config = OmegaConf.structured(SamplingParams())
    params = get_vllm_sampling_params(config)
    if field in params:
        params[field] = value
    else:
        params["additional_kwargs"] = {field: value}
    with pytest.raises(ConfigError, match=field):
        skyrl_sampling(params)
