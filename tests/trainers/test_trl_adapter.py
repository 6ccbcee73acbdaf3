"""TRL's GRPOTrainer trains on rollway's rollouts: two real steps on the embedded model at
temperature 0.7, with the trainer's weights pushed into rollway's engine before each generation
round, and TRL's own logprobs equal to the recorded ones."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.model_folders import resolve_model_path
from rollway.results import AgentResult
from rollway.trainers.trl import rollway_reward, rollway_rollout_func
from tests.outcomes import ENDED

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

Row = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class TwoTurnAgent(AgentLoop):
    """Two model calls with a user reply between them, so each completion holds tokens the
    model did not sample (mask 0); rewarded by the final answer's length."""

    name = "two-turn"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = list(ctx.task["prompt"])
        for _ in range(2):
            reply = await ctx.chat(messages)
            messages += [reply.message, {"role": "user", "content": "Go on."}]
        return ctx.complete(messages[:-1], reward=float(len(reply.content or "") % 5))


def by_position(completions: list[Any], **_: Any) -> list[float]:
    # Rewards differ inside every group, so the first step moves the weights.
    return [float(i % 2) for i in range(len(completions))]


def unpadded(ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(ids[mask.bool()].tolist())


@dataclass
class Seen:
    """What the trainer's loss consumed, and whether the engine held its weights then."""

    rows: list[Row] = field(default_factory=list)
    in_sync: list[bool] = field(default_factory=list)
    #: Per step: max |trainer's logprob - recorded logprob| on the sampled tokens.
    logprob_gaps: list[float] = field(default_factory=list)


def logprob_gap(trainer: Any, model: Any, inputs: dict[str, Any]) -> float:
    """The largest gap between TRL's own logprobs of the sampled tokens (its forward pass, at
    its temperature) and the ones rollway recorded, which TRL holds as the sampling logprobs."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        ours, _, _ = trainer._get_per_token_logps_and_entropies(
            model, ids, mask, inputs["completion_ids"].size(1)
        )
    sampled = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    return float((ours - inputs["sampling_per_token_logps"])[sampled].abs().max())


def watch_loss(trainer: Any, engine: Any) -> Seen:
    """Wraps the trainer's loss to record each row it consumes, whether ``engine`` held the
    trainer's weights then, and the gap between TRL's logprobs and the recorded ones."""
    seen = Seen()
    compute_loss = trainer.compute_loss

    def consume(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        for i, completion_mask in enumerate(inputs["completion_mask"]):
            seen.rows.append((
                unpadded(inputs["prompt_ids"][i], inputs["prompt_mask"][i]),
                unpadded(inputs["completion_ids"][i], completion_mask),
                unpadded(inputs["tool_mask"][i], completion_mask),
            ))  # fmt: skip
        theirs = engine.model.state_dict()
        seen.in_sync.append(all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items()))
        seen.logprob_gaps.append(logprob_gap(trainer, model, inputs))
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = consume
    return seen


def train_two_steps(client: RolloutClient, out: Path) -> tuple[Any, Seen]:
    path = resolve_model_path(None)
    args = trl.GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=2, num_generations=2, max_steps=2,
        learning_rate=1e-4, beta=0.0, logging_steps=1, report_to="none", use_cpu=True,
        bf16=False, save_strategy="no", seed=0, disable_tqdm=True, temperature=0.7,
        max_completion_length=6,
    )  # fmt: skip
    prompts = [[{"role": "user", "content": f"Count from {i}."}] for i in range(4)]
    trainer = trl.GRPOTrainer(
        model=transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=[rollway_reward, by_position],
        args=args,
        train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=transformers.AutoTokenizer.from_pretrained(path),
        rollout_func=rollway_rollout_func(client),
    )
    seen = watch_loss(trainer, client.gateway.gateway.engine)
    trainer.train()
    return trainer, seen


# Deprecated transformers names that TRL 1.16 still calls; not ours to fix.
@pytest.mark.filterwarnings(r"ignore:`(is_)?gradient_checkpointing\w*` is deprecated:FutureWarning")
def test_grpo_trainer_trains_on_rollway_samples_and_pushes_its_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"
    torch.manual_seed(0)
    store = str(tmp_path / "runs")
    with RolloutClient(TwoTurnAgent, engine="embedded", store=store) as client:
        engine = client.gateway.gateway.engine
        initial = {k: v.clone() for k, v in engine.model.state_dict().items()}
        trainer, seen = train_two_steps(client, tmp_path / "out")
        records = list(client.store.records())
        final = engine.model.state_dict()
        versions = (engine.policy_version, client.policy_version)

    # What TRL trained on is exactly what rollway recorded: ids, and mask 0 off the samples.
    assert len(records) == 4 and all(r.status in ENDED for r in records)
    samples = [r.trajectory.samples[0] for r in records if r.trajectory]
    recorded = [(tuple(s.prompt_ids), tuple(s.response_ids), tuple(s.loss_mask)) for s in samples]
    assert sorted(seen.rows) == sorted(recorded)
    assert all(0 in mask and 1 in mask for _, _, mask in seen.rows)
    # Round k sampled, as one group, from the weights pushed before it: version k + 1.
    for round_id in (0, 1):
        batch = [r for r in records if r.task["task_id"].startswith(f"trl-{round_id}-")]
        assert [r.policy_version for r in batch] == [round_id + 1] * 2
        assert len({r.group_id for r in batch}) == 1
        logged = trainer.state.log_history[round_id]["rewards/rollway_reward/mean"]
        assert logged == pytest.approx(statistics.fmean(r.reward for r in batch))
    assert versions == (2, 2)
    # The engine held the trainer's weights at each loss, and the first step changed them.
    assert seen.in_sync == [True, True]
    # Sampled at the trainer's temperature (0.7), and the recorded logprobs are the ones TRL
    # computes at it: on-policy ratios of exactly 1, not exp(logprob at 1 - logprob at 0.7).
    assert all(t.sampling["temperature"] == 0.7 for r in records for t in r.trajectory.turns)
    assert max(seen.logprob_gaps) < 1e-3
    assert not all(torch.equal(v, final[k]) for k, v in initial.items())
