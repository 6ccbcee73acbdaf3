"""``mismatch_metrics`` against hand computations on fixed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rollway.trainers.mismatch import mismatch_metrics

# Three measured tokens, d = trainer - behaviour = 0, 0.2, -0.05; the fourth is masked out,
# and would dominate every value (d = -2) if it were counted.
TRAINER = [-1.0, -2.0, -0.5, -3.0]
BEHAVIOUR = [-1.0, -2.2, -0.45, -1.0]
MASK = [1, 1, 1, 0]
DIFFS = [0.0, 0.2, -0.05]
EXPECTED = {
    "logprob_diff_mean": 0.25 / 3,
    "logprob_diff_max": 0.2,
    # exp(d) - 1 - d: 0, 1.22140275816017 - 1.2, 0.95122942450071 - 0.95.
    "k3_kl": (0.02140275816017 + 0.00122942450071) / 3,
    # exp(d): 1, 1.221 (outside [0.9, 1.1]), 0.951.
    "ratio_outside": 1 / 3,
    "tokens": 3,
}


def f64(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def assert_metrics(found: dict[str, float], expected: dict[str, float]) -> None:
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert type(found["tokens"]) is int


def test_masked_tokens_match_the_hand_computation() -> None:
    found = mismatch_metrics(f64(TRAINER), f64(BEHAVIOUR), torch.tensor(MASK))
    assert_metrics(found, EXPECTED)
    assert found["k3_kl"] == pytest.approx(sum(math.exp(d) - 1 - d for d in DIFFS) / 3, rel=1e-12)


def test_a_bool_or_float_mask_selects_the_same_tokens() -> None:
    for mask in (torch.tensor(MASK, dtype=torch.bool), torch.tensor(MASK, dtype=torch.float32)):
        assert_metrics(mismatch_metrics(f64(TRAINER), f64(BEHAVIOUR), mask), EXPECTED)


def test_two_dimensional_batches_are_measured_over_their_mask_one_tokens() -> None:
    # The same three tokens in a [2, 3] batch, right-padded; the padding holds junk logprobs.
    trainer = f64([[-1.0, -2.0, 7.0], [-0.5, -3.0, -9.0]])
    behaviour = f64([[-1.0, -2.2, 0.0], [-0.45, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert_metrics(mismatch_metrics(trainer, behaviour, mask), EXPECTED)


def test_ratio_outside_counts_ratios_beyond_0_9_and_1_1_on_either_side() -> None:
    ratios = [0.89, 0.91, 1.0, 1.09, 1.11, 2.0]  # outside: 0.89, 1.11, 2.0
    trainer = f64([math.log(r) for r in ratios])
    found = mismatch_metrics(trainer, torch.zeros(6, dtype=torch.float64), torch.ones(6))
    assert found["ratio_outside"] == pytest.approx(0.5)
    assert found["logprob_diff_max"] == pytest.approx(math.log(2.0))


def test_float32_inputs_keep_a_tiny_k3_that_float32_arithmetic_would_lose() -> None:
    # At d ~ 1e-6 (an on-policy recompute) k3 ~ d^2 / 2 = 5e-13, below float32's resolution.
    trainer = torch.tensor([1e-6, -1e-6], dtype=torch.float32)
    behaviour = torch.zeros(2, dtype=torch.float32)
    found = mismatch_metrics(trainer, behaviour, torch.ones(2))
    d = [float(v) for v in trainer]  # float32's nearest values to +-1e-6
    assert found["k3_kl"] == pytest.approx(
        sum(x * x / 2 + x**3 / 6 for x in d) / 2, rel=1e-6, abs=0
    )
    assert found["logprob_diff_mean"] == pytest.approx(abs(d[0]), rel=1e-6)


def test_no_mask_one_token_gives_zeros_not_nan() -> None:
    zeros = {
        "logprob_diff_mean": 0.0,
        "logprob_diff_max": 0.0,
        "k3_kl": 0.0,
        "ratio_outside": 0.0,
        "tokens": 0,
    }
    masked_out = mismatch_metrics(f64(TRAINER), f64(BEHAVIOUR), torch.zeros(4))
    empty = mismatch_metrics(f64([]), f64([]), torch.zeros(0, dtype=torch.bool))
    assert masked_out == empty == zeros


def test_logprobs_that_carry_gradients_are_accepted() -> None:
    trainer = f64(TRAINER).requires_grad_()
    assert_metrics(mismatch_metrics(trainer, f64(BEHAVIOUR), torch.tensor(MASK)), EXPECTED)


def test_tensors_of_different_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"shapes differ: trainer \(4,\), behaviour \(3,\)"):
        mismatch_metrics(f64(TRAINER), f64(BEHAVIOUR[:3]), torch.tensor(MASK))
