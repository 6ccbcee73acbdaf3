"""TRL's real GRPOTrainer takes its batches from a step source: two steps on the embedded model
at temperature 0.7 (two micro-batches a step), each on the source's whole groups with the flat
ones set aside, sampled from the weights pushed before it, with TRL's own logprobs equal to the
recorded ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rollway.client import RolloutClient, StepBatch
from rollway.model_folders import resolve_model_path
from rollway.trainers.trl import rollway_reward, trainer_sampling
from rollway.trainers.trl_steps import step_rollout_func
from tests.trainers.test_trl_adapter import Seen, watch_loss
from tests.trainers.test_trl_steps import ParityAgent, tasks

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")


def grpo_config(out: Path) -> Any:
    # 2 rows a micro-batch, 2 micro-batches a step: one round of 4 rows = 2 groups of 2.
    return trl.GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2,
        num_generations=2, max_steps=2, learning_rate=1e-4, beta=0.0, logging_steps=1,
        report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0,
        disable_tqdm=True, temperature=0.7, max_completion_length=6,
    )  # fmt: skip


def train_two_steps(client: RolloutClient, out: Path) -> tuple[Seen, list[StepBatch]]:
    path = resolve_model_path(None)
    args = grpo_config(out)
    names = ["flat1", "a", "flat2", "b", "c", "flat3", "d", "e"]
    source = client.step_source(tasks(*names), group_size=2, groups_per_step=2,
                                **trainer_sampling(args))  # fmt: skip
    func = step_rollout_func(client, source)
    drawn: list[StepBatch] = []

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        columns = func(prompts, trainer)
        drawn.extend(func.batches)
        return columns

    # The dataset only paces the steps: its prompts are never run.
    pacer = [{"prompt": [{"role": "user", "content": "unused"}]}] * 2
    trainer = trl.GRPOTrainer(
        model=transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=[rollway_reward],
        args=args,
        train_dataset=datasets.Dataset.from_list(pacer),
        processing_class=transformers.AutoTokenizer.from_pretrained(path),
        rollout_func=rollout,
    )
    seen = watch_loss(trainer, client.gateway.gateway.engine)
    with source:
        trainer.train()
    return seen, drawn


# Deprecated transformers names that TRL 1.16 still calls; not ours to fix.
@pytest.mark.filterwarnings(r"ignore:`(is_)?gradient_checkpointing\w*` is deprecated:FutureWarning")
@pytest.mark.timeout(600)
def test_grpo_trainer_trains_on_the_step_sources_whole_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"
    torch.manual_seed(0)
    with RolloutClient(ParityAgent, engine="embedded", store=str(tmp_path / "runs")) as client:
        seen, drawn = train_two_steps(client, tmp_path / "out")
        versions = client.policy_version

    # One batch a step, two whole informative groups each, the flat ones set aside.
    assert [batch.step for batch in drawn] == [0, 1] and versions == 2
    assert sum(batch.metrics.set_aside_flat for batch in drawn) >= 2
    for step, batch in enumerate(drawn):
        assert len(batch.groups) == 2 and batch.lacking == 0
        for group in batch.groups:
            assert not group[0].task["flat"] and len({r.group_id for r in group}) == 1
            assert [r.sample_index for r in group] == [0, 1]
            # Sampled from the weights pushed before this step's batch was taken.
            assert [r.policy_version for r in group] == [step + 1] * 2
    # What TRL trained on is exactly the handed-over samples.
    samples = [r.trajectory.samples[0] for b in drawn for r in b.records if r.trajectory]
    handed = [(tuple(s.prompt_ids), tuple(s.response_ids), tuple(s.loss_mask)) for s in samples]
    assert len(handed) == 8 and sorted(seen.rows) == sorted(handed)
    assert seen.in_sync == [True] * 4  # two micro-batches a step, each on synced weights
    assert max(seen.logprob_gaps) < 1e-3
