"""The GRPO objective on hand-made samples: advantages per group, the trained tokens aligned
with their positions, which tokens count as on-policy, the clip, the KL term, the reward."""

from __future__ import annotations

import pytest
import torch
from examples.grpo.objective import group_advantages, grpo_loss, informative_groups, pack
from examples.grpo.tasks import one_word_reward

from rollway.results import RolloutRecord
from rollway.trajectory import Sample


def record(rollout_id: str, group_id: str, reward: float) -> RolloutRecord:
    return RolloutRecord(
        exp_id="t",
        rollout_key=rollout_id,
        rollout_id=rollout_id,
        task_index=0,
        group_id=group_id,
        group_index=0,
        sample_index=0,
        status="completed",
        reward=reward,
        started_at=0.0,
        elapsed_s=0.0,
    )


def sample(mask: list[int], versions: list[int]) -> Sample:
    """A two-token prompt and ``len(mask)`` response ids 10, 11, ...; logprob -(i+1)/10."""
    n = len(mask)
    logprobs = [-(i + 1) / 10 if m else 0.0 for i, m in enumerate(mask)]
    return Sample(
        segment=0,
        prompt_ids=[1, 2],
        response_ids=list(range(10, 10 + n)),
        loss_mask=mask,
        logprobs=logprobs,
        policy_versions=[v if m else -1 for v, m in zip(versions, mask, strict=True)],
    )


def test_advantages_are_normalised_within_each_group_and_zero_for_a_uniform_group() -> None:
    records = [record("a", "g1", 1.0), record("b", "g1", 0.0), record("c", "g2", 0.5)]
    records.append(record("d", "g2", 0.5))
    assert group_advantages(records) == {"a": 1.0, "b": -1.0, "c": 0.0, "d": 0.0}


def test_only_groups_whose_rewards_differ_count_as_informative() -> None:
    records = [record("a", "g1", 1.0), record("b", "g1", 0.0), record("c", "g2", 0.5)]
    records += [record("d", "g2", 0.5), record("e", "g3", 0.0), record("f", "g3", 0.25)]
    assert informative_groups(records) == 2  # g2 is flat
    assert informative_groups([record("g", "g4", 1.0)]) == 0


def test_pack_keeps_only_sampled_tokens_at_their_positions_with_their_logprobs() -> None:
    # Two turns (tool output masked out between them), then a second, shorter sample.
    batch = pack([(sample([1, 1, 0, 0, 1], [3] * 5), 0.5), (sample([1], [3]), -1.0)])
    assert batch.input_ids.tolist() == [[1, 2, 10, 11, 12, 13, 14], [1, 2, 10, 0, 0, 0, 0]]
    assert batch.attention_mask.sum(1).tolist() == [7, 3]
    assert batch.rows.tolist() == [0, 0, 0, 1]
    assert batch.positions.tolist() == [2, 3, 6, 2]
    assert batch.targets.tolist() == [10, 11, 14, 10]
    assert batch.behaviour_logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.5, -0.1])
    assert batch.advantages.tolist() == [0.5, 0.5, 0.5, -1.0]


def test_only_tokens_of_turns_sampled_wholly_by_the_current_version_are_on_policy() -> None:
    # Turn 1 froze across an update (keep): versions 1 then 2. Turn 2 ran wholly on 2.
    spanning = sample([1, 1, 1, 0, 1, 1], [1, 2, 2, 0, 2, 2])
    stale = sample([1, 1], [1, 1])
    batch = pack([(spanning, 0.0), (stale, 0.0)])
    assert batch.on_policy(2).tolist() == [False, False, False, True, True, False, False]
    assert batch.on_policy(1).tolist() == [False] * 5 + [True, True]


def test_the_clip_stops_the_gradient_past_one_plus_eps_in_the_advantage_direction() -> None:
    batch = pack([(sample([1, 1], [0, 0]), 1.0)])
    # Token 0's ratio is 1.5 (past the clip), token 1's is 1.
    new = (batch.behaviour_logprobs + torch.tensor([0.4055, 0.0])).requires_grad_()
    loss, stats = grpo_loss(new, batch, clip_eps=0.2)
    loss.backward()
    assert new.grad is not None
    assert new.grad[0] == 0 and new.grad[1] == pytest.approx(-0.5)
    assert stats["clip_frac"] == 0.5


def test_decoupled_ppo_keeps_the_gradient_of_stale_tokens_weighted_by_a_capped_ratio() -> None:
    batch = pack([(sample([1, 1, 1], [0, 0, 0]), 1.0)])
    # The current weights give token 0 1.5x, token 1 8x, token 2 1x its recorded probability.
    shift = torch.tensor([1.5, 8.0, 1.0]).log()
    new = (batch.behaviour_logprobs + shift).requires_grad_()
    loss, stats = grpo_loss(new, batch, clip_eps=0.2, decoupled_weight_cap=5.0)
    loss.backward()
    assert new.grad is not None
    # d/dnew of -(w * exp(new - new.detach()) * A) / 3 is -w * A / 3: w = 1.5, 5 (capped), 1.
    assert new.grad.tolist() == pytest.approx([-0.5, -5 / 3, -1 / 3])
    assert stats["clip_frac"] == 0.0
    assert loss.item() == pytest.approx(-(1.5 + 5 + 1) / 3)


def test_the_kl_term_is_zero_at_the_reference_and_positive_away_from_it() -> None:
    batch = pack([(sample([1, 1], [0, 0]), 0.0)])
    new = batch.behaviour_logprobs.clone()
    _, at_reference = grpo_loss(new, batch, 0.2, kl_coef=0.1, reference=new.clone())
    _, away = grpo_loss(new, batch, 0.2, kl_coef=0.1, reference=new - 0.3)
    assert at_reference["kl"] == 0.0 and away["kl"] > 0.01
    with pytest.raises(ValueError, match="reference"):
        grpo_loss(new, batch, 0.2, kl_coef=0.1)


@pytest.mark.parametrize(
    ("text", "finish", "reward"),
    [
        ("Paris", "stop", 1.0),
        ("  'paris.'\n", "stop", 1.0),
        ("Lyon", "stop", 0.5),
        ("don't", "stop", 0.5),
        ("The answer is Paris.", "stop", 0.625),
        ("Paris", "length", 0.0),
        ("...", "stop", 0.0),
        (None, "stop", 0.0),
    ],
)
def test_one_word_reward_is_half_form_half_truth(text: str | None, finish: str, reward: float):
    assert one_word_reward(text, finish, frozenset({"paris"})) == reward
