"""verl's own ``AgentLoopWorker`` (0.9.1, built from verl's generated PPO config) running the
``rollway`` agent loop on real rollouts of the embedded engine: its padding and batching must
carry every id, mask, logprob and reward of the rollway records unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import verl
from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _agent_loop_registry
from verl.protocol import DataProto

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.errors import ConfigError
from rollway.model_folders import resolve_model_path
from rollway.results import AgentResult
from rollway.trainers.verl import RollwayAgentLoop, use_client

CALL_TOKENS = 8  # each model call's cap: keeps the two-call rollouts within seconds on 2 cores


class TwoCallAgent(AgentLoop):
    """Answers, gets a user reply, answers again: the response then holds user text and
    template glue (mask 0) between the sampled tokens. Its reward is the row's index + 0.5;
    ``extra_info.mode`` makes it fail, or rewrite the conversation (a second segment)."""

    name = "two-call"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        mode = ctx.task.get("extra_info", {}).get("mode")
        if mode == "fail":
            return ctx.error("asked to fail")
        messages = list(ctx.task["messages"])
        first = await ctx.chat(messages)
        if mode == "fold":
            messages = [{"role": "user", "content": "Summarise."}]  # history rewritten
        else:
            messages = [*messages, first.message, {"role": "user", "content": "Once more."}]
        second = await ctx.chat(messages)
        return ctx.complete([*messages, second.message], reward=ctx.task["index"] + 0.5)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutClient]:
    store = tmp_path_factory.mktemp("verl-store")
    with RolloutClient(TwoCallAgent, "embedded", store=str(store), max_tokens=CALL_TOKENS) as c:
        use_client(c)
        yield c


def verl_config() -> DictConfig:
    """verl's own defaults (its generated PPO trainer config), with the embedded model's
    folder as the policy and the rollway loop as the default agent loop."""
    path = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    config = OmegaConf.load(path)
    config.actor_rollout_ref.model.path = str(resolve_model_path())
    config.actor_rollout_ref.rollout.name = "vllm"  # mandatory ("???"); nothing is started
    config.actor_rollout_ref.rollout.agent.default_agent_loop = "rollway"
    return config


@pytest.fixture(scope="module")
def worker(client: RolloutClient) -> AgentLoopWorker:
    # No LLM server client: the rollway loop never calls verl's servers.
    return AgentLoopWorker(verl_config(), llm_client=None)


def rows(prompts: list[str], modes: list[str | None]) -> DataProto:
    """A batch as verl's trainer hands it to ``generate_sequences``: RLHFDataset's fields."""
    n = len(prompts)
    raw = np.empty(n, dtype=object)
    raw[:] = [[{"role": "user", "content": p}] for p in prompts]
    extra = np.array([{"mode": m} for m in modes], dtype=object)
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": raw,
            "index": np.arange(n),
            "data_source": np.array(["rollway-test"] * n, dtype=object),
            "extra_info": extra,
        },
        meta_info={"global_steps": 1, "validate": False},
    )


def test_registered_under_rollway() -> None:
    target = _agent_loop_registry["rollway"]["_target_"]
    assert target == f"{RollwayAgentLoop.__module__}.{RollwayAgentLoop.__qualname__}"


async def test_verl_batch_carries_the_records_exactly_and_masks_failures(
    client: RolloutClient, worker: AgentLoopWorker
) -> None:
    # The third row's rollout fails: it must become a masked row, not break the batch.
    prompts = ["Name a colour.", "Name a fruit.", "x"]
    out = await worker.generate_sequences(rows(prompts, [None, None, "fail"]))

    batch, pad = out.batch, worker.tokenizer.pad_token_id
    prompt_width = worker.rollout_config.prompt_length  # verl's defaults: 512 and 512
    assert batch["prompts"].shape == (3, prompt_width)
    assert batch["responses"].shape == (3, worker.rollout_config.response_length)
    statuses = list(out.non_tensor_batch["rollway_status"])
    # An answer cut at its max_tokens is "truncated": it ran to its end all the same.
    assert statuses[2] == "error" and {*statuses[:2]} <= {"completed", "truncated"}, statuses
    assert batch["response_mask"][2].count_nonzero().item() == 0
    assert batch["rm_scores"][2].count_nonzero().item() == 0
    for i, key in enumerate(out.non_tensor_batch["rollway_rollout_key"][:2]):
        record = client.store.get(key)
        assert record is not None and record.success
        assert record.trajectory is not None and record.trajectory.sampling["temperature"] == 1.0
        (sample,) = record.trajectory.samples
        assert 0 in sample.loss_mask and 1 in sample.loss_mask  # user text between the answers
        check_row(batch, i, sample.prompt_ids, sample.response_ids, pad)
        check_masks_and_logprobs(batch, i, sample.loss_mask, sample.logprobs)
        # The reward arrives on the response's last token, nowhere else.
        assert record.reward == i + 0.5
        response_len = len(sample.response_ids)
        assert batch["rm_scores"][i, response_len - 1].item() == record.reward
        assert batch["rm_scores"][i].count_nonzero().item() == 1
        assert out.non_tensor_batch["__num_turns__"][i] == 4  # user, assistant, user, assistant


def check_row(batch: Any, i: int, prompt_ids: list[int], response_ids: list[int], pad: int) -> None:
    """Prompt left-padded, response right-padded, input_ids their concatenation, and the
    attention mask 1 exactly on the record's tokens."""
    p, r = len(prompt_ids), len(response_ids)
    prompts, responses = batch["prompts"][i], batch["responses"][i]
    assert prompts[-p:].tolist() == prompt_ids
    assert (prompts[:-p] == pad).all()
    assert responses[:r].tolist() == response_ids
    assert (responses[r:] == pad).all()
    assert torch.equal(batch["input_ids"][i], torch.cat([prompts, responses]))
    width = prompts.shape[0]
    attention = batch["attention_mask"][i]
    assert attention.sum().item() == p + r
    assert attention[width - p : width + r].all()
    # verl's position ids count the real tokens from 0.
    assert batch["position_ids"][i][width - p : width + r].tolist() == list(range(p + r))


def check_masks_and_logprobs(batch: Any, i: int, mask: list[int], logprobs: list[float]) -> None:
    """The loss mask as verl's response_mask, the logprobs as its rollout_log_probs (verl
    stores float32: the record's values, rounded once), both zero past the response."""
    r = len(mask)
    assert batch["response_mask"][i][:r].tolist() == mask
    assert batch["response_mask"][i][r:].count_nonzero().item() == 0
    recorded = torch.tensor(logprobs, dtype=torch.float32)
    assert torch.equal(batch["rollout_log_probs"][i][:r], recorded)
    assert batch["rollout_log_probs"][i][r:].count_nonzero().item() == 0


async def test_rewritten_conversation_is_refused_naming_segments(
    client: RolloutClient, worker: AgentLoopWorker
) -> None:
    with pytest.raises(ConfigError, match="has 2 segments"):
        await worker.generate_sequences(rows(["Name a colour."], ["fold"]))
