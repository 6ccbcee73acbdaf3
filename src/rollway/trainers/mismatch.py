"""Training-inference mismatch: how far a trainer's recomputed logprobs are from the recorded ones.

Any trainer that recomputes the logprobs of the sampled tokens (the ratio's numerator) can call
``mismatch_metrics`` on them and on the recorded (behaviour) logprobs, once a step, and log
what it returns. See docs/trainers.md, "Training-inference mismatch".
"""

from __future__ import annotations

import torch

#: Token ratios exp(trainer - behaviour) in this band count as matched (``ratio_outside``).
RATIO_BAND = (0.9, 1.1)


def mismatch_metrics(
    trainer_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The mismatch between ``trainer_logprobs`` and ``behaviour_logprobs`` over the tokens
    where ``mask`` is nonzero; three tensors of one shape, ``[N]`` or ``[B, L]`` (padding and
    prompt tokens masked out). Computed in float64, without gradients.

    With d = trainer - behaviour per token and r = exp(d):

    - ``logprob_diff_mean``, ``logprob_diff_max``: mean and max of |d|.
    - ``k3_kl``: the mean of k3 = r - 1 - log r, an unbiased, always non-negative estimate of
      KL(behaviour || trainer) per token, the tokens having been sampled from the behaviour
      policy (J. Schulman, "Approximating KL divergence", 2020,
      http://joschu.net/blog/kl-approx.html).
    - ``ratio_outside``: the share of tokens whose r is outside ``RATIO_BAND`` [0.9, 1.1].
    - ``tokens``: how many tokens were measured. With none, every value is 0.0.
    """
    if not trainer_logprobs.shape == behaviour_logprobs.shape == mask.shape:
        raise ValueError(
            f"shapes differ: trainer {tuple(trainer_logprobs.shape)}, behaviour "
            f"{tuple(behaviour_logprobs.shape)}, mask {tuple(mask.shape)}"
        )
    selected = mask.detach().bool()
    tokens = int(selected.sum())
    if tokens == 0:
        return {
            "logprob_diff_mean": 0.0,
            "logprob_diff_max": 0.0,
            "k3_kl": 0.0,
            "ratio_outside": 0.0,
            "tokens": 0,
        }
    trainer = trainer_logprobs.detach().to(torch.float64)[selected]
    diff = trainer - behaviour_logprobs.detach().to(torch.float64)[selected]
    ratio = diff.exp()
    low, high = RATIO_BAND
    return {
        "logprob_diff_mean": float(diff.abs().mean()),
        "logprob_diff_max": float(diff.abs().max()),
        # r - 1 - log r, with expm1 for r - 1: exact where d is ~1e-6 and k3 ~1e-12.
        "k3_kl": float((diff.expm1() - diff).mean()),
        "ratio_outside": float(((ratio < low) | (ratio > high)).double().mean()),
        "tokens": tokens,
    }


__all__ = ["RATIO_BAND", "mismatch_metrics"]
