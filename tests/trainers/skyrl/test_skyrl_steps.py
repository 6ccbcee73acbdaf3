"""SkyRL's trainer takes its batches from a step source (skyrl 0.4.0, in .venv-skyrl): real
rollouts from the embedded engine go through ``StepSourceGenerator.generate`` and SkyRL's own
``RayPPOTrainer.generate`` (which validates the output), ``postprocess_generator_output`` and
``convert_to_training_input``; each training row is a handed-over sample, the batch whole
groups with the flat ones set aside."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_vllm_sampling_params
from skyrl.train.config.config import SamplingParams
from skyrl.train.generators.base import TrajectoryID
from skyrl.train.generators.utils import prepare_generator_input

from rollway.client import RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.errors import ConfigError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.trainers.skyrl_steps import StepSourceGenerator
from tests.trainers.skyrl.test_skyrl_generator import (
    MAX_TOKENS,
    assert_row_holds,
    dataset_rows,
    skyrl_trainer,
)
from tests.trainers.test_trl_steps import ParityAgent, tasks


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    loaded = EmbeddedEngine.from_pretrained()
    yield loaded
    asyncio.run(loaded.close())


@pytest.fixture(scope="module")
def renderer(engine: EmbeddedEngine) -> ChatRenderer:
    return ChatRenderer(engine.tokenizer)


def sampling(temperature: float = 0.7) -> dict[str, object]:
    return get_vllm_sampling_params(SamplingParams(max_generate_length=MAX_TOKENS,
                                                   temperature=temperature, top_k=20))  # fmt: skip


async def test_skyrl_trains_on_the_step_sources_whole_groups(
    engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path: Path
) -> None:
    # Two dataset prompts, two samples each: they pace the step, and are never run.
    batch_in, uids = prepare_generator_input(dataset_rows([0.0, 0.0]), 2, sampling(), "x",
                                             "train", 0)  # fmt: skip
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    with RolloutClient(ParityAgent, gateway, store=str(tmp_path / "runs")) as client:
        source = client.step_source(tasks("flat1", "a", "flat2", "b"), group_size=2,
                                    groups_per_step=2, temperature=0.7, top_k=20,
                                    max_tokens=MAX_TOKENS)  # fmt: skip
        with source:
            generator = StepSourceGenerator(client, source)
            trainer = skyrl_trainer(generator, renderer.tokenizer, train_batch_size=2,
                                    n_samples_per_prompt=2)  # fmt: skip
            output = await trainer.generate(batch_in)  # SkyRL validates the output here
    (batch,) = generator.batches
    assert batch.metrics.set_aside_flat == 2 and batch.lacking == 0
    records = batch.records
    assert sorted(group[0].task["task_id"] for group in batch.groups) == ["a", "b"]
    # Whole groups, contiguous, each row's trajectory id its record's group and sample.
    assert output["trajectory_ids"] == [TrajectoryID(r.group_id, r.sample_index) for r in records]
    assert [r.sample_index for r in records] == [0, 1, 0, 1]
    samples = [r.trajectory.samples[0] for r in records if r.trajectory is not None]
    assert output["prompt_token_ids"] == [s.prompt_ids for s in samples]
    assert output["response_ids"] == [s.response_ids for s in samples]
    assert output["loss_masks"] == [s.loss_mask for s in samples]
    assert output["rollout_logprobs"] == [s.logprobs for s in samples]
    assert output["rewards"] == [0.0, 1.0, 0.0, 1.0]
    assert all(t.sampling["temperature"] == 0.7 for r in records for t in r.trajectory.turns)

    # SkyRL's advantage groups by the batch's uids: two rows each, as the groups are.
    processed, uids = trainer.postprocess_generator_output(output, uids)
    training = trainer.convert_to_training_input(processed, uids)
    assert training["sequences"].shape[0] == 4
    for row, (sample, record) in enumerate(zip(samples, records, strict=True)):
        assert record.reward is not None
        assert_row_holds(training, row, sample, record.reward, renderer.tokenizer.pad_token_id)


@pytest.mark.parametrize(
    ("prompts", "samples", "temperature", "named"),
    [(3, 2, 0.7, "train_batch_size"), (1, 4, 0.7, "n_samples_per_prompt"),
     (2, 2, 1.0, "temperature")],
)  # fmt: skip
async def test_a_batch_the_step_does_not_fit_is_refused_before_any_rollout(
    tmp_path: Path, prompts: int, samples: int, temperature: float, named: str
) -> None:
    rows = dataset_rows([0.0] * prompts)
    batch_in, _ = prepare_generator_input(rows, samples, sampling(temperature), "x", "train", 0)
    with RolloutClient(ParityAgent, "sim", store=str(tmp_path / "runs")) as client:
        source = client.step_source(tasks("a", "b"), group_size=2, groups_per_step=2,
                                    temperature=0.7, top_k=20)  # fmt: skip
        with source, pytest.raises(ConfigError, match=named):
            await StepSourceGenerator(client, source).generate(batch_in)
        assert list(client.store.records()) == []


async def test_an_eval_batch_runs_its_own_prompts(tmp_path: Path) -> None:
    rows = [{**row, "env_extras": {"q": "eval"}} for row in dataset_rows([0.0])]
    batch_in, _ = prepare_generator_input(rows, 2, sampling(), "x", "eval", 0)
    with RolloutClient(ParityAgent, "sim", store=str(tmp_path / "runs")) as client:
        source = client.step_source(tasks("a"), group_size=2, groups_per_step=1)
        with source:
            output = await StepSourceGenerator(client, source).generate(batch_in)
        ran = {r.task["q"] for r in client.store.records()}
    assert ran == {"eval"} and len(output["response_ids"]) == 2
