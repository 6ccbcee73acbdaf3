"""Choosing the next token of each batch row from its logits, with per-row sampling params."""

from __future__ import annotations

import math
import random

import torch

from rollway.errors import EngineError, InvalidFieldsError
from rollway.types import SamplingParams

#: A temperature or top_p below this samples like its limit: greedy, the top token. Dividing
#: fp32 logits by a smaller temperature overflows to inf, and a smaller top_p rounds to 0 in
#: fp32, leaving no token at all. (vLLM draws the same line: ``_SAMPLING_EPS = 1e-5``.)
SAMPLING_EPS = 1e-5


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A per-request generator, so a seeded request samples the same tokens in any batch."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else random.getrandbits(63))
    return generator


def check_sampling(sampling: SamplingParams) -> None:
    """Refuse what no sampler can honour (NaN, a negative temperature, top_p outside (0, 1])."""
    if not sampling.temperature >= 0.0 or math.isinf(sampling.temperature):
        raise InvalidFieldsError(f"temperature {sampling.temperature} is not >= 0", "temperature")
    if not 0.0 < sampling.top_p <= 1.0:
        raise InvalidFieldsError(f"top_p {sampling.top_p} is not in (0, 1]", "top_p")


def choose_token(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> int:
    """Sample one token id from a 1-D fp32 ``logits`` row under ``sampling``; raises
    ``EngineError`` when the row holds NaN (it would yield an arbitrary token)."""
    if bool(torch.isnan(logits).any()):
        raise EngineError("the model's logits hold NaN")
    if sampling.temperature < SAMPLING_EPS or sampling.top_p < SAMPLING_EPS:
        return int(torch.argmax(logits).item())
    scaled = logits / sampling.temperature
    if 0 < sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        scaled = _filter_top_p(scaled, sampling.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _filter_top_p(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(scaled, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Drop a token when the tokens before it already hold top_p of the mass; the first stays.
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop_sorted[0] = False
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))
