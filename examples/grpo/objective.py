"""The GRPO objective, built only from what rollway recorded.

Each sample gives ``prompt_ids + response_ids`` (the exact ids the engine saw and sampled), a
loss mask (1 on sampled tokens, 0 on template glue and tool output), the engine's
logprob of each sampled token under the sampling temperature's distribution (the behaviour
policy, ``log_softmax(logits / T)``) and the weights version that sampled it. Nothing is
re-tokenized; only masked-in tokens are scored.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rollway.results import RolloutRecord
from rollway.trajectory import Sample


class RatioCheckError(RuntimeError):
    """The trainer's forward pass does not reproduce the recorded on-policy logprobs."""


@dataclass(frozen=True)
class TokenBatch:
    """A batch of samples, right-padded, and its trained tokens (mask 1) as flat ``[N]``
    vectors: token n is ``input_ids[rows[n], positions[n]]``, predicted at ``positions[n] - 1``.

    ``exact[n]``: every token of its turn (a maximal run of masked-in tokens) carries one
    version. A turn frozen across a ``keep`` update mixes versions, and its later tokens were
    computed over a KV cache of the old weights: no fresh forward pass reproduces them.
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    rows: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    behaviour_logprobs: torch.Tensor  # [N]
    versions: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    exact: torch.Tensor  # [N] bool

    @property
    def targets(self) -> torch.Tensor:
        return self.input_ids[self.rows, self.positions]

    def on_policy(self, version: int) -> torch.Tensor:
        """Tokens a forward pass of weights ``version`` must reproduce exactly."""
        return (self.versions == version) & self.exact


def group_advantages(records: Sequence[RolloutRecord]) -> dict[str, float]:
    """GRPO's advantage per rollout id: its reward minus its group's mean, over the group's
    standard deviation (0 for a group whose rewards are all equal)."""
    by_group: dict[str, list[RolloutRecord]] = defaultdict(list)
    for record in records:
        by_group[record.group_id].append(record)
    advantages: dict[str, float] = {}
    for group in by_group.values():
        rewards_G = [float(r.reward) for r in group if r.reward is not None]
        mean = statistics.fmean(rewards_G)
        std = statistics.pstdev(rewards_G)
        for record in group:
            advantages[record.rollout_id] = (record.reward - mean) / std if std > 0 else 0.0
    return advantages


def informative_groups(records: Sequence[RolloutRecord]) -> int:
    """The groups whose rewards differ: the only ones with an advantage, hence a gradient
    (dynamic sampling hands over no others; without it flat groups are trained on for nothing)."""
    rewards: dict[str, set[float]] = {}
    for record in records:
        if record.reward is not None:
            rewards.setdefault(record.group_id, set()).add(float(record.reward))
    return sum(len(found) > 1 for found in rewards.values())


def pack(samples: Sequence[tuple[Sample, float]], pad_id: int = 0) -> TokenBatch:
    """``(sample, advantage)`` pairs as one ``TokenBatch`` (padding is masked: any id does);
    every sample needs its versions."""
    width = max(len(s.prompt_ids) + len(s.response_ids) for s, _ in samples)
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
    rows: list[int] = []
    positions: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    advantages: list[float] = []
    exact: list[bool] = []
    for row, (sample, advantage) in enumerate(samples):
        if sample.policy_versions is None:
            raise ValueError("a sample without policy versions: the engine did not stamp them")
        ids = sample.prompt_ids + sample.response_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        start = len(sample.prompt_ids)
        for run in _sampled_runs(sample.loss_mask):
            run_versions = [sample.policy_versions[i] for i in run]
            for i in run:
                rows.append(row)
                positions.append(start + i)
                logprobs.append(sample.logprobs[i])
                versions.append(sample.policy_versions[i])
                advantages.append(advantage)
                exact.append(len(set(run_versions)) == 1)
    return TokenBatch(
        input_ids,
        attention_mask,
        torch.tensor(rows),
        torch.tensor(positions),
        torch.tensor(logprobs, dtype=torch.float32),
        torch.tensor(versions),
        torch.tensor(advantages, dtype=torch.float32),
        torch.tensor(exact, dtype=torch.bool),
    )


def _sampled_runs(mask: Sequence[int]) -> list[range]:
    """The maximal runs of 1s in ``mask``: one per turn the engine sampled."""
    runs: list[range] = []
    start = None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append(range(start, i))
            start = None
    return runs


def token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0
) -> torch.Tensor:
    """``[N]`` logprobs of the trained tokens under ``model`` at the sampling ``temperature``
    (``log_softmax(logits / T)``, fp32), the output layer applied only where a trained token is
    predicted. Differentiable."""
    hidden = model.get_decoder()(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask
    ).last_hidden_state
    logits = model.get_output_embeddings()(hidden[batch.rows, batch.positions - 1]).float()
    return (logits / temperature).log_softmax(-1).gather(-1, batch.targets[:, None]).squeeze(-1)


def max_ratio_deviation(new: torch.Tensor, old: torch.Tensor, where: torch.Tensor) -> float:
    """max |exp(new - old) - 1| over ``where`` (0 where no token is selected)."""
    if not bool(where.any()):
        return 0.0
    return float((new.detach()[where] - old[where]).exp().sub(1).abs().max())


def grpo_loss(
    new: torch.Tensor,
    batch: TokenBatch,
    clip_eps: float,
    kl_coef: float = 0.0,
    reference: torch.Tensor | None = None,
    decoupled_weight_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate, a mean over all trained tokens (each token weighs the same
    whatever its sequence's length), plus ``kl_coef`` x the k3 estimate of KL(new || ref).

    By default (PPO) the ratio is taken to the recorded (behaviour) logprobs and clipped at
    1 +- ``clip_eps``. With ``decoupled_weight_cap`` (decoupled PPO, as in AReaL) the clip is
    centred on the weights being updated instead (the trainer's, before this step: the ratio
    is 1 in value), and the recorded logprobs enter as a detached importance weight
    exp(current - recorded), capped. On-policy both are the plain policy gradient; on stale
    tokens PPO's clip zeroes the gradient wherever the last update already moved the policy
    past 1 +- eps in the advantage's direction, which the decoupled form does not."""
    centre = batch.behaviour_logprobs
    weight = torch.ones_like(new)
    if decoupled_weight_cap is not None:
        centre = new.detach()
        weight = (centre - batch.behaviour_logprobs).exp().clamp(max=decoupled_weight_cap)
    ratio = (new - centre).exp()
    unclipped = ratio * batch.advantages
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * batch.advantages
    loss = -(weight * torch.minimum(unclipped, clipped)).mean()
    stats = {"clip_frac": float((unclipped != clipped).float().mean())}
    if kl_coef > 0:
        if reference is None:
            raise ValueError("kl_coef > 0 needs the reference logprobs")
        log_ratio = reference - new
        kl = (log_ratio.exp() - log_ratio - 1).mean()
        loss = loss + kl_coef * kl
        stats["kl"] = kl.item()
    return loss, stats
